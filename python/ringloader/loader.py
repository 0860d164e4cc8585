# SPDX-License-Identifier: Apache-2.0
"""The Loader: batches from a ringloader daemon, read in place from its shared-memory ring."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional

try:  # every batch is numpy arrays; imported here too so that type hints resolve
    import numpy
except ImportError:  # the Loader says what to install
    numpy = None  # type: ignore[assignment]

from . import _ringloader
from ._loader_state import Cursor, LoaderState, Pass, Resumed
from .errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

_STATE_FORMAT = "ringloader.Loader/1"
_PICKLE_FORMAT = "ringloader.Loader.pickle/2"
_MAX_EPOCH = 2**32  # as the state format's bound (client/state.cc)


class ResumeWarning(UserWarning):
    """A loaded state may not resume exactly: one rank's state of a job whose ranks skipped bad
    samples, loaded at another world size (see :func:`combine_states`)."""


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"${name} must be an integer, got {value!r}") from None


class Batch(Mapping[str, Any]):
    """One batch: a read-only Mapping of every tensor by name, plus ``batch.paths``.

    ``batch["images"]`` (absent for an ``arrays`` dataset), ``batch["labels"]`` (-1 where the
    dataset has none), ``batch["indices"]``, then the dataset's extra tensors: ``batch["depth"]``
    for WebDataset ``KEY.depth.npy`` members, ``batch["NAME"]`` for each ``NAME.npy`` of an
    ``arrays`` dataset, ``batch["NAME_lengths"]`` for ragged ones. Each is ``[size, ...]``.

    The arrays (numpy) or tensors (torch) view the ring slot itself: nothing is copied. The slot
    goes back to the daemon when the Batch and every array or tensor taken from it are garbage,
    or at :meth:`release`. Arrays that outlive ``release()`` stay valid: the batch is copied out
    of the ring first. numpy arrays are read-only; torch tensors are writable, and a write stays
    in this process (copy-on-write pages, dropped when the slot is released). A dtype torch does
    not have (uint16, uint32, uint64) stays a numpy array.
    """

    __slots__ = ("_native", "_tensors", "_output", "_paths", "_names")

    def __init__(self, native: Any, output: str) -> None:
        self._native = native
        self._output = output
        self._paths: Optional[List[str]] = None
        self._tensors: Optional[Dict[str, Any]] = None
        self._names: List[str] = list(native.names)

    def _views(self) -> Dict[str, Any]:
        if self._tensors is None:
            if self._native.released:
                raise FailedPrecondition("the batch was released")
            arrays = {name: self._native.array(name) for name in self._names}
            if self._output == "torch":
                import torch
                for name, a in arrays.items():
                    try:
                        arrays[name] = torch.from_numpy(a)
                    except TypeError:  # a dtype torch lacks: keep the numpy array
                        pass
            self._tensors = arrays
        return self._tensors

    def __getitem__(self, key: str) -> Any:
        if key not in self._names:
            raise KeyError(f"{key!r}: this batch has {', '.join(map(repr, self._names))}")
        return self._views()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, key: object) -> bool:
        return key in self._names

    @property
    def paths(self) -> List[str]:
        """Each sample's path relative to the dataset root, in batch order."""
        if self._paths is None:
            self._paths = self._native.paths()
        return self._paths

    @property
    def size(self) -> int:
        """Samples in this batch (the last batch of an epoch may be smaller)."""
        return self._native.size

    @property
    def position(self) -> Dict[str, int]:
        """Where this batch is: ``{"epoch", "sequence", "cursor"}``."""
        return self._native.position

    @property
    def last_in_epoch(self) -> bool:
        """True for the last batch of its epoch."""
        return self._native.last_in_epoch

    def release(self) -> None:
        """Gives the slot back now (arrays and tensors still alive keep their bytes)."""
        self._tensors = None
        self._native.release()

    def __repr__(self) -> str:
        p = self._native.position
        return (f"<ringloader.Batch epoch={p['epoch']} sequence={p['sequence']} "
                f"size={self._native.size}>")


def _epoch_arg(name: str, value: Any) -> int:
    """An epoch argument as an int in [0, 2**32), or InvalidArgument naming ``name``."""
    if not isinstance(value, bool):
        try:
            number = value.__index__()
        except (AttributeError, TypeError):
            number = None
        if number is not None and 0 <= number < _MAX_EPOCH:
            return number
    raise InvalidArgument(f"{name}: must be an int in [0, {_MAX_EPOCH}), got {value!r}")


class Loader:
    """Batches of one dataset from a ringloader daemon, one epoch per ``iter()``.

    >>> loader = Loader("imagenet-train", batch_size=256)
    >>> for epoch in range(epochs):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         images, labels = batch["images"], batch["labels"]

    Iteration follows a DataLoader's rule: every ``for batch in loader`` is a whole epoch. Without
    :meth:`set_epoch` the epochs follow one another (0, 1, 2, ..., each shuffled anew); an
    ``iter()`` the trainer lets go of before its epoch's end (``break``, an exception in the
    loop's body, ``next(iter(loader))`` to look at a batch, a newer ``iter()``) is undone, so the
    next ``iter()`` runs that same pass again from where it started: a peek before the training
    loop changes nothing the loop sees. An error raised by the loader itself (``Unavailable``,
    ``DeadlineExceeded``, Ctrl-C while it waits) leaves it at the batch it did not deliver: the
    next ``iter()`` or :meth:`next_batch` continues there.

    Sample order and every sample's bytes are a pure function of (dataset, seed, epoch, rank,
    position). :meth:`state_dict` taken anywhere resumes exactly as this loader would go on:
    taken inside the loop after a batch, :meth:`load_state_dict` (in any process) continues with
    the next batch; taken after the loop ended by ``break``, with the pass the next ``iter()``
    would run. The first ``iter()`` after :meth:`load_state_dict` continues where the state was
    taken (also after ``set_epoch`` of the loaded epoch). A daemon that dies and comes back is
    invisible; one that stays away past ``reconnect_deadline`` seconds raises
    :class:`ringloader.Unavailable`.

    A Loader is used by one thread at a time (a second thread's call, ``iter()`` too, raises
    :class:`ringloader.FailedPrecondition` and changes nothing); :meth:`close` may come from any
    thread or a signal handler, and a ``next()`` waiting meanwhile (for a batch, or for the
    daemon while it opens its stream) raises ``FailedPrecondition`` without taking a batch. The
    state behind these promises is one object with named phases (``_loader_state.py``). A
    Loader pickles (options and position): the copy connects again where it is
    unpickled and continues from the same position.

    Args:
        dataset: a ``[[datasets]]`` name of the daemon's config.
        batch_size, image_size: samples per batch; output side in pixels.
        augment: ``"train"`` (random resized crop + flip) or ``"eval"`` (resize + centre crop).
        seed, shuffle, drop_last: the sample order, and whether a short last batch is dropped.
        rank, world_size: this process's shard; None reads ``RANK`` / ``WORLD_SIZE`` (torchrun),
            else 0 / 1.
        dtype: ``"uint8"`` or ``"float32"`` (normalised with ``mean`` / ``std``, ImageNet's by
            default).
        layout: ``"NHWC"`` or ``"NCHW"``.
        output: ``"torch"`` (writable tensors) or ``"numpy"`` (read-only arrays).
        endpoint: the daemon; None reads ``$RINGLOADER_ENDPOINT``, else the system socket.
        timeout: seconds to wait for any one batch before :class:`ringloader.DeadlineExceeded`
            (None: no limit; the loader stays usable after it).
        reconnect_deadline: seconds to keep reconnecting to a dead daemon.
        resize: ``"fast"`` (DCT-scaled decode) or ``"exact"`` (full decode, PIL-exact resize).
        ring_slots: batches the daemon prepares ahead (0: its ``ring_slots``, by default 4, or
            3 when one batch is over 8 MiB).
        progress: show a tqdm progress bar per epoch.
        client_name: shown in ``ringloaderctl stats``.
        verify_checksums: check every batch's checksum (one pass over its bytes).
        restart_epoch_if_dataset_changed: when a loaded state's dataset has changed since (files
            added, removed, renamed), start the state's epoch again from its first batch with
            the new sample list instead of raising :class:`ringloader.FailedPrecondition`.
    """

    def __init__(self, dataset: str, *, batch_size: int = 256, image_size: int = 224,
                 augment: str = "train", seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, rank: Optional[int] = None,
                 world_size: Optional[int] = None, dtype: str = "uint8", layout: str = "NHWC",
                 output: str = "torch", endpoint: Optional[str] = None,
                 timeout: Optional[float] = None, reconnect_deadline: float = 60.0,
                 resize: str = "fast", mean: Optional[List[float]] = None,
                 std: Optional[List[float]] = None, ring_slots: int = 0,
                 progress: bool = False, client_name: Optional[str] = None,
                 verify_checksums: bool = False,
                 restart_epoch_if_dataset_changed: bool = False) -> None:
        if output not in ("torch", "numpy"):
            raise InvalidArgument(f"output: must be 'torch' or 'numpy', got {output!r}")
        if numpy is None:
            raise InvalidArgument(
                f"ringloader needs numpy, which this python ({sys.executable}) cannot import: "
                "use Debian's /usr/bin/python3 (apt install python3-numpy)")
        if output == "torch":
            try:
                import torch  # noqa: F401
            except ImportError as e:
                raise InvalidArgument(
                    f"output='torch' needs PyTorch, which this python cannot import ({e}); "
                    "install it (Debian: apt install python3-torch) or use output='numpy'"
                ) from None
        if timeout is not None and not timeout > 0:
            raise InvalidArgument(f"timeout: must be > 0 seconds or None, got {timeout!r}")
        if rank is None:
            rank = _env_int("RANK")
        if world_size is None:
            world_size = _env_int("WORLD_SIZE")
        options: Dict[str, Any] = {
            "dataset": dataset, "batch_size": batch_size, "image_size": image_size,
            "augment": augment, "seed": seed, "shuffle": shuffle, "drop_last": drop_last,
            "rank": 0 if rank is None else rank,
            "world_size": 1 if world_size is None else world_size,
            "dtype": dtype, "layout": layout, "resize": resize, "ring_slots": ring_slots,
            "reconnect_deadline": float(reconnect_deadline),
            "verify_checksums": verify_checksums, "writable_batches": output == "torch",
            "client_name": client_name if client_name is not None else f"python pid {os.getpid()}",
            "restart_epoch_if_dataset_changed": bool(restart_epoch_if_dataset_changed),
        }
        if mean is not None:
            options["mean"] = [float(v) for v in mean]
        if std is not None:
            options["std"] = [float(v) for v in std]
        _ringloader.validate_options(options)  # raises InvalidArgument naming the option
        self._options = options
        self._default_name = client_name is None
        self._output = output
        self._timeout = timeout
        self._progress = progress
        self._endpoint = endpoint if endpoint else _ringloader.default_endpoint()
        self._start_process(Cursor({"epoch": 0, "sequence": 0, "cursor": 0}, 0))

    def _start_process(self, cursor: Cursor) -> None:
        """What belongs to this process: the connection, and the state (stream, call, pass)."""
        self._pid = os.getpid()
        self._client: Any = None
        self._batches_per_epoch: Optional[int] = None
        # Where the loader is, what its one caller is doing, the iter() in progress: every
        # change is a transition of this object (see _loader_state.py).
        self._state = LoaderState(cursor)

    # ---- the public API ----

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._state.resume_cursor().epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter()`` run epoch ``epoch`` (an int in [0, 2**32)).

        For the epoch the loader is already in (e.g. the one a loaded state is in) it keeps the
        position, so a resumed run continues where it stopped.
        """
        epoch = _epoch_arg("set_epoch: epoch", epoch)
        with self._holding("set_epoch()"):
            s = self._state
            s.drop_pass()
            if epoch != s.cursor.epoch:
                # resumed=None: the loaded state's epoch, if it comes again, is read whole.
                s.move_to(Cursor({"epoch": epoch, "sequence": 0, "cursor": 0},
                                 s.cursor.fingerprint))

    def __len__(self) -> int:
        """Batches in one epoch for this rank: with ``drop_last`` only whole batches (an upper
        bound when the daemon skips bad samples). Asks the daemon for the dataset's size the
        first time; opens no stream."""
        with self._holding("len()"):
            if self._batches_per_epoch is None:
                self._batches_per_epoch = self._count_batches()
            return self._batches_per_epoch

    def __iter__(self) -> Iterator[Batch]:
        """One epoch: from the current position to the epoch's last batch."""
        self._check_process()
        with self._holding("iter()"):  # refused while another call is inside: nothing changes
            p = self._state.start_pass()
        return self._run(p)

    def next_batch(self, timeout: Optional[float] = None) -> Optional[Batch]:
        """The next batch wherever it is (epochs run on), waiting at most ``timeout`` seconds.

        Raises :class:`ringloader.DeadlineExceeded` when none came in time; the loader goes on.
        An ``iter()`` in progress is left where it is (its iterator can no longer be used).
        """
        self._check_process()
        with self._holding("next_batch()"):
            self._state.drop_pass()
            return self._take(timeout if timeout is not None else self._timeout, None)

    def state_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict: :meth:`load_state_dict` resumes exactly as this loader goes on."""
        c = self._state.resume_cursor()  # one immutable value: safe from a signal handler
        r = c.resumed
        if r is not None and r.saved_world is not None and r.start == c.position:
            # A loaded state the daemon has not applied yet (no stream opened since): itself.
            return dict(r.state)
        options = {k: v for k, v in self._options.items()
                   if k != "restart_epoch_if_dataset_changed"}
        options.update(start=dict(c.position), dataset_fingerprint=c.fingerprint)
        if r is not None and r.start["epoch"] == c.epoch:
            options["start_progress"] = r.progress
        return {"format": _STATE_FORMAT, "state": _ringloader.format_state(options),
                "epoch": c.epoch, "sequence": c.position["sequence"]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from a :meth:`state_dict` (of this process or another): with exactly the
        batch after the last one returned when it was taken.

        The state may come from any rank of a job of any world size, per-rank batch size or
        ``drop_last`` (an elastic restart): the samples that job had not consumed in its epoch
        are sharded over this loader's world, each exactly once, and later epochs shard as
        usual. With this loader's own world size, rank and batch size it continues exactly as
        the saved loader would have. ``len()`` stays the batches of a whole epoch; the resumed
        epoch yields fewer (its rest). Where the saved job's ranks skipped bad samples, give the
        states of all its ranks combined (:func:`combine_states`) for an exact resume; one
        rank's state then warns (:class:`ringloader.ResumeWarning`) how many samples may repeat.

        A state of another dataset, seed, shuffle or transform (image size, augment, dtype,
        layout, resize, mean, std) raises :class:`ringloader.InvalidArgument` naming the
        difference.
        """
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise InvalidArgument(
                f"load_state_dict: not a ringloader Loader state (expected format "
                f"{_STATE_FORMAT!r}, got {state.get('format') if isinstance(state, Mapping) else type(state).__name__!r})")
        text = str(state.get("state", ""))
        try:
            c = _ringloader.continue_state(text, self._options)
        except InvalidArgument as e:
            raise InvalidArgument(f"load_state_dict: {e}") from None
        if c["warning"]:
            warnings.warn(c["warning"], ResumeWarning, stacklevel=2)
        resumed = Resumed(dict(c["start"]), c["start_progress"], c["saved_world"],
                          {"format": _STATE_FORMAT, "state": text,
                           "epoch": c["start"]["epoch"], "sequence": 0})
        with self._holding("load_state_dict()"):
            s = self._state
            s.drop_pass()
            # An open stream at the same position would read the epoch without the progress.
            s.drop_stream()
            s.move_to(Cursor(dict(c["start"]), c["dataset_fingerprint"], resumed))

    def peek(self, epoch: Optional[int] = None, batch: int = 0,
             columns: int = 8) -> "numpy.ndarray":
        """One batch as a contact sheet, to look at what the model sees before training on it.

        Returns a ``uint8`` array of shape ``(rows * image_size, columns * image_size, 3)``:
        tile ``k`` (row-major, ``columns`` per row, no borders) is sample ``k`` of batch
        ``batch`` of epoch ``epoch`` (default: the loader's current epoch) exactly as this
        loader's options deliver it, in ``uint8`` before any float32 normalisation. The same
        sheet as ``ringloaderctl peek --out sheet.png``. Tiles past the batch's last sample are
        black. The loader's own position does not move::

            import matplotlib.pyplot as plt
            plt.imshow(loader.peek(batch=3)); plt.axis("off")
        """
        np = numpy
        self._check_process()
        epoch = _epoch_arg("peek: epoch", self.epoch if epoch is None else epoch)
        if epoch + 1 >= _MAX_EPOCH:
            raise InvalidArgument(f"peek: epoch must be < {_MAX_EPOCH - 1}, got {epoch}")
        for name, value, least in (("batch", batch, 0), ("columns", columns, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidArgument(f"peek: {name} must be an int >= {least}, got {value!r}")
        with self._holding("peek()"):
            # From the epoch's first batch: which samples a batch holds depends on the files
            # before it.
            options = dict(self._options, dtype="uint8", layout="NHWC", writable_batches=False,
                           end_epoch=epoch + 1, start={"epoch": epoch, "sequence": 0, "cursor": 0},
                           client_name=f"{self._options['client_name']} (peek)")
            stream = self._connect().open(options)
            try:
                native = None
                for taken in range(batch + 1):
                    native = stream.next(self._timeout)
                    if native is None:
                        raise InvalidArgument(
                            f"peek: epoch {epoch} has {taken} batches: there is no batch {batch}")
                images = np.array(Batch(native, "numpy")["images"])  # a copy: the slot goes back
            finally:
                stream.close()
        n, size = images.shape[0], images.shape[1]
        cols = max(1, min(columns, n))
        rows = max(1, -(-n // cols))
        sheet = np.zeros((rows * size, cols * size, 3), dtype=np.uint8)
        for k in range(n):
            y, x = (k // cols) * size, (k % cols) * size
            sheet[y:y + size, x:x + size] = images[k]
        return sheet

    def close(self) -> None:
        """Closes the stream on the daemon (the next ``iter()`` opens a new one).

        Safe from any thread and from a signal handler: a ``next()`` waiting meanwhile raises
        :class:`ringloader.FailedPrecondition` and takes no batch, so a :meth:`state_dict` saved
        before ``close()`` resumes with the batch it waited for. The same while ``next()`` opens
        or reopens its stream (it waits for the daemon): it raises instead of returning a batch.
        """
        self._state.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if os.getpid() == self._pid:
                self._state.drop_stream()
        except Exception:
            pass

    def __getstate__(self) -> Dict[str, Any]:
        """Options and position: the unpickled Loader connects again, from there."""
        c = self._state.resume_cursor()
        return {"format": _PICKLE_FORMAT, "options": dict(self._options),
                "default_name": self._default_name, "output": self._output,
                "timeout": self._timeout, "progress": self._progress,
                "endpoint": self._endpoint, "position": dict(c.position),
                "fingerprint": c.fingerprint,
                "resumed": None if c.resumed is None else c.resumed.as_dict()}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("format") != _PICKLE_FORMAT:
            raise InvalidArgument("unpickling a Loader: not a pickled ringloader.Loader of this "
                                  f"version (expected format {_PICKLE_FORMAT!r})")
        options = dict(state["options"])
        if state["default_name"]:
            options["client_name"] = f"python pid {os.getpid()}"
        _ringloader.validate_options(options)
        self._options = options
        self._default_name = bool(state["default_name"])
        self._output = state["output"]
        self._timeout = state["timeout"]
        self._progress = state["progress"]
        self._endpoint = state["endpoint"]
        self._start_process(Cursor(dict(state["position"]), state["fingerprint"],
                                   Resumed.of(state["resumed"])))

    @property
    def stats(self) -> Dict[str, Any]:
        """This loader's counters: daemon reconnects survived, held batches copied out, and
        whether the trainer is input-bound: ``trainer_wait_seconds`` (inside ``next()``, waiting
        for batches) and ``trainer_step_seconds`` (between calls) since the stream opened, and
        ``input_bound``, the daemon's judgement of the last minute, wait / (wait + step): under
        0.05 not input-bound, over 0.2 highly; -1 until the daemon has said."""
        stream = self._state.stream
        if stream is None:
            return {"reconnects": 0, "copies": 0, "trainer_wait_seconds": 0.0,
                    "trainer_step_seconds": 0.0, "input_bound": -1.0}
        return {"reconnects": stream.reconnects, "copies": stream.copies,
                "trainer_wait_seconds": stream.trainer_wait_seconds,
                "trainer_step_seconds": stream.trainer_step_seconds,
                "input_bound": stream.input_bound}

    # ---- inside ----

    def _run(self, p: Pass) -> Iterator[Batch]:
        s = self._state
        bar = None
        try:
            if self._progress:
                from tqdm import tqdm
                bar = tqdm(total=len(self), desc=f"epoch {p.epoch}", unit="batch")
                bar.update(p.start.position["sequence"])
            while True:
                with self._holding("next()"):
                    if s.current_pass is not p:
                        raise FailedPrecondition(
                            "this iterator of the Loader was superseded (by a later iter(), "
                            "set_epoch(), load_state_dict() or next_batch()): use a new "
                            "iter(loader)")
                    # None: the epoch's end; or a batch of the next epoch, carried to the next
                    # pass (its epoch ended without a batch marked last: its tail yielded none
                    # while the trainer held the look-ahead's slot).
                    batch = self._take(self._timeout, p)
                    if batch is None:
                        return
                    p.taken += 1
                if bar is not None:
                    bound = s.stream.input_bound if s.stream is not None else -1.0
                    if bound >= 0:
                        bar.set_postfix_str(f"input-bound {bound:.0%}", refresh=False)
                    bar.update(1)
                try:
                    yield batch
                except GeneratorExit:  # break, del, garbage: the pass is undone
                    s.let_go(p)
                    raise
                if s.current_pass is p and s.cursor.epoch != p.epoch:
                    return  # last_in_epoch, or past it
        finally:
            # An error (Unavailable, a timeout, Ctrl-C inside next(), close() from a handler)
            # leaves the position at the batch not taken: the next call continues there.
            if bar is not None:
                bar.close()
            s.end_pass(p)

    def _take(self, timeout: Optional[float], p: Optional[Pass]) -> Optional[Batch]:
        """The next batch for pass `p` (None: for next_batch()), or None. REQUIRES: held."""
        s = self._state
        carried = s.take_carried()
        if carried is not None:
            return carried
        if s.needs_open():
            self._check_process()
            self._open(s.open_begin())
        stream = s.wait_begin()
        try:
            native = stream.next(timeout)
        except KeyboardInterrupt:
            s.wait_failed(drop_stream=True)  # the daemon frees the stream at once
            raise
        except BaseException:
            s.wait_failed()
            raise
        batch = None if native is None else Batch(native, self._output)
        return batch if s.took(batch, p) else None

    def _connect(self) -> Any:
        if self._client is None:
            self._client = _ringloader.Client(self._endpoint)
        return self._client

    def _open(self, at: Cursor) -> None:
        """Opens the stream at `at` (REQUIRES: the state is OPENING)."""
        s = self._state
        # The dataset's fingerprint guards a position inside an epoch (a changed sample list
        # would repeat or skip samples); an epoch's start reads whatever the dataset is now.
        position = at.position
        at_epoch_start = position["sequence"] == 0 and position["cursor"] == 0
        r = at.resumed
        resumed = r is not None and r.start["epoch"] == at.epoch
        if resumed:  # the epoch continues after what the saved job consumed
            at_epoch_start = False
        options = dict(self._options, start=dict(position),
                       dataset_fingerprint=0 if at_epoch_start else at.fingerprint)
        if resumed:
            options.update(start_progress=r.progress, saved_world=r.saved_world)
        try:
            stream = self._connect().open(options)
            if resumed:  # what the daemon applied: this loader's progress from now on
                r = Resumed(r.start, stream.start_progress, None, r.state)
            # restart_epoch_if_dataset_changed may have moved the position.
            opened = Cursor(stream.position, stream.dataset_fingerprint, r)
            batches_per_epoch = stream.batches_per_epoch
        except BaseException:
            s.open_failed()
            raise
        s.opened(stream, opened)  # refused if close() came meanwhile
        self._batches_per_epoch = batches_per_epoch

    def _count_batches(self) -> int:
        """Batches per epoch from the dataset's size, asked of the daemon (no stream)."""
        stream = self._state.stream
        if stream is not None:
            return stream.batches_per_epoch
        o = self._options
        deadline = time.monotonic() + o["reconnect_deadline"]
        while True:
            try:
                stats = _ringloader.daemon_stats(
                    self._endpoint, max(0.05, min(2.0, deadline - time.monotonic())))
                if not stats["starting"]:
                    break
                # Still indexing its datasets at start-up: their sizes are not known yet (a
                # stream opened now would wait too).
                if time.monotonic() >= deadline:
                    raise Unavailable(
                        f"ringloaderd at {self._endpoint} is still indexing its datasets after "
                        f"{o['reconnect_deadline']} s (reconnect_deadline): "
                        f"{stats['starting_progress']}")
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.1)  # Ctrl-C is answered here
        sizes = {d["name"]: d["samples"] for d in stats["datasets"]}
        if o["dataset"] not in sizes:
            raise NotFound(f"unknown dataset '{o['dataset']}': the daemon at {self._endpoint} "
                           f"serves {', '.join(map(repr, sorted(sizes))) or 'none'}")
        n, world, size = sizes[o["dataset"]], o["world_size"], o["batch_size"]
        if o["drop_last"]:  # as server/pipeline/sampler.h: whole shards, whole batches
            return (n // world) // size
        shard = -(-n // world)
        return -(-shard // size)

    @property
    def _stream(self) -> Any:
        """The open stream, or None (for tests: a call inside waits on it)."""
        return self._state.stream

    @property
    def _busy(self) -> Any:
        """Held by the thread whose call is inside the Loader (for tests)."""
        return self._state.busy

    @contextlib.contextmanager
    def _holding(self, what: str) -> Iterator[None]:
        """The one call inside the Loader: refused (FailedPrecondition) while another is."""
        self._state.enter(what)
        try:
            yield
        finally:
            self._state.leave()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise FailedPrecondition(
                f"this Loader was created in process {self._pid} and cannot be used after "
                f"fork() (here in process {os.getpid()}): create a new Loader in the child, "
                "or use DataLoader(num_workers=0) with ringloader.torch.IterableDataset; "
                "ringloader already decodes in its own process")

    def __repr__(self) -> str:
        o = self._options
        return (f"<ringloader.Loader {o['dataset']!r} batch_size={o['batch_size']} "
                f"rank={o['rank']}/{o['world_size']} epoch={self.epoch} "
                f"endpoint={self._endpoint!r}>")


def combine_states(states: List[Mapping[str, Any]]) -> Dict[str, Any]:
    """One state for a whole job from the :meth:`Loader.state_dict` of every rank (any order).

    Where ranks skipped different numbers of bad samples, one rank's state cannot say how far
    the others got; this one can, so :meth:`Loader.load_state_dict` of it resumes exactly at any
    world size. Raises :class:`ringloader.InvalidArgument` naming what contradicts: a rank
    missing or given twice, options that differ, ranks in different epochs.
    """
    texts: List[str] = []
    for i, state in enumerate(states):
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise InvalidArgument(f"combine_states: states[{i}] is not a ringloader Loader state")
        text = str(state.get("state", ""))
        if text in texts:
            raise InvalidArgument(
                f"combine_states: states[{texts.index(text)}] and states[{i}] are the same state "
                "(a Loader that loaded a state and has not read a batch since returns the state "
                "it loaded): take each rank's state after it has read")
        texts.append(text)
    text = _ringloader.combine_states(texts)
    epoch = _ringloader.parse_state(text)["start"]["epoch"]
    return {"format": _STATE_FORMAT, "state": text, "epoch": epoch, "sequence": 0}
