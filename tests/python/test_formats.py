"""Issue 11 from Python: WebDataset shards and .npy arrays, and batches as Mappings of every
named tensor, read from a real daemon through the installed package."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import ringloader as rl

from conftest import ctl

COUNT = 30


@pytest.fixture(scope="module")
def shards_and_arrays(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("formats")
    for fmt in ("imagefolder", "webdataset", "arrays"):
        ctl("make-dataset", "--out", str(root / fmt), "--count", str(COUNT), "--classes", "3",
            "--format", fmt, "--shard-size", "8")
    datasets = {
        "folder": root / "imagefolder",
        "shards": {"format": "webdataset", "path": str(root / "webdataset" / "shard-*.tar")},
        "arrays": {"format": "arrays", "path": str(root / "arrays"), "label": "labels"},
    }
    with rl.Daemon(datasets=datasets, memory_limit="1GiB", ring_slots=4) as d:
        yield d


def test_a_webdataset_batch_is_a_mapping_of_every_tensor(shards_and_arrays: rl.Daemon) -> None:
    loader = rl.Loader("shards", batch_size=7, image_size=32, augment="eval", shuffle=False,
                       endpoint=shards_and_arrays.endpoint)
    seen = []
    for batch in loader:
        assert isinstance(batch, Mapping)
        assert list(batch) == ["images", "labels", "indices", "depth"]
        assert len(batch) == 4 and "depth" in batch and "nope" not in batch
        depth = batch["depth"]
        assert tuple(depth.shape) == (batch.size, 8, 8)
        indices = batch["indices"].numpy()
        # make-dataset's depth: value (y, x) = i % 97 + 0.01 y + 0.001 x
        expected = (indices % 97)[:, None, None] + 0.01 * np.arange(8)[None, :, None] \
            + 0.001 * np.arange(8)[None, None, :]
        np.testing.assert_allclose(depth.numpy(), expected, rtol=1e-6)
        assert batch.paths[0].startswith("shard-") and "#class_" in batch.paths[0]
        with pytest.raises(KeyError, match="'images', 'labels', 'indices', 'depth'"):
            batch["nope"]
        seen.extend(indices.tolist())
    assert sorted(seen) == list(range(COUNT))
    loader.close()


def test_an_arrays_batch_has_each_npy_and_no_decoded_images(shards_and_arrays: rl.Daemon) -> None:
    arrays = rl.Loader("arrays", batch_size=8, image_size=32, augment="eval", output="numpy",
                       endpoint=shards_and_arrays.endpoint)
    folder = rl.Loader("folder", batch_size=8, image_size=32, augment="eval", output="numpy",
                       endpoint=shards_and_arrays.endpoint)
    for rows, images in zip(arrays, folder):
        assert dict(rows).keys() == {"labels", "indices", "depth", "images"}
        assert rows["depth"].dtype == np.float32
        # Its images column is make-dataset's eval decode at 32 px: the daemon's own output.
        np.testing.assert_array_equal(rows["images"], images["images"])
        np.testing.assert_array_equal(rows["labels"], images["labels"])
    arrays.close()
    folder.close()
