# SPDX-License-Identifier: Apache-2.0
"""Loader: epochs, lengths, zero-copy lifetime, writable torch batches, state, errors."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pytest
import torch

import ringloader as rl
from conftest import TINY_COUNT, digest, indices_of, run_python

OPTS = dict(batch_size=8, image_size=32, seed=7)


def numpy_loader(daemon, **kw):
    return rl.Loader("tiny", endpoint=daemon.endpoint, output="numpy", **{**OPTS, **kw})


def test_one_epoch_per_iter_covers_the_dataset_once(daemon):
    loader = numpy_loader(daemon)
    assert len(loader) == math.ceil(TINY_COUNT / 8)
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        seen = sorted(i for b in batches for i in b["indices"].tolist())
        assert seen == list(range(TINY_COUNT))
        assert batches[-1].last_in_epoch and not any(b.last_in_epoch for b in batches[:-1])
        epochs.append([i for b in batches for i in b["indices"].tolist()])
    assert epochs[0] != epochs[1]  # each iter() is the next epoch, shuffled anew
    images = batches[0]["images"]
    assert images.shape == (8, 32, 32, 3) and images.dtype == np.uint8
    assert batches[0]["labels"].dtype == np.int64
    assert len(batches[0].paths) == 8 and all(p.endswith(".jpg") for p in batches[0].paths)


def test_float32_nchw_torch_output(daemon):
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, dtype="float32", layout="NCHW", **OPTS)
    batch = next(iter(loader))
    images = batch["images"]
    assert isinstance(images, torch.Tensor)
    assert images.dtype == torch.float32 and tuple(images.shape) == (8, 3, 32, 32)
    assert -3 < float(images.min()) < float(images.max()) < 3  # normalised, not 0..255


def test_numpy_batches_are_read_only_views_of_the_ring(daemon):
    loader = numpy_loader(daemon)
    batch = next(iter(loader))
    images = batch["images"]
    assert not images.flags.owndata and not images.flags.writeable
    with pytest.raises(ValueError):
        images[0, 0, 0, 0] = 1


def test_a_kept_array_keeps_its_bytes_while_the_stream_goes_on(daemon):
    """Zero-copy lifetime: the slot is held while any array views it; when held arrays would
    starve the ring they are copied out in place, and release() never pulls bytes away."""
    loader = numpy_loader(daemon)
    it = iter(loader)
    kept = [next(it)["images"] for _ in range(4)]  # the batches themselves are dropped
    addresses = [k.ctypes.data for k in kept]
    snapshots = [k.copy() for k in kept]
    released = next(it)
    released_view = released["images"]
    released_snapshot = released_view.copy()
    copies = loader.stats["copies"]
    released.release()  # the array outlives release(): copied out now, its slot given back
    assert loader.stats["copies"] == copies + 1
    released.release()  # twice is harmless
    for _ in range(6):  # more batches than the ring has slots
        next(it)
    assert [k.ctypes.data for k in kept] == addresses
    for k, snapshot in zip(kept, snapshots):
        np.testing.assert_array_equal(k, snapshot)
    np.testing.assert_array_equal(released_view, released_snapshot)
    assert loader.stats["copies"] >= 1


def test_dropped_batches_cost_no_copies(daemon):
    loader = numpy_loader(daemon)
    for batch in loader:
        batch["images"].sum()
    assert loader.stats["copies"] == 0


def test_in_place_ops_on_torch_batches_never_crash_or_reach_later_batches(daemon):
    writable = rl.Loader("tiny", endpoint=daemon.endpoint, output="torch", **OPTS)
    reference = numpy_loader(daemon)
    for mine, theirs in zip(writable, reference):
        images = mine["images"]
        np.testing.assert_array_equal(images.numpy(), theirs["images"])  # the daemon's bytes
        before = theirs["images"].copy()
        images.mul_(2)                 # in place, on the batch itself
        images[:, :4] = 255
        mine["labels"].zero_()
        assert int(images[0, 0, 0, 0]) == 255 and int(mine["labels"].sum()) == 0
        np.testing.assert_array_equal(theirs["images"], before)  # another reader is untouched
    # Every batch of a second epoch, in slots written to above, is the daemon's again.
    for mine, theirs in zip(writable, reference):
        np.testing.assert_array_equal(mine["images"].numpy(), theirs["images"])
        np.testing.assert_array_equal(mine["labels"].numpy(), theirs["labels"])


def test_state_dict_resumes_with_exactly_the_next_batch_in_a_new_process(daemon):
    loader = numpy_loader(daemon)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.dumps(loader.state_dict())  # JSON-safe
    expected = [digest(next(it)) for _ in range(3)]
    code = """
import json, sys
import ringloader as rl
from conftest import digest
loader = rl.Loader("tiny", endpoint=sys.argv[1], output="numpy", batch_size=8, image_size=32, seed=7)
loader.load_state_dict(json.loads(sys.argv[2]))
loader.set_epoch(0)   # the epoch the state is in: keeps the loaded position
it = iter(loader)
print(json.dumps([digest(next(it)) for _ in range(3)]))
"""
    out = run_python(code, daemon.endpoint, state,
                     env={"PYTHONPATH": os.path.dirname(__file__)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected


def test_a_state_of_another_run_is_refused_naming_the_difference(daemon):
    state = numpy_loader(daemon).state_dict()
    other = numpy_loader(daemon, seed=8)  # another batch size or world is an elastic restart
    with pytest.raises(rl.InvalidArgument, match="saved with seed=7.*have seed=8"):
        other.load_state_dict(state)
    with pytest.raises(rl.InvalidArgument, match="not a ringloader Loader state"):
        other.load_state_dict({"epoch": 3})


def test_set_epoch_and_abandoned_iterations(daemon):
    loader = numpy_loader(daemon)
    reference = numpy_loader(daemon)
    reference.set_epoch(3)
    epoch3 = indices_of(list(reference))
    loader.set_epoch(3)
    assert indices_of(list(loader)) == epoch3
    assert loader.epoch == 4
    loader.set_epoch(3)  # another epoch than the loader's: epoch 3 from its start
    assert indices_of(list(loader)) == epoch3
    it = iter(loader)
    next(it)  # abandon epoch 4 after one batch: the next iter() runs epoch 4 whole
    del it
    assert next(iter(loader)).position == {"epoch": 4, "sequence": 0, "cursor": 0}


def test_torchrun_environment_sets_rank_and_world_size(daemon, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = numpy_loader(daemon)
    assert len(loader) == math.ceil(TINY_COUNT / 2 / 8)
    ranked = set(i for b in loader for i in b["indices"].tolist())
    monkeypatch.setenv("RANK", "0")
    other = set(i for b in numpy_loader(daemon) for i in b["indices"].tolist())
    assert not ranked & other and len(ranked | other) == TINY_COUNT


def test_progress_bar(daemon, capsys):
    loader = numpy_loader(daemon, progress=True)
    assert len(list(loader)) == len(loader)
    err = capsys.readouterr().err
    assert f"{len(loader)}/{len(loader)}" in err
    assert "input-bound " in err  # the daemon's figure, in the bar's postfix


def test_stats_say_whether_the_trainer_is_input_bound(daemon):
    """Issue 39: a trainer computing 40 ms a step on easy batches is not input-bound, in
    loader.stats and in the daemon's stats; one that does nothing waits for most of its time."""
    loader = numpy_loader(daemon, client_name="py compute")
    batches = iter(loader)
    for _ in range(len(loader) - 1):
        next(batches)
        time.sleep(0.04)
    mine = loader.stats
    assert 0 <= mine["input_bound"] < 0.2
    assert mine["trainer_step_seconds"] >= 0.04 * (len(loader) - 2)
    assert 0 < mine["trainer_wait_seconds"] < mine["trainer_step_seconds"]
    [stream] = [s for s in daemon.stats()["streams"] if s["client_name"] == "py compute"]
    assert 0 <= stream["input_bound"] < 0.2
    assert stream["input_bound_words"] in ("not input-bound", "moderately input-bound")
    assert stream["trainer_step_seconds"] > 0.3
