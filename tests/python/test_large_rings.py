# SPDX-License-Identifier: Apache-2.0
"""Issue 37 item 2: a trainer reconnects whatever its ring size.

ResNet-50's input as users run it: 224 px float32 batches of 256 (a 462 MB ring) and of 768
(1.39 GB), under a supervised daemon that is SIGKILLed repeatedly on a busy host. A daemon making
such a ring answers the reopen after 0.4-1.5 s, longer than the Loader's 200 ms wait slices: the
reopen must be waited for, not sent again each slice (before the fix the trainer never got its
next batch). Every sample comes exactly once, with the bytes of an undisturbed run, and the daemon
keeps no stream besides the trainer's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest

import ringloader as rl
from conftest import make_dataset, worker_pid

COUNT = 1536  # two batches of 768, six of 256
EPOCHS = 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("large_rings"), COUNT, 8, seed=37)


def samples_of(batch: rl.Batch) -> List[Tuple[int, int]]:
    """(sample index, CRC-32 of its float32 image) for each sample of the batch."""
    images = np.asarray(batch["images"])
    return [(int(i), zlib.crc32(images[k].tobytes())) for k, i in enumerate(batch["indices"])]


def read_epochs(loader: rl.Loader, on_batch=None) -> List[List[Tuple[int, int]]]:
    epochs = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        got: List[Tuple[int, int]] = []
        for k, batch in enumerate(loader):
            got.extend(samples_of(batch))
            del batch  # its slot goes back
            if on_batch is not None:
                on_batch(epoch, k)
        epochs.append(got)
    return epochs


@pytest.mark.parametrize("batch_size, ring_bytes", [(256, 462_000_000), (768, 1_387_000_000)],
                         ids=["462MB-ring", "1.4GB-ring"])
def test_a_trainer_with_a_production_size_ring_survives_repeated_daemon_kills(
        dataset, batch_size, ring_bytes):
    opts = dict(batch_size=batch_size, image_size=224, dtype="float32", seed=11,
                output="numpy", reconnect_deadline=120)
    with rl.Daemon(datasets={"imagenet": dataset}, memory_limit="6GiB") as daemon:
        reference = read_epochs(rl.Loader("imagenet", endpoint=daemon.endpoint, **opts))
        for epoch in reference:  # each sample once per epoch
            assert sorted(i for i, _ in epoch) == list(range(COUNT))

        # A busy host: a process spinning on one of the two cores for the whole run.
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        kills = 0

        last = COUNT // batch_size - 1

        def kill_daemon(epoch: int, batch: int) -> None:
            # After the first two batches of each epoch but its last (the next batch is then one
            # the restarted daemon makes, in a new ring): 4 kills at batch 256, 2 at 768.
            nonlocal kills
            if batch in (0, 1) and batch < last:
                os.kill(worker_pid(daemon), signal.SIGKILL)
                kills += 1

        try:
            loader = rl.Loader("imagenet", endpoint=daemon.endpoint, **opts)
            got = read_epochs(loader, kill_daemon)
            stats = rl.daemon_stats(daemon.endpoint)
        finally:
            busy.kill()
            busy.wait()
        assert kills == EPOCHS * min(2, last)
        assert got == reference
        assert loader.stats["reconnects"] == kills
        # The ring really is that large, and the reopens left nothing behind.
        assert len(stats["streams"]) == 1
        assert stats["memory_reserved_bytes"] >= ring_bytes
        assert stats["opens_abandoned"] == 0
        loader.close()
