"""PyTorch integration: for code that insists on a ``torch.utils.data.DataLoader``.

>>> from torch.utils.data import DataLoader
>>> data = DataLoader(ringloader.torch.IterableDataset(loader), batch_size=None, num_workers=0)

Batches are already made (and decoded in the daemon's process), so the DataLoader must neither
batch again (``batch_size=None``) nor fork workers (``num_workers=0``; a Loader refuses to run
in a forked worker). :class:`ringloader.Loader` itself follows
``torch.distributed.checkpoint``'s Stateful protocol (``state_dict`` / ``load_state_dict``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator

import torch.utils.data

from .loader import Loader


class IterableDataset(torch.utils.data.IterableDataset):
    """A :class:`Loader` as a torch ``IterableDataset``: each ``iter()`` is one epoch of dicts
    ``{"images", "labels", "indices"}`` of tensors (the Loader's output must be ``"torch"``).
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
        for batch in self.loader:
            yield {"images": batch["images"], "labels": batch["labels"],
                   "indices": batch["indices"]}

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
