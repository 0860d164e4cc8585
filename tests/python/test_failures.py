# SPDX-License-Identifier: Apache-2.0
"""What trainers fear: a daemon killed mid-epoch, Ctrl-C, fork, and every error class."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ringloader as rl
from conftest import TINY_COUNT, ctl, digest, make_dataset, worker_pid

OPTS = dict(batch_size=8, image_size=32, seed=3, output="numpy")


def test_sigkill_of_the_daemon_mid_epoch_is_invisible(fresh_daemon):
    undisturbed = [digest(b) for b in rl.Loader("tiny", endpoint=fresh_daemon.endpoint, **OPTS)]
    loader = rl.Loader("tiny", endpoint=fresh_daemon.endpoint, **OPTS)
    got = []
    for i, batch in enumerate(loader):
        got.append(digest(batch))
        if i == 4:
            os.kill(worker_pid(fresh_daemon), signal.SIGKILL)
    assert got == undisturbed
    assert loader.stats["reconnects"] >= 1


def test_a_daemon_gone_past_the_reconnect_deadline_raises_unavailable(tmp_path):
    loader = rl.Loader("tiny", endpoint=f"unix:{tmp_path}/nobody.sock", reconnect_deadline=0.5,
                       **OPTS)
    started = time.monotonic()
    with pytest.raises(rl.Unavailable, match="nobody.sock"):
        next(iter(loader))
    assert time.monotonic() - started < 30


def wait_for_open_streams(daemon: rl.Daemon, count: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        stats = ctl("--endpoint", daemon.endpoint, "stats").stdout
        if re.search(rf"^streams open +{count}$", stats, re.M):
            return
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def test_timeout_raises_deadline_exceeded_and_the_loader_goes_on(hanging_daemon):
    loader = rl.Loader("tiny", endpoint=hanging_daemon.endpoint, timeout=0.5, **OPTS)
    with pytest.raises(rl.DeadlineExceeded, match="no batch within"):
        next(iter(loader))
    with pytest.raises(TimeoutError):  # also a builtin TimeoutError
        loader.next_batch(timeout=0.3)


def test_ctrl_c_interrupts_a_wait_at_once_and_closes_the_stream(hanging_daemon):
    code = """
import signal, sys
import ringloader as rl
loader = rl.Loader("tiny", endpoint=sys.argv[1], batch_size=8, image_size=32, output="numpy")
signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
print("waiting", flush=True)
try:
    next(iter(loader))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(7)
"""
    child = subprocess.Popen([sys.executable, "-c", code, hanging_daemon.endpoint],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "waiting"
    wait_for_open_streams(hanging_daemon, 1)  # the child is inside next(), waiting
    time.sleep(0.5)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    waited = time.monotonic() - sent
    assert child.returncode == 7, err
    assert "interrupted" in out
    print(f"KeyboardInterrupt after {waited:.2f} s")
    # The daemon closed the stream (the loader closes it, and the session ended with the child).
    wait_for_open_streams(hanging_daemon, 0)


def test_a_forked_child_gets_a_clear_error_and_the_parent_goes_on(daemon):
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, **OPTS)
    it = iter(loader)
    next(it)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must fail fast and clearly, never hang in gRPC
        os.close(read)
        try:
            next(iter(loader))
            message = "no error"
        except rl.FailedPrecondition as e:
            message = "FailedPrecondition: " + str(e)
        except BaseException as e:  # noqa: BLE001
            message = f"{type(e).__name__}: {e}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    message = os.read(read, 4096).decode()
    os.close(read)
    assert status == 0
    assert message.startswith("FailedPrecondition") and "fork()" in message, message
    assert len(list(it)) == len(loader) - 1  # the parent's epoch goes on


def test_every_error_class(daemon, tmp_path, tiny_dataset):
    for cls in (rl.Unavailable, rl.NotFound, rl.InvalidArgument, rl.ResourceExhausted,
                rl.DataLoss, rl.FailedPrecondition, rl.Internal, rl.DeadlineExceeded):
        assert issubclass(cls, rl.Error)
        # The C++ client's code names (ErrorCodeName) map to these classes.
        assert rl.errors.error_class(cls.code) is cls
    with pytest.raises(rl.NotFound, match="no-such-dataset"):
        next(iter(rl.Loader("no-such-dataset", endpoint=daemon.endpoint, **OPTS)))
    with pytest.raises(rl.InvalidArgument, match="batch_size"):
        rl.Loader("tiny", endpoint=daemon.endpoint, **{**OPTS, "batch_size": 0})
    with pytest.raises(rl.InvalidArgument, match="rank"):
        rl.Loader("tiny", endpoint=daemon.endpoint, rank=2, world_size=2, **OPTS)
    with pytest.raises(rl.InvalidArgument, match="layout"):
        rl.Loader("tiny", endpoint=daemon.endpoint, layout="HWC", **OPTS)
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        rl.Loader("tiny", endpoint=daemon.endpoint, output="jax")
    with pytest.raises(rl.ResourceExhausted, match="memory_limit"):
        next(iter(rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=512, image_size=1024,
                            output="numpy")))
    # DataLoss: a corrupt file in a dataset whose on_error is "fail".
    broken = make_dataset(tmp_path / "broken", 16, 2)
    victim = sorted(broken.rglob("*.jpg"))[3]
    victim.write_bytes(victim.read_bytes()[:200])
    with rl.Daemon(datasets={"strict": {"path": str(broken), "on_error": "fail"}}) as strict:
        with pytest.raises(rl.DataLoss, match=victim.name):
            for _ in rl.Loader("strict", endpoint=strict.endpoint, batch_size=4, image_size=32,
                               output="numpy"):
                pass


def test_a_decoder_crash_in_a_private_daemon_leaves_the_loop_going(tiny_dataset):
    victim = sorted(p.relative_to(tiny_dataset) for p in tiny_dataset.rglob("*.jpg"))[10]
    with rl.Daemon(datasets={"tiny": tiny_dataset},
                   failpoints={"action": "segfault", "crash_on_path": str(victim)}) as d:
        loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                           output="numpy", shuffle=False)
        seen = [i for b in loader for i in b["indices"].tolist()]
        paths = [p for b in rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                                      output="numpy", shuffle=False) for p in b.paths]
        log = d.log()
    assert str(victim) not in paths  # quarantined after its crashes
    assert len(seen) == TINY_COUNT - 1 and len(set(seen)) == len(seen)
    assert "segfault" in log


@pytest.fixture()
def daemon_gone(fresh_daemon):
    """A daemon that dies and stays dead (its supervisor is stopped) until the test ends."""
    def kill():
        os.kill(fresh_daemon.pid, signal.SIGSTOP)  # no restart while stopped
        os.kill(worker_pid(fresh_daemon), signal.SIGKILL)
    yield fresh_daemon, kill
    os.kill(fresh_daemon.pid, signal.SIGCONT)


def test_ctrl_c_is_answered_at_once_while_reconnecting_to_a_dead_daemon(daemon_gone):
    daemon, kill = daemon_gone
    code = """
import signal, sys, time
import ringloader as rl
loader = rl.Loader("tiny", endpoint=sys.argv[1], batch_size=8, image_size=32, output="numpy")
it = iter(loader)
next(it)
print("reading", flush=True)
sys.stdin.readline()  # the daemon is killed meanwhile
signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
print("waiting", flush=True)
try:
    for _ in it:
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(7)
"""
    child = subprocess.Popen([sys.executable, "-c", code, daemon.endpoint], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "reading"
    kill()
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "waiting"
    time.sleep(1.5)  # inside next(): the next batches are not in the ring, it is reconnecting
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 7, err
    assert time.monotonic() - sent < 5  # the reconnect_deadline is 60 s
    print(f"KeyboardInterrupt {time.monotonic() - sent:.2f} s after SIGINT, daemon down")


def test_a_daemon_that_stays_dead_raises_unavailable_after_the_reconnect_deadline(daemon_gone):
    daemon, kill = daemon_gone
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, reconnect_deadline=2.0, **OPTS)
    it = iter(loader)
    next(it)
    kill()
    started = time.monotonic()
    with pytest.raises(rl.Unavailable, match="reconnect_deadline"):
        for _ in it:
            pass
    assert time.monotonic() - started < 15
    # The trainer may catch it and go on once the daemon is back: exactly the next batch.
    os.kill(daemon.pid, signal.SIGCONT)  # the supervisor restarts the daemon
    assert loader.next_batch(timeout=30).position == {"epoch": 0, "sequence": 1, "cursor": 8}
