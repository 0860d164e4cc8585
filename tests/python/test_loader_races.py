# SPDX-License-Identifier: Apache-2.0
"""Issue 37, item 3: the Loader's races, each forced by a hook at the racy point, never a sleep.

- close() from a preemption handler while the Loader opens or reopens its stream;
- a second thread's iter() while the first waits for a batch;
- a pass let go early after restart_epoch_if_dataset_changed restarted its epoch;
and the LoaderState transitions (python/ringloader/_loader_state.py) one step at a time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

import ringloader as rl
from ringloader import _ringloader
from ringloader._loader_state import Cursor, LoaderState, Phase, Resumed
from conftest import TINY_COUNT, make_dataset

OPTS = dict(batch_size=8, image_size=32, seed=5, output="numpy")
BATCHES = -(-TINY_COUNT // 8)


def positions(batches):
    return [(b.position["epoch"], b.position["sequence"]) for b in batches]


# ---- 1. close() from a preemption handler while next() opens its stream ----

# The child's loader announces (on stdout) when it is inside its open; the test then sends
# SIGUSR1, whose handler saves state_dict() and closes, while the open still waits for a daemon
# that is not listening yet; only then does the test start that daemon.
PREEMPTED_WHILE_OPENING = """
import signal, sys
import ringloader as rl
from ringloader import _ringloader

endpoint, case = sys.argv[1], sys.argv[2]

class Announcing:
    '''The loader's client, saying when the loader is inside its (first) open.'''
    def __init__(self, client):
        self.client = client
        self.said = False
    def open(self, options):
        if not self.said:
            self.said = True
            print("opening", flush=True)
        return self.client.open(options)

loader = rl.Loader("tiny", endpoint=endpoint, batch_size=8, image_size=32, seed=5,
                   output="numpy", reconnect_deadline=120, timeout=60)
if case == "reopening":  # it had a stream; that daemon went away; the next call reopens
    assert loader.next_batch().position["sequence"] == 0
    loader.set_epoch(1)
    print("took", flush=True)
    assert sys.stdin.readline().strip() == "gone"
saved = []
def on_preempt(signum, frame):
    saved.append(loader.state_dict())
    loader.close()
    print("closed", flush=True)
signal.signal(signal.SIGUSR1, on_preempt)
loader._client = Announcing(_ringloader.Client(endpoint))
try:
    batch = loader.next_batch()
    print("returned", batch.position, "though the saved state counts it as not taken",
          saved, flush=True)
    sys.exit(3)
except rl.FailedPrecondition as e:
    assert "closed while next() opened" in str(e), e
assert saved == [loader.state_dict()], (saved, loader.state_dict())
again = loader.next_batch()  # opens anew: the batch the saved state resumes with
assert (again.position["epoch"], again.position["sequence"]) == \\
    (saved[0]["epoch"], saved[0]["sequence"]), (again.position, saved)
print("ok", flush=True)
"""


@pytest.mark.parametrize("case", ["opening", "reopening"])
def test_a_close_from_a_handler_while_next_opens_its_stream_is_not_lost(tiny_dataset, tmp_path,
                                                                         case):
    endpoint = f"unix:{tmp_path}/late.sock"

    def serve():
        return rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", listen=endpoint)

    first = serve() if case == "reopening" else None
    child = subprocess.Popen([sys.executable, "-c", PREEMPTED_WHILE_OPENING, endpoint, case],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        if first is not None:
            assert child.stdout.readline().strip() == "took"
            first.stop()
            child.stdin.write("gone\n")
            child.stdin.flush()
        assert child.stdout.readline().strip() == "opening"
        child.send_signal(signal.SIGUSR1)
        # The handler ran inside the open (nothing listens: it cannot have finished).
        assert child.stdout.readline().strip() == "closed"
        with serve():
            out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        if first is not None:
            first.stop()
    assert child.returncode == 0, (out, err)
    assert out.strip() == "ok"


# ---- 2. a second thread's iter() while the first waits ----

class GatedClient:
    """A loader's client whose streams hold the first next() until `go` is set, after setting
    `inside`: the loader is then inside that next(), holding the Loader."""

    def __init__(self, client):
        self.client = client
        self.inside = threading.Event()
        self.go = threading.Event()

    def open(self, options):
        return GatedStream(self.client.open(options), self)


class GatedStream:
    def __init__(self, stream, gate: GatedClient):
        self._stream = stream
        self._gate = gate

    def next(self, timeout=None):
        if not self._gate.inside.is_set():
            self._gate.inside.set()
            assert self._gate.go.wait(60), "the test never let the first next() go on"
        return self._stream.next(timeout)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def test_a_second_threads_iter_while_the_first_waits_is_refused_and_no_batch_repeats(daemon):
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, **OPTS)
    gate = GatedClient(_ringloader.Client(daemon.endpoint))
    loader._client = gate
    first, errors = [], []

    def train():  # the first thread: one whole epoch
        try:
            for batch in loader:
                first.append(batch)
        except rl.FailedPrecondition as e:
            errors.append(e)

    t = threading.Thread(target=train)
    t.start()
    refusal = None
    try:
        assert gate.inside.wait(60), "the first thread never waited for its first batch"
        try:
            second = iter(loader)  # the second thread, while the first waits
        except rl.FailedPrecondition as e:
            second, refusal = None, e
    finally:
        gate.go.set()
        t.join(120)
    assert not t.is_alive()
    taken = positions(first)
    if second is not None:  # accepted (the bug): it peeks at a batch and lets go of its pass
        taken.append(positions([next(second)])[0])
        del second
    taken += positions(list(loader))  # the next pass
    assert len(set(taken)) == len(taken), f"batches delivered twice: {taken}"
    assert not errors, errors
    assert taken == [(e, s) for e in range(2) for s in range(BATCHES)]
    assert refusal is not None and "one thread at a time" in str(refusal)


# ---- 3. a pass let go after its epoch was restarted on a changed dataset ----

@pytest.mark.parametrize("let_go", ["peek", "break"])
def test_a_pass_let_go_after_an_epoch_restart_runs_the_restarted_epoch_whole(tmp_path, let_go):
    root = make_dataset(tmp_path / "data", 40, 2)

    def serve():
        return rl.Daemon(datasets={"growing": root}, memory_limit="1GiB")

    with serve() as d:
        loader = rl.Loader("growing", endpoint=d.endpoint, **OPTS)
        it = iter(loader)
        next(it)
        next(it)
        state = loader.state_dict()  # inside epoch 0, after 2 batches
        del it
    folder = sorted(root.iterdir())[0]
    (folder / "zz-added.jpg").write_bytes(next(folder.iterdir()).read_bytes())
    with serve() as d:
        loader = rl.Loader("growing", endpoint=d.endpoint, restart_epoch_if_dataset_changed=True,
                           **OPTS)
        loader.load_state_dict(state)
        if let_go == "peek":
            assert next(iter(loader)).position["sequence"] == 0  # restarted
        else:
            for i, batch in enumerate(loader):
                if i == 2:
                    break
        epoch0 = list(loader)
    assert epoch0[0].position == {"epoch": 0, "sequence": 0, "cursor": 0}
    assert sorted(i for b in epoch0 for i in b["indices"].tolist()) == list(range(41))


# ---- the transitions, one step at a time (no daemon: stand-ins for the stream and batch) ----

def at(sequence, epoch=0):
    return {"epoch": epoch, "sequence": sequence, "cursor": sequence * 8}


class FakeStream:
    def __init__(self, position):
        self.position = position
        self.closed = False

    def close(self):
        self.closed = True


class FakeBatch:
    class _Native:
        def __init__(self, next_position):
            self.next = next_position

    def __init__(self, position, next_position):
        self.position = position
        self._native = FakeBatch._Native(next_position)
        self.released = False

    def release(self):
        self.released = True


def test_state_a_close_while_opening_refuses_the_opened_stream_and_keeps_the_cursor():
    s = LoaderState(Cursor(at(3), 7))
    s.enter("next_batch()")
    assert s.open_begin().position == at(3) and s.phase is Phase.OPENING
    s.close()  # from a handler, inside the open
    stream = FakeStream(at(3))
    with pytest.raises(rl.FailedPrecondition, match="closed while next\\(\\) opened"):
        s.opened(stream, Cursor(at(3), 7))
    assert stream.closed and s.stream is None and s.phase is Phase.HELD
    assert s.resume_cursor().position == at(3)
    s.leave()
    s.enter("next_batch()")  # the next call opens anew
    s.open_begin()
    s.opened(FakeStream(at(3)), Cursor(at(3), 7))
    assert s.wait_begin() is s.stream and s.phase is Phase.WAITING


def test_state_a_close_while_waiting_refuses_the_batch_and_one_after_it_does_not():
    s = LoaderState(Cursor(at(0), 7))
    s.enter("next()")
    s.open_begin()
    s.opened(FakeStream(at(0)), Cursor(at(0), 7))
    s.wait_begin()
    s.close()
    batch = FakeBatch(at(0), at(1))
    with pytest.raises(rl.FailedPrecondition, match="closed while next\\(\\) waited"):
        s.took(batch, None)
    assert batch.released and s.resume_cursor().position == at(0)
    s.leave()
    s.enter("next()")
    s.open_begin()
    s.opened(FakeStream(at(0)), Cursor(at(0), 7))
    s.wait_begin()
    assert s.took(FakeBatch(at(0), at(1)), None)
    s.close()  # after the batch was taken: it is delivered, the state counts it
    assert s.resume_cursor().position == at(1)
    s.leave()


def test_state_a_refused_enter_changes_nothing():
    s = LoaderState(Cursor(at(0), 7))
    s.enter("next()")
    p = s.current_pass
    with pytest.raises(rl.FailedPrecondition, match="one thread at a time"):
        s.enter("iter()")
    assert s.phase is Phase.HELD and s.current_pass is p
    s.leave()
    assert s.phase is Phase.IDLE


def test_state_a_pass_let_go_early_restores_its_whole_start_cursor():
    loaded = Cursor(at(2), 111, Resumed(at(2), {"done": 16}, 2, {"state": "loaded"}))
    s = LoaderState(loaded)
    s.enter("iter()")
    p = s.start_pass()
    s.leave()
    s.enter("next()")
    s.open_begin()
    # restart_epoch_if_dataset_changed: the daemon moved the stream to the epoch's start.
    restarted = Cursor(at(0), 222, Resumed(at(2), {"done": 0}, None, {"state": "loaded"}))
    s.opened(FakeStream(at(0)), restarted)
    s.wait_begin()
    assert s.took(FakeBatch(at(0), at(1)), p)
    p.taken += 1
    s.leave()
    s.let_go(p)  # break: marked only, by whichever thread drops the iterator
    assert s.resume_cursor() is loaded  # already, before any call settles it
    s.enter("iter()")
    assert s.cursor is loaded and s.current_pass is None
    s.leave()


def test_state_a_pass_that_ended_or_took_nothing_is_not_undone():
    s = LoaderState(Cursor(at(0), 7))
    s.enter("iter()")
    p = s.start_pass()
    s.let_go(p)  # took nothing
    s.leave()
    s.enter("iter()")
    assert s.cursor.position == at(0) and s.current_pass is None
    q = s.start_pass()
    s.open_begin()
    s.opened(FakeStream(at(0)), Cursor(at(0), 7))
    s.wait_begin()
    s.took(FakeBatch(at(0), at(0, epoch=1)), q)  # the epoch's last batch
    q.taken += 1
    s.let_go(q)
    s.leave()
    assert s.resume_cursor().position == at(0, epoch=1)


def test_state_a_transition_in_the_wrong_phase_is_a_bug():
    s = LoaderState(Cursor(at(0), 7))
    with pytest.raises(RuntimeError, match="ringloader bug: LoaderState.took in phase idle"):
        s.took(None, None)
