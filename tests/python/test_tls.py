# SPDX-License-Identifier: Apache-2.0
"""A PyTorch/numpy trainer reaching its daemon over TCP with mutual TLS (issue 40 item 2): the
installed package, a real daemon, certificates made with the openssl command."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Dict

import pytest

import ringloader as rl
from conftest import TINY_COUNT


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def issue(pki: Path, name: str, subject: str, sans: str, days: int) -> None:
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.csr"),
            "-subj", f"/CN={subject}", "-addext", f"subjectAltName={sans}")
    openssl("x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.pem"),
            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-out", str(pki / f"{name}.pem"),
            "-days", str(days), "-copy_extensions", "copy")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pki = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.pem"),
            "-subj", "/CN=ringloader test CA", "-days", "30")
    issue(pki, "daemon", "ringloaderd", "DNS:localhost,IP:127.0.0.1", 30)
    issue(pki, "trainer", "trainer-1", "DNS:trainer-1", 30)
    issue(pki, "expired", "trainer-2", "DNS:trainer-2", -1)
    return pki


def client_env(pki: Path, name: str) -> Dict[str, str]:
    return {"RINGLOADER_TLS_CA": str(pki / "ca.pem"),
            "RINGLOADER_TLS_CERT": str(pki / f"{name}.pem"),
            "RINGLOADER_TLS_KEY": str(pki / f"{name}.key")}


def test_a_trainer_with_a_certificate_reads_an_epoch_over_tls_and_an_expired_one_is_told_why(
        tiny_dataset, pki, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{s.getsockname()[1]}"
    for key, value in client_env(pki, "trainer").items():
        monkeypatch.setenv(key, value)
    tls = {"ca": str(pki / "ca.pem"), "cert": str(pki / "daemon.pem"),
           "key": str(pki / "daemon.key"), "allowed_clients": ["DNS:trainer-*"]}
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", listen=listen,
                   tls=tls) as d:
        loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                           output="numpy")
        seen = sum(len(batch["labels"]) for batch in loader)
        assert seen == TINY_COUNT
        assert 29 < d.stats()["tls"]["cert_days_left"] <= 30

        for key, value in client_env(pki, "expired").items():
            monkeypatch.setenv(key, value)
        with pytest.raises(rl.Error) as refused:
            next(iter(rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                                output="numpy")))
        assert "client certificate CN=trainer-2 has expired" in str(refused.value)
