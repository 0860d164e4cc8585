# SPDX-License-Identifier: Apache-2.0
"""PyTorch integration: for code that insists on a ``torch.utils.data.DataLoader``.

>>> from torch.utils.data import DataLoader
>>> data = DataLoader(ringloader.torch.IterableDataset(loader), batch_size=None, num_workers=0)

Batches are already made (and decoded in the daemon's process), so the DataLoader must neither
batch again (``batch_size=None``) nor fork workers (``num_workers=0``; a Loader refuses to run
in a forked worker). :class:`ringloader.Loader` itself follows
``torch.distributed.checkpoint``'s Stateful protocol (``state_dict`` / ``load_state_dict``).
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterator

import torch.utils.data

from .errors import InvalidArgument
from .loader import Loader


def _collating_fetcher(frame: Any) -> bool:
    """True when the DataLoader that called us batches what we yield (batch_size not None)."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "_IterableDatasetFetcher":
            return bool(getattr(owner, "auto_collation", False))
        frame = frame.f_back
    return False


class IterableDataset(torch.utils.data.IterableDataset):
    """A :class:`Loader` as a torch ``IterableDataset``: each ``iter()`` is one epoch of batches,
    each a dict of every tensor the batch has (``"images"``, ``"labels"``, ``"indices"`` and the
    dataset's own, as :class:`ringloader.Batch` names them).

    Use it with ``DataLoader(..., batch_size=None, num_workers=0)``: the batches are made
    already, so a ``batch_size`` would stack several of them into one (refused), and workers
    would fork the Loader (refused too).
    """

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self.loader = loader

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            raise RuntimeError(
                "ringloader.torch.IterableDataset runs in the DataLoader's own process: use "
                "num_workers=0 (decoding already happens in the ringloader daemon)")
        return self._batches()

    def _batches(self) -> Iterator[Dict[str, Any]]:
        if _collating_fetcher(sys._getframe(1)):
            raise InvalidArgument(
                "ringloader.torch.IterableDataset yields whole batches: use "
                "DataLoader(dataset, batch_size=None) (a batch_size would stack several "
                "batches into one); the Loader's batch_size sets the batch")
        for batch in self.loader:
            yield {name: batch[name] for name in batch}

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
