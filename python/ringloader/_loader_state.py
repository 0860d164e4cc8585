# SPDX-License-Identifier: Apache-2.0
"""LoaderState: everything a Loader's correctness depends on, as one object of named states.

A Loader has three things that change: where it is (its :class:`Cursor`), what the one call
inside it is doing (its :class:`Phase`), and the ``iter()`` in progress (a :class:`Pass`).
Meanwhile another thread or a signal handler may only call ``close()`` (at any time), read
``state_dict()`` (:meth:`LoaderState.resume_cursor`) or drop an iterator (``let_go``); any other
call is refused at ``enter`` and changes nothing.

The call inside the Loader is always in one Phase. Every transition is one method: it checks the
phase it expects (a wrong one is a bug in ringloader: RuntimeError), changes it, and takes
effect by plain stores::

  from      transition                                      to
  IDLE      enter: another call inside is refused            HELD
  HELD      leave                                            IDLE
  HELD      open_begin (the old stream is closed)            OPENING
  OPENING   opened: refused if close() came since enter      HELD
  OPENING   open_failed                                      HELD
  HELD      wait_begin: refused if close() came since enter  WAITING
  WAITING   took: refused if close() came since enter        HELD
  WAITING   wait_failed                                      HELD
  any       close: drops the stream and the carried batch    (unchanged)

The rule that keeps ``close()`` from being lost: a batch is taken (the cursor moves past it)
only by ``took``, and ``opened`` and ``took`` refuse (FailedPrecondition, the cursor unchanged)
once any ``close()`` came after the call entered: a ``state_dict()`` saved with that close()
counted the batch as not taken, so it must not be delivered. Opening is as exposed as waiting:
the open retries an absent daemon for up to ``reconnect_deadline`` and runs Python's signal
handlers meanwhile (python/_ringloader.cc, ``Client.open``).

Atomicity: ``close()`` from a signal handler runs on the thread of the call it interrupts, so no
lock can keep it out. Each transition therefore computes everything first and then checks and
stores with no call in between: CPython (3.11 and later, which the extension is built for) runs
a signal handler, or switches threads, only at a call, a function's entry or a backward jump.
Readers (``resume_cursor``) see each store whole, since a Cursor is immutable.

A Pass is one ``iter()``; the current one is replaced only by a call that entered::

  from      transition                                      to
  (none)    start_pass (HELD: the current one is let go)    RUNNING, current
  RUNNING   let_go: its iterator was let go before its      LET_GO
            epoch's end (break, garbage, next(iter(loader)))
  RUNNING   end_pass: its epoch ended, or the loader raised  ENDED
  RUNNING   drop_pass (HELD: next_batch, set_epoch, ...)     ENDED, not current
  LET_GO,   settled by the next enter or start_pass:        not current
  ENDED       a LET_GO pass that took batches of an epoch
              not yet ended is undone (cursor = its start)

``let_go`` and ``end_pass`` only mark the pass, from whatever thread drops its iterator, without
entering the Loader (another call may be inside); :meth:`LoaderState.resume_cursor` answers as
if it were settled already. The undo restores the whole Cursor the pass started from: position,
dataset fingerprint and resume progress together (with ``restart_epoch_if_dataset_changed`` the
open may have moved the position to the epoch's start under a new fingerprint, and the old
position with the new fingerprint would skip the samples before it).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any, Dict, Optional

from .errors import FailedPrecondition


@dataclasses.dataclass(frozen=True)
class Resumed:
    """A loaded state's epoch: the progress the daemon continues it with (start_progress)."""

    start: Dict[str, int]       # where the loaded state resumes
    progress: Any               # the saved job's progress, then (once opened) the daemon's answer
    saved_world: Any            # the saved job's world until a stream applied it, then None
    state: Dict[str, Any]       # the loaded state_dict, returned while nothing was applied

    def as_dict(self) -> Dict[str, Any]:
        return {"start": dict(self.start), "progress": self.progress,
                "saved_world": self.saved_world, "state": dict(self.state)}

    @staticmethod
    def of(d: Optional[Dict[str, Any]]) -> Optional["Resumed"]:
        if d is None:
            return None
        return Resumed(dict(d["start"]), d["progress"], d["saved_world"], dict(d["state"]))


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Where the next batch comes from. Immutable: a change is a new Cursor, stored at once."""

    position: Dict[str, int]    # {"epoch", "sequence", "cursor"}; never changed in place
    fingerprint: int            # the dataset's, guarding a position inside an epoch (0: none)
    resumed: Optional[Resumed] = None

    @property
    def epoch(self) -> int:
        return self.position["epoch"]

    def at(self, position: Dict[str, int]) -> "Cursor":
        return dataclasses.replace(self, position=dict(position))


class Phase(enum.Enum):
    IDLE = "idle"          # no call is inside the Loader
    HELD = "held"          # one call is inside (others are refused); it waits for nothing
    OPENING = "opening"    # that call opens the stream (waits for the daemon)
    WAITING = "waiting"    # that call waits for the stream's next batch


class PassState(enum.Enum):
    RUNNING = "running"    # its iterator may take more batches
    LET_GO = "let go"      # its iterator was let go before its epoch's end: undone if it took any
    ENDED = "ended"        # its epoch ended, or the loader raised: the cursor stays


class Pass:
    """One ``iter()`` of a Loader: the cursor it started from, and how many batches it took."""

    __slots__ = ("start", "taken", "state")

    def __init__(self, start: Cursor) -> None:
        self.start = start
        self.taken = 0
        self.state = PassState.RUNNING

    @property
    def epoch(self) -> int:
        return self.start.epoch


class LoaderState:
    """The state of one Loader in one process (see the module's documentation).

    Thread-safety: ``enter``, ``close``, ``drop_stream``, ``let_go``, ``end_pass`` and
    ``resume_cursor`` from any thread or a signal handler; every other method only by the call
    that entered (phase != IDLE).
    """

    def __init__(self, cursor: Cursor) -> None:
        # Held by the thread whose call is inside the Loader (tests look at it too).
        self.busy = threading.Lock()
        self.phase = Phase.IDLE
        self.cursor = cursor
        self.stream: Any = None                 # the open stream, at `cursor` while HELD
        self.current_pass: Optional[Pass] = None
        # A batch of the next epoch that ended a pass (its epoch had no last_in_epoch batch):
        # the next pass starts with it. Its position is cursor.position.
        self.carried: Any = None
        self._closes = 0                        # close() calls so far
        self._closes_at_entry = 0               # ... when the call inside entered

    # ---- entering and leaving ----

    def enter(self, what: str) -> None:
        """IDLE -> HELD; settles a pass let go meanwhile. FailedPrecondition (nothing changed)
        while another call is inside, in another thread or under this one's signal handler."""
        if not self.busy.acquire(blocking=False):
            raise FailedPrecondition(
                f"a Loader is used by one thread at a time: {what} was called while another "
                "call on this Loader was running (in another thread, or in a signal handler "
                "that interrupted it); use one Loader per thread")
        try:
            self._expect("enter", Phase.IDLE)
        except BaseException:
            self.busy.release()
            raise
        self._closes_at_entry = self._closes
        self.phase = Phase.HELD
        self._settle_pass()

    def leave(self) -> None:
        """Any phase -> IDLE (the call inside returns or raises)."""
        self.phase = Phase.IDLE
        self.busy.release()

    # ---- passes ----

    def start_pass(self) -> Pass:
        """A new ``iter()``: the pass in progress ends (a RUNNING one is let go, as if by a newer
        iter()), and the new one starts at the cursor. REQUIRES: HELD."""
        self._expect("start_pass", Phase.HELD)
        self.let_go(self.current_pass)
        self._settle_pass()
        p = Pass(self.cursor)
        self.current_pass = p
        return p

    def drop_pass(self) -> None:
        """The pass in progress ends where it is (next_batch, set_epoch, load_state_dict): its
        iterator can no longer be used. REQUIRES: HELD."""
        self._expect("drop_pass", Phase.HELD)
        self.end_pass(self.current_pass)
        self._settle_pass()

    @staticmethod
    def let_go(p: Optional[Pass]) -> None:
        """RUNNING -> LET_GO: the pass's iterator was let go (any thread)."""
        if p is not None and p.state is PassState.RUNNING:
            p.state = PassState.LET_GO

    @staticmethod
    def end_pass(p: Optional[Pass]) -> None:
        """RUNNING -> ENDED: the pass stops where it is (any thread)."""
        if p is not None and p.state is PassState.RUNNING:
            p.state = PassState.ENDED

    def resume_cursor(self) -> Cursor:
        """Where the next call continues: the cursor, or the start of a pass let go early that
        no call has settled yet. From any thread or a signal handler."""
        p, cursor = self.current_pass, self.cursor
        if p is not None and self._undoes(p, cursor):
            return p.start
        return cursor

    def move_to(self, cursor: Cursor) -> None:
        """The next batch comes from `cursor` (set_epoch, load_state_dict); the carried batch
        is dropped, the stream follows at the next take. REQUIRES: HELD."""
        self._expect("move_to", Phase.HELD)
        self.carried = None
        self.cursor = cursor

    # ---- a take ----

    def take_carried(self) -> Any:
        """The carried batch if the cursor is at it (the cursor moves past it), else None.
        REQUIRES: HELD."""
        self._expect("take_carried", Phase.HELD)
        carried, self.carried = self.carried, None
        if carried is None or carried.position != self.cursor.position:
            return None
        after = self.cursor.at(carried._native.next)
        self.cursor = after
        return carried

    def needs_open(self) -> bool:
        """No stream, or one elsewhere than the cursor. REQUIRES: HELD."""
        stream = self.stream
        return stream is None or stream.position != self.cursor.position

    def open_begin(self) -> Cursor:
        """HELD -> OPENING; closes the old stream. Returns the cursor to open at."""
        self._expect("open_begin", Phase.HELD)
        self.phase = Phase.OPENING
        self._drop_stream()
        return self.cursor

    def opened(self, stream: Any, cursor: Cursor) -> None:
        """OPENING -> HELD with `stream`, now at `cursor` (restart_epoch_if_dataset_changed
        may have moved it). A close() since the call entered: the stream is closed and the
        call raises FailedPrecondition; the cursor is unchanged."""
        self._expect("opened", Phase.OPENING)
        self.phase = Phase.HELD
        if self._closes != self._closes_at_entry:
            stream.close()
            raise FailedPrecondition(
                "the Loader was closed while next() opened its stream (by another thread or a "
                "signal handler): nothing was taken, so state_dict() resumes with the batch it "
                "would have returned")
        # The stream first: a close() that could come between the two stores would close it.
        self.stream = stream
        self.cursor = cursor

    def open_failed(self) -> None:
        """OPENING -> HELD (the open raised)."""
        self._expect("open_failed", Phase.OPENING)
        self.phase = Phase.HELD

    def wait_begin(self) -> Any:
        """HELD -> WAITING; the stream to wait on. FailedPrecondition (staying HELD) after a
        close() since the call entered."""
        self._expect("wait_begin", Phase.HELD)
        stream = self.stream
        if self._closes != self._closes_at_entry or stream is None:
            raise FailedPrecondition(
                "the Loader was closed while next() waited for a batch (by another thread or "
                "a signal handler): nothing was taken, so state_dict() resumes with it")
        self.phase = Phase.WAITING
        return stream

    def took(self, batch: Any, p: Optional[Pass]) -> bool:
        """WAITING -> HELD with `batch` (a Batch, or None at the stream's end). True: the cursor
        is past it. False: `batch` is None, or belongs to the epoch after pass `p`'s and is
        carried to the next pass (the cursor at it). A close() since the call entered: the batch
        is released and FailedPrecondition raised, the cursor unchanged."""
        self._expect("took", Phase.WAITING)
        self.phase = Phase.HELD
        if batch is None:
            return False
        at = batch.position
        carry = p is not None and at["epoch"] != p.epoch
        after = self.cursor.at(at if carry else batch._native.next)
        # From here to the stores, no call: a close() is wholly before the check or after them.
        if self._closes != self._closes_at_entry:
            batch.release()
            raise FailedPrecondition(
                "the Loader was closed while next() waited for a batch (by another thread or "
                "a signal handler): nothing was taken, so state_dict() resumes with it")
        if carry:
            self.carried = batch
        self.cursor = after
        return not carry

    def wait_failed(self, drop_stream: bool = False) -> None:
        """WAITING -> HELD (the wait raised); with `drop_stream` (Ctrl-C) the daemon frees the
        stream at once."""
        self._expect("wait_failed", Phase.WAITING)
        self.phase = Phase.HELD
        if drop_stream:
            self._drop_stream()

    # ---- from anywhere ----

    def close(self) -> None:
        """Drops the stream (closed on the daemon) and the carried batch; a call inside that is
        opening or waiting raises FailedPrecondition instead of taking a batch. Any thread, any
        phase, signal handlers too."""
        self._closes += 1
        self.carried = None
        self._drop_stream()

    def drop_stream(self) -> None:
        """Closes the stream without refusing the call inside (``__del__``)."""
        self._drop_stream()

    # ---- inside ----

    def _drop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()

    @staticmethod
    def _undoes(p: Pass, cursor: Cursor) -> bool:
        """A let-go pass that took batches of an epoch not yet ended is undone."""
        return p.state is PassState.LET_GO and p.taken > 0 and cursor.epoch == p.epoch

    def _settle_pass(self) -> None:
        """The current pass, if let go or ended, stops being current (undone if let go early)."""
        p = self.current_pass
        if p is None or p.state is PassState.RUNNING:
            return
        if self._undoes(p, self.cursor):
            self.carried = None
            self.cursor = p.start  # before clearing the pass: resume_cursor() stays right
        self.current_pass = None

    def _expect(self, transition: str, *allowed: Phase) -> None:
        if self.phase not in allowed:
            raise RuntimeError(
                f"ringloader bug: LoaderState.{transition} in phase {self.phase.value} "
                f"(expected {' or '.join(a.value for a in allowed)}); please report it")
