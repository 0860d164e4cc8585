# SPDX-License-Identifier: Apache-2.0
"""Issue 30 through the installed package: a Loader state resumes at another world size, rank or
per-rank batch size, exactly once. In each test the union of all ranks' samples per epoch is the
dataset (padding excepted) with the bytes an undisturbed world-1 run gave each sample."""

from __future__ import annotations

import collections
import hashlib
import json
import warnings
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import ringloader as rl
from conftest import TINY_COUNT, make_dataset

OPTS = dict(image_size=32, seed=3, output="numpy")


class Served:
    """Epoch -> sample index -> times served, and each served sample's image digest."""

    def __init__(self) -> None:
        self.times: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.digest: Dict[int, Dict[int, str]] = collections.defaultdict(dict)

    def add(self, batch: rl.Batch) -> None:
        epoch = batch.position["epoch"]
        for i, index in enumerate(batch["indices"]):
            self.times[epoch][int(index)] += 1
            self.digest[epoch][int(index)] = hashlib.sha256(batch["images"][i].tobytes()).hexdigest()


def loaders(daemon, world: int, batch_size: int, drop_last: bool = False,
            state: Optional[dict] = None, dataset: str = "tiny") -> List[rl.Loader]:
    """The ranks of a job (each as torchrun would start it), continuing `state` if given."""
    ranks = []
    for r in range(world):
        loader = rl.Loader(dataset, endpoint=daemon.endpoint, rank=r, world_size=world,
                           batch_size=batch_size, drop_last=drop_last, **OPTS)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))  # as through a checkpoint file
        ranks.append(loader)
    return ranks


def take(ranks: List[rl.Loader], served: Served, batches: int) -> List[dict]:
    """Every rank takes `batches` batches inside its epoch's loop and saves its state there."""
    states = []
    for loader in ranks:
        it = iter(loader)
        for _ in range(batches):
            served.add(next(it))
        states.append(loader.state_dict())
    return states


def finish(ranks: List[rl.Loader], served: Served, epochs_after: int = 1) -> None:
    """Every rank runs the rest of its epoch, then `epochs_after` whole epochs more."""
    for loader in ranks:
        for _ in range(1 + epochs_after):
            for batch in loader:
                served.add(batch)


def check_exactly_once(served: Served, reference: Served, good: set, max_repeats: int = 0,
                       max_missing: int = 0) -> None:
    assert sorted(served.times) == [0, 1]
    for epoch, times in served.times.items():
        assert set(times) <= good, f"epoch {epoch}: a bad sample was served"
        missing = good - set(times)
        repeats = sum(n - 1 for n in times.values())
        assert repeats <= max_repeats, f"epoch {epoch}: {repeats} repeats"
        assert len(missing) <= max_missing, f"epoch {epoch}: missing {sorted(missing)}"
        for index in times:
            assert served.digest[epoch][index] == reference.digest[epoch][index], (epoch, index)


@pytest.fixture(scope="module")
def reference(daemon) -> Served:
    served = Served()
    finish(loaders(daemon, 1, 8), served)
    assert len(served.times[0]) == TINY_COUNT
    return served


def test_world_2_to_3_to_1_within_one_epoch_reads_every_sample_once(daemon, reference):
    served = Served()
    states = take(loaders(daemon, 2, 8), served, 2)
    # Any one rank's state is the job's (lockstep, nothing skipped): rank 1's here.
    with warnings.catch_warnings():
        warnings.simplefilter("error", rl.ResumeWarning)
        three = loaders(daemon, 3, 8, state=states[1])
    states = take(three, served, 1)
    one = loaders(daemon, 1, 8, state=states[0])
    finish(one, served)
    check_exactly_once(served, reference, set(range(TINY_COUNT)))


def test_world_4_to_2_with_a_doubled_batch_size_and_drop_last(daemon, reference):
    for drop_last in (False, True):
        served = Served()
        states = take(loaders(daemon, 4, 4, drop_last), served, 3)
        finish(loaders(daemon, 2, 8, drop_last, state=states[2]), served)
        if drop_last:  # nothing repeats; less than a batch a rank (plus a truncation) dropped
            check_exactly_once(served, reference, set(range(TINY_COUNT)), max_missing=2 * 8 + 1)
        else:
            check_exactly_once(served, reference, set(range(TINY_COUNT)), max_repeats=1)


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_a_resize_at_an_epoch_boundary(daemon, reference, before):
    served = Served()
    two = loaders(daemon, 2, 8)
    per_epoch = len(two[0])  # 48 samples a rank: 6 batches
    assert per_epoch == 6
    if before:
        states = take(two, served, per_epoch - 1)
    else:
        for loader in two:
            for batch in loader:
                served.add(batch)
        states = [loader.state_dict() for loader in two]
        assert states[0]["epoch"] == 1
    finish(loaders(daemon, 3, 8, state=states[0]), served, epochs_after=0 if not before else 1)
    check_exactly_once(served, reference, set(range(TINY_COUNT)), max_repeats=2)


def test_a_state_round_trips_before_the_daemon_applies_it_and_set_epoch_keeps_it(daemon,
                                                                                reference):
    served = Served()
    states = take(loaders(daemon, 2, 8), served, 2)
    three = []
    for r in range(3):
        # Saved again before any batch (no stream opened yet): that is the loaded state itself,
        # and a loader given it continues the same.
        loaded = rl.Loader("tiny", endpoint=daemon.endpoint, rank=r, world_size=3, batch_size=8,
                           **OPTS)
        loaded.load_state_dict(states[0])
        again = loaded.state_dict()
        assert again["state"] == states[0]["state"]
        loaded.close()
        fresh = rl.Loader("tiny", endpoint=daemon.endpoint, rank=r, world_size=3, batch_size=8,
                          **OPTS)
        fresh.load_state_dict(json.loads(json.dumps(again)))
        fresh.set_epoch(0)  # the loaded epoch: keeps the loaded position
        three.append(fresh)
    finish(three, served)
    check_exactly_once(served, reference, set(range(TINY_COUNT)), max_repeats=2)


def test_another_seed_or_transform_is_refused_naming_it(daemon):
    state = take(loaders(daemon, 2, 8), Served(), 1)[0]
    for option, value, match in [("seed", 4, "seed=3.*seed=4"),
                                 ("image_size", 64, "image_size=32.*image_size=64"),
                                 ("augment", "eval", "augment=train.*augment=eval")]:
        opts = {**OPTS, option: value}
        loader = rl.Loader("tiny", endpoint=daemon.endpoint, rank=0, world_size=3, **opts)
        with pytest.raises(rl.InvalidArgument, match=match):
            loader.load_state_dict(state)


def test_a_corrupt_sample_skipped_on_one_rank_all_states_combined_resume_exactly(tmp_path):
    data = make_dataset(tmp_path / "data", 40, 4, seed=5)
    with rl.Daemon(datasets={"d": data}, memory_limit="1GiB") as daemon:
        # Epoch 0's order, from one batch of everything: rank 0 of 2 reads positions 0, 2, ...
        whole = rl.Loader("d", endpoint=daemon.endpoint, batch_size=40, **OPTS)
        first = next(iter(whole))
        broken = [int(first["indices"][p]) for p in (0, 2)]
        broken_paths = [first.paths[p] for p in (0, 2)]
        del first, whole
        reference = Served()
        finish(loaders(daemon, 1, 4, dataset="d"), reference)
        for path in broken_paths:
            Path(data, path).write_bytes(b"not a jpeg")
        good = set(range(40)) - set(broken)

        served = Served()
        states = take(loaders(daemon, 2, 4, dataset="d"), served, 3)
        # Rank 0's state alone cannot know what rank 1 skipped: it warns.
        alone = rl.Loader("d", endpoint=daemon.endpoint, rank=0, world_size=3, batch_size=4,
                          **OPTS)
        with pytest.warns(rl.ResumeWarning, match="skipped 2 bad sample"):
            alone.load_state_dict(states[0])
        alone.close()
        with pytest.raises(rl.InvalidArgument, match="needs 2 states, got 1"):
            rl.combine_states(states[:1])
        job = rl.combine_states(list(reversed(states)))
        with warnings.catch_warnings():
            warnings.simplefilter("error", rl.ResumeWarning)
            three = loaders(daemon, 3, 4, state=job, dataset="d")
        finish(three, served)
        check_exactly_once(served, reference, good, max_repeats=2)
