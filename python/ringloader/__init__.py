# SPDX-License-Identifier: Apache-2.0
"""ringloader: training batches decoded in a separate daemon, read in place from shared memory.

>>> import ringloader as rl
>>> loader = rl.Loader("imagenet-train", batch_size=256, image_size=224)
>>> for batch in loader:
...     images, labels = batch["images"], batch["labels"]

The daemon (``ringloaderd``) decodes, augments and batches JPEGs out of the trainer's process,
so a crashing decoder, a huge image or an out-of-memory kill costs a daemon restart, not the
training run: the loader continues with exactly the next batch. For a notebook without a
system daemon, :class:`Daemon` starts a private one.
"""

from __future__ import annotations

from typing import Any, Dict

from .errors import (DataLoss, DeadlineExceeded, Error, FailedPrecondition, Internal,
                     InvalidArgument, NotFound, ResourceExhausted, Unavailable)
from .loader import Batch, Loader, ResumeWarning, combine_states
from .daemon import Daemon, find_binary
from . import _ringloader


def health(endpoint: str | None = None, timeout: float = 2.0) -> str:
    """The daemon's health: ``"SERVING"`` when it serves; :class:`Unavailable` when nothing
    answers at ``endpoint`` (default ``$RINGLOADER_ENDPOINT`` or the system socket)."""
    return _ringloader.health(endpoint or _ringloader.default_endpoint(), timeout)


def daemon_stats(endpoint: str | None = None, timeout: float = 10.0) -> Dict[str, Any]:
    """The daemon's counters, what ``ringloaderctl stats`` shows, as a dict keyed by the fields of
    ``GetStatsResponse`` in proto/ringloader.proto: ``batches_served``, ``images_decoded``,
    ``decode_errors_by_reason`` (reason -> count), ``recent_bad_files`` (the latest, with path,
    reason and message), ``quarantined``, ``cache`` (eval cache hits, misses, bytes, ``full``),
    ``datasets``, ``daemon_restarts``, memory figures, ... Every counter is present, 0 included.
    :class:`Unavailable` when nothing answers at ``endpoint`` (default ``$RINGLOADER_ENDPOINT``
    or the system socket) within ``timeout`` seconds."""
    return _ringloader.daemon_stats(endpoint or _ringloader.default_endpoint(), timeout)


def __getattr__(name: str):  # ringloader.torch is imported on first use (torch is optional)
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'ringloader' has no attribute {name!r}")


__version__ = _ringloader.__version__  # the build's version (CMakeLists.txt project())
__all__ = ["Loader", "Batch", "Daemon", "combine_states", "ResumeWarning", "health", "daemon_stats", "find_binary", "Error", "Unavailable",
           "NotFound", "InvalidArgument", "ResourceExhausted", "DataLoss", "FailedPrecondition",
           "Internal", "DeadlineExceeded"]
