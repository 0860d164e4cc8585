# SPDX-License-Identifier: Apache-2.0
"""rl.Daemon: a private daemon that never outlives its notebook and survives its decoder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict

import numpy as np
import pytest

import ringloader as rl
from conftest import TINY_COUNT, make_dataset


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (its parent was this test's child, now dead too).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_the_daemon_stops_when_its_python_process_ends(tiny_dataset, how):
    code = f"""
import os, signal, sys, time
import ringloader as rl
d = rl.Daemon(datasets={{"tiny": {str(tiny_dataset)!r}}})
print(d.pid, os.path.dirname(d.config_path), flush=True)
if {how!r} == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
"""  # "exit": the interpreter ends normally without stopping it
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid_text, workdir = child.stdout.readline().split()
    pid = int(pid_text)
    child.wait(timeout=60)
    deadline = time.monotonic() + 20
    while alive(pid):
        assert time.monotonic() < deadline, f"ringloaderd {pid} outlived its Python process"
        time.sleep(0.05)
    # A SIGKILLed process cannot remove the daemon's directory (its log is there to read).
    shutil.rmtree(workdir, ignore_errors=True)


def test_an_out_of_memory_decoder_leaves_the_loop_going(tiny_dataset):
    # The notebook runs under an address-space limit its daemon inherits, so the failpoint's
    # allocations fail inside the daemon (as an OOM kill would end it) instead of filling the host.
    victim = sorted(p.relative_to(tiny_dataset) for p in tiny_dataset.rglob("*.jpg"))[5]
    code = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import ringloader as rl
with rl.Daemon(datasets={{"tiny": {str(tiny_dataset)!r}}},
               failpoints={{"action": "oom", "crash_on_path": {str(victim)!r}}}) as d:
    loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32, output="numpy")
    seen = [i for b in loader for i in b["indices"].tolist()]
    print(len(seen), len(set(seen)), "allocating until out of memory" in d.log())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(TINY_COUNT - 1), str(TINY_COUNT - 1), "True"]


def test_a_bad_dataset_path_fails_the_start_with_the_daemons_words(tmp_path):
    with pytest.raises(rl.Error, match="nowhere"):
        rl.Daemon(datasets={"x": tmp_path / "nowhere"}, startup_timeout=30)


def test_server_keys_reach_the_config_and_bad_ones_are_refused(tiny_dataset):
    with rl.Daemon(datasets={"tiny": tiny_dataset}, ring_slots=3, log_level="debug") as d:
        with open(d.config_path) as f:
            config = f.read()
        assert "ring_slots = 3" in config and 'log_level = "debug"' in config
    with pytest.raises(rl.Error, match="no_such_key"):
        rl.Daemon(datasets={"tiny": tiny_dataset}, no_such_key=1, startup_timeout=30)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(address: str) -> Dict[str, float]:
    """GET /metrics with a real HTTP client; series name (with labels) -> value."""
    import urllib.request
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


def test_a_notebook_daemon_serves_prometheus_metrics_that_follow_the_loader(tiny_dataset):
    address = f"127.0.0.1:{free_port()}"
    with rl.Daemon(datasets={"tiny": tiny_dataset}, metrics_listen=address) as d:
        before = scrape(address)
        assert before["ringloader_batches_served_total"] == 0
        assert before['ringloader_decode_errors_total{reason="corrupt"}'] == 0
        loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                           output="numpy")
        batches = sum(1 for _ in loader)
        after = scrape(address)
        assert after["ringloader_batches_served_total"] == batches == len(loader)
        # The ring decodes ahead into the next epoch while the loader finishes this one.
        assert after["ringloader_images_decoded_total"] >= TINY_COUNT
        assert after["ringloader_decode_duration_seconds_count"] >= TINY_COUNT


def test_a_stuck_decoder_is_killed_by_the_watchdog_and_the_loop_goes_on(tiny_dataset):
    # The decode of one sample blocks for good after its read (no deadline reaches it): the
    # supervisor's watchdog kills the daemon, and after the second hang the sample is quarantined.
    victim = sorted(p.relative_to(tiny_dataset) for p in tiny_dataset.rglob("*.jpg"))[5]
    with rl.Daemon(datasets={"tiny": tiny_dataset}, decode_deadline_ms=400, watchdog_ms=1500,
                   failpoints={"action": "hang_decode", "crash_on_path": str(victim)}) as d:
        loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                           output="numpy")
        seen = [i for b in loader for i in b["indices"].tolist()]
        assert len(seen) == len(set(seen)) == TINY_COUNT - 1
        assert d.log().count("sent no progress ping") == 2


def test_a_cached_validation_set_gives_the_same_batches_every_epoch_from_memory(tiny_dataset):
    with rl.Daemon(datasets={"val": {"path": str(tiny_dataset), "cache": "memory"}}) as d:
        loader = rl.Loader("val", endpoint=d.endpoint, batch_size=16, image_size=32,
                           augment="eval", shuffle=False, output="numpy")
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs.append(np.concatenate([np.array(b["images"]) for b in loader]))
        cache = d.stats()["cache"]
    assert np.array_equal(epochs[0], epochs[1])
    assert cache["entries"] == cache["misses"] == TINY_COUNT  # epoch 0 decoded each sample once
    assert cache["hits"] >= TINY_COUNT  # epoch 1 (and what the ring read ahead) came from memory
    assert 0 < cache["bytes"] <= cache["cap_bytes"] and cache["full"] is False


def test_a_notebook_reads_the_daemons_counters_as_a_dict(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(make_dataset(tmp_path / "src", 24, 2), data)
    bad = sorted(data.rglob("*.jpg"))[3]
    bad.write_bytes(bad.read_bytes()[:200])  # cut short: a decode error, the rest goes on
    with rl.Daemon(datasets={"small": data}) as d:
        before = rl.daemon_stats(d.endpoint)
        assert before["batches_served"] == before["images_decoded"] == 0
        assert before["decode_errors_by_reason"] == {} and before["daemon_restarts"] == 0
        loader = rl.Loader("small", endpoint=d.endpoint, batch_size=4, image_size=32,
                           output="numpy", drop_last=True)
        served = sum(1 for _ in loader)
        after = d.stats()
        loader.close()
    assert after["batches_served"] >= served == 23 // 4
    # Every served sample was decoded; the dropped tail and the next epoch's read-ahead may or
    # may not be yet (the 5th batch can be marked last before the tail is filled).
    assert after["images_decoded"] >= 4 * served
    assert after["decode_errors_by_reason"] == {"truncated": 1}
    [recent] = after["recent_bad_files"]
    assert (recent["dataset"], recent["path"], recent["reason"]) == (
        "small", str(bad.relative_to(data)), "truncated")
    assert after["damaged_files"] == []  # index damage of shard files: none in a folder
    assert [ds["name"] for ds in after["datasets"]] == ["small"]
    assert after["memory_limit_bytes"] > 0 and isinstance(after["incarnation"], int)
    with pytest.raises(rl.Unavailable, match="no daemon answers at unix:/nonexistent"):
        rl.daemon_stats("unix:/nonexistent/rl.sock", timeout=1)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_daemon_asked_to_listen_where_another_serves_raises_naming_it(tiny_dataset, tmp_path,
                                                                         transport):
    import socket
    if transport == "unix":
        listen = f"unix:{tmp_path / 'shared.sock'}"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            listen = f"127.0.0.1:{s.getsockname()[1]}"
    # A TCP listen without [tls] must say the network is trusted.
    insecure = {"insecure_tcp": True} if transport == "tcp" else {}
    with rl.Daemon(datasets={"tiny": tiny_dataset}, listen=listen, **insecure) as first:
        first_pid = first.stats()["pid"]
        with pytest.raises(rl.Error) as refused:
            rl.Daemon(datasets={"tiny": tiny_dataset}, listen=listen, **insecure)
        assert f"listen={listen!r}: another ringloaderd already serves there (pid {first_pid})" \
            in str(refused.value)
        # The first one is untouched and still the one serving.
        assert rl.health(listen) == "SERVING"
        assert first.stats()["pid"] == first_pid
