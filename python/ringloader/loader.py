"""The Loader: batches from a ringloader daemon, read in place from its shared-memory ring."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterator, List, Mapping, Optional

from . import _ringloader
from .errors import FailedPrecondition, InvalidArgument

_STATE_FORMAT = "ringloader.Loader/1"

# Options a saved state must agree with (the rest may change between runs).
_RUN_KEYS = ("dataset", "batch_size", "seed", "rank", "world_size", "image_size", "augment",
             "dtype", "layout", "resize", "shuffle", "drop_last", "mean", "std")


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"${name} must be an integer, got {value!r}") from None


class Batch(Mapping):
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


class Loader:
    """Batches of one dataset from a ringloader daemon, one epoch per ``iter()``.

    >>> loader = Loader("imagenet-train", batch_size=256)
    >>> for epoch in range(epochs):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         images, labels = batch["images"], batch["labels"]

    Sample order and every sample's bytes are a pure function of (dataset, seed, epoch, rank,
    position): :meth:`state_dict` after any batch and :meth:`load_state_dict` in a new process
    continue with exactly the next batch. A daemon that dies and comes back is invisible; one
    that stays away past ``reconnect_deadline`` seconds raises :class:`ringloader.Unavailable`.

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
                 verify_checksums: bool = False) -> None:
        if output not in ("torch", "numpy"):
            raise InvalidArgument(f"output: must be 'torch' or 'numpy', got {output!r}")
        try:
            import numpy  # noqa: F401  (every batch is numpy arrays, also under torch tensors)
        except ImportError:
            raise InvalidArgument(
                f"ringloader needs numpy, which this python ({sys.executable}) cannot import: "
                "use Debian's /usr/bin/python3 (apt install python3-numpy)") from None
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
        }
        if mean is not None:
            options["mean"] = [float(v) for v in mean]
        if std is not None:
            options["std"] = [float(v) for v in std]
        _ringloader.validate_options(options)  # raises InvalidArgument naming the option
        self._options = options
        self._output = output
        self._timeout = timeout
        self._progress = progress
        self._endpoint = endpoint if endpoint else _ringloader.default_endpoint()
        self._pid = os.getpid()
        self._client: Any = None
        self._stream: Any = None
        self._position = {"epoch": 0, "sequence": 0, "cursor": 0}
        self._fingerprint = 0
        self._batches_per_epoch: Optional[int] = None
        # True when the position was chosen (construction, set_epoch, load_state_dict): iter()
        # starts there. False after batches were taken: an iteration abandoned part-way makes
        # the next iter() start the next epoch, as a new DataLoader iterator would.
        self._chosen = True

    # ---- the public API ----

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._position["epoch"]

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter()`` run epoch ``epoch``.

        For the epoch the loader is already in (e.g. the one a loaded state is in) it keeps the
        position, so a resumed run continues where it stopped.
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgument(f"set_epoch: epoch must be an int >= 0, got {epoch!r}")
        if epoch != self._position["epoch"]:
            self._position = {"epoch": epoch, "sequence": 0, "cursor": 0}
        self._chosen = True

    def __len__(self) -> int:
        """Batches in one epoch for this rank (exact when no sample is skipped)."""
        if self._batches_per_epoch is None:
            self._ensure_stream()
        assert self._batches_per_epoch is not None
        return self._batches_per_epoch

    def __iter__(self) -> Iterator[Batch]:
        """One epoch: from the current position to the epoch's last batch."""
        self._check_process()
        if not self._chosen and self._position["sequence"] != 0:
            self._position = {"epoch": self._position["epoch"] + 1, "sequence": 0, "cursor": 0}
        self._chosen = False
        return self._epoch(self._position["epoch"])

    def next_batch(self, timeout: Optional[float] = None) -> Optional[Batch]:
        """The next batch wherever it is (epochs run on), waiting at most ``timeout`` seconds.

        Raises :class:`ringloader.DeadlineExceeded` when none came in time; the loader goes on.
        """
        self._check_process()
        self._chosen = False
        return self._take(timeout if timeout is not None else self._timeout)

    def state_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict: :meth:`load_state_dict` resumes after the last batch returned."""
        options = dict(self._options, start=dict(self._position),
                       dataset_fingerprint=self._fingerprint)
        return {"format": _STATE_FORMAT, "state": _ringloader.format_state(options),
                "epoch": self._position["epoch"], "sequence": self._position["sequence"]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from a :meth:`state_dict` (of this process or another): with exactly the
        batch after the last one returned when it was taken.

        The state must come from a loader with the same dataset, batch size, seed, rank, world
        size and transforms; otherwise :class:`ringloader.InvalidArgument` names the difference.
        """
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise InvalidArgument(
                f"load_state_dict: not a ringloader Loader state (expected format "
                f"{_STATE_FORMAT!r}, got {state.get('format') if isinstance(state, Mapping) else type(state).__name__!r})")
        saved = _ringloader.parse_state(str(state.get("state", "")))
        for key in _RUN_KEYS:
            mine, theirs = self._options.get(key), saved.get(key)
            if key in ("mean", "std"):
                mine = list(mine or [])
                theirs = list(theirs or [])
            if mine != theirs:
                raise InvalidArgument(
                    f"load_state_dict: the state was saved with {key}={theirs!r}, this Loader has "
                    f"{key}={mine!r}")
        self._close_stream()
        self._position = dict(saved["start"])
        self._fingerprint = saved["dataset_fingerprint"]
        self._chosen = True

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
        import numpy as np
        self._check_process()
        if epoch is None:
            epoch = self.epoch
        for name, value, least in (("epoch", epoch, 0), ("batch", batch, 0), ("columns", columns, 1)):
            if not isinstance(value, int) or value < least:
                raise InvalidArgument(f"peek: {name} must be an int >= {least}, got {value!r}")
        if self._client is None:
            self._client = _ringloader.Client(self._endpoint)
        # From the epoch's first batch: which samples a batch holds depends on the files before it.
        options = dict(self._options, dtype="uint8", layout="NHWC", writable_batches=False,
                       end_epoch=epoch + 1, start={"epoch": epoch, "sequence": 0, "cursor": 0},
                       client_name=f"{self._options['client_name']} (peek)")
        stream = self._client.open(options)
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
        """Closes the stream on the daemon (the next ``iter()`` opens a new one)."""
        self._close_stream()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if os.getpid() == self._pid:
                self._close_stream()
        except Exception:
            pass

    @property
    def stats(self) -> Dict[str, int]:
        """This loader's counters: daemon reconnects survived and held batches copied out."""
        if self._stream is None:
            return {"reconnects": 0, "copies": 0}
        return {"reconnects": self._stream.reconnects, "copies": self._stream.copies}

    # ---- inside ----

    def _epoch(self, epoch: int) -> Iterator[Batch]:
        bar = None
        if self._progress:
            from tqdm import tqdm
            bar = tqdm(total=len(self), desc=f"epoch {epoch}", unit="batch")
            bar.update(self._position["sequence"])
        try:
            while True:
                batch = self._take(self._timeout)
                if batch is None:
                    return
                if bar is not None:
                    bar.update(1)
                yield batch
                if batch.last_in_epoch:
                    return
        finally:
            if bar is not None:
                bar.close()

    def _take(self, timeout: Optional[float]) -> Optional[Batch]:
        stream = self._ensure_stream()
        try:
            native = stream.next(timeout)
        except KeyboardInterrupt:
            self._close_stream()  # the daemon frees the stream at once
            raise
        if native is None:
            return None
        self._position = native.next
        return Batch(native, self._output)

    def _ensure_stream(self) -> Any:
        self._check_process()
        if self._stream is not None and self._stream.position == self._position:
            return self._stream
        self._close_stream()
        if self._client is None:
            self._client = _ringloader.Client(self._endpoint)
        options = dict(self._options, start=dict(self._position),
                       dataset_fingerprint=self._fingerprint)
        self._stream = self._client.open(options)
        self._fingerprint = self._stream.dataset_fingerprint
        self._batches_per_epoch = self._stream.batches_per_epoch
        return self._stream

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

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
                f"rank={o['rank']}/{o['world_size']} epoch={self._position['epoch']} "
                f"endpoint={self._endpoint!r}>")
