# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the Python package's tests: real datasets of real JPEGs, real daemons.

The tests import the *installed* ringloader (scripts/setup puts it where Debian's python3 finds
it) and run the installed ringloaderd, as a user would.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

import ringloader as rl

TINY_COUNT = 96
TINY_CLASSES = 4


def ctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([rl.find_binary("ringloaderctl"), *args], capture_output=True,
                          text=True, check=check, timeout=120)


def make_dataset(root: Path, count: int, classes: int, seed: int = 0) -> Path:
    ctl("make-dataset", "--out", str(root), "--count", str(count), "--classes", str(classes),
        "--seed", str(seed))
    return root


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("tiny"), TINY_COUNT, TINY_CLASSES)


@pytest.fixture(scope="module")
def daemon(tiny_dataset: Path):
    """A private daemon serving "tiny", shared by a test module."""
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", ring_slots=4) as d:
        yield d


@pytest.fixture()
def fresh_daemon(tiny_dataset: Path):
    """A daemon of the test's own (for tests that kill or break it)."""
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", ring_slots=4) as d:
        yield d


@pytest.fixture()
def hanging_daemon(tiny_dataset):
    """Every read blocks: a stream waits for its first batch for good."""
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB",
                   decode_deadline_ms=600000,
                   failpoints={"action": "hang", "crash_on_path": "*"}) as d:
        yield d


def worker_pid(daemon: rl.Daemon) -> int:
    """The pid of the daemon proper (the supervisor's child)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("the supervisor has no daemon child")


def digest(batch: rl.Batch) -> str:
    """What a batch holds: its indices, labels and image bytes."""
    h = hashlib.sha256()
    for key in ("indices", "labels", "images"):
        value = batch[key]
        array = value.numpy() if hasattr(value, "numpy") else value
        h.update(array.tobytes())
    return h.hexdigest()


def run_python(code: str, *args: str, env: Dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a new process of this interpreter (the installed package, no PYTHONPATH)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def indices_of(batches: List[rl.Batch]) -> List[List[int]]:
    return [[int(i) for i in b["indices"]] for b in batches]
