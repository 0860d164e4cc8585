# SPDX-License-Identifier: Apache-2.0
"""PyTorch integration: DataLoader over IterableDataset, and the example training script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import ringloader as rl
import ringloader.torch as rlt

EXAMPLE = Path(__file__).resolve().parents[2] / "python" / "examples" / "train_resnet_step.py"


def test_dataloader_over_the_iterable_dataset(daemon):
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=8, image_size=32, seed=1)
    data = DataLoader(rlt.IterableDataset(loader), batch_size=None, num_workers=0)
    batches = list(data)
    assert len(batches) == len(loader)
    assert all(isinstance(b["images"], torch.Tensor) for b in batches)
    assert batches[0]["images"].shape == (8, 32, 32, 3)


def test_dataloader_workers_are_refused_with_a_clear_message(daemon):
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=8, image_size=32)
    # timeout: a worker that hangs (CI once saw the forked worker stuck in a futex) fails the
    # test instead of hanging the suite.
    data = DataLoader(rlt.IterableDataset(loader), batch_size=None, num_workers=1, timeout=60)
    with pytest.raises(Exception, match="num_workers=0|fork"):
        next(iter(data))
    loader.close()


def take(loader, n):
    it = iter(loader)
    return [next(it)["indices"].tolist() for _ in range(n)]


def state_after_four_batches(daemon):
    """A loader's state_dict() after 4 batches, and the 3 batches that follow it."""
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=8, image_size=32)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    return state, [next(it)["indices"].tolist() for _ in range(3)]


def test_loader_follows_the_stateful_protocol(daemon, tmp_path):
    """state_dict() is a plain JSON-safe dict that round-trips through a torch.save checkpoint
    into a new Loader, which continues with exactly the next batch."""
    state, expected = state_after_four_batches(daemon)
    assert json.loads(json.dumps(state)) == state
    torch.save({"loader": state}, tmp_path / "ckpt.pt")
    restored = rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=8, image_size=32)
    restored.load_state_dict(torch.load(tmp_path / "ckpt.pt")["loader"])
    assert take(restored, 3) == expected


def test_loader_state_round_trips_through_torch_distributed_checkpoint(daemon, tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint",
                              reason="Debian's torch has no torch.distributed.checkpoint")
    state, expected = state_after_four_batches(daemon)
    save = getattr(dcp, "save_state_dict", None) or dcp.save
    load = getattr(dcp, "load_state_dict", None) or dcp.load
    save(state_dict={"loader": state}, storage_writer=dcp.FileSystemWriter(str(tmp_path)),
         no_dist=True)
    into = {"loader": {key: type(value)() for key, value in state.items()}}
    load(state_dict=into, storage_reader=dcp.FileSystemReader(str(tmp_path)), no_dist=True)
    assert into["loader"] == state
    again = rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=8, image_size=32)
    again.load_state_dict(into["loader"])
    assert take(again, 3) == expected


def test_the_resnet_example_trains_checkpoints_and_resumes(daemon, tmp_path):
    env = {**os.environ, "RINGLOADER_ENDPOINT": daemon.endpoint}
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--dataset", "tiny", "--steps", "3", "--batch-size", "8",
         "--image-size", "64", "--checkpoint", str(tmp_path / "ckpt.pt")],
        capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "step 3" in run.stdout and "saved" in run.stdout
    resumed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--dataset", "tiny", "--steps", "2", "--batch-size", "8",
         "--image-size", "64", "--checkpoint", str(tmp_path / "ckpt.pt")],
        capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at epoch 0 sequence 3" in resumed.stdout
