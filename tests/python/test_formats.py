# SPDX-License-Identifier: Apache-2.0
"""Issue 11 from Python: WebDataset shards and .npy arrays, and batches as Mappings of every
named tensor, read from a real daemon through the installed package."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import ringloader as rl

from conftest import ctl, make_dataset

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


# ---- issue 27: a dataset file never takes a name the batch already uses ----

def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def write_shard(path: Path, members) -> None:
    """A tar shard of (name, bytes) members, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_json_label_is_exactly_the_files_integer_or_the_sample_fails(tmp_path: Path) -> None:
    """label_key = "json:label" reads the top-level integer with a real JSON parser: a float, an
    exponent, a nested "label", trailing junk or a number beyond int64 fail their own sample
    (reason corrupt), never become another label."""
    jpgs = sorted(make_dataset(tmp_path / "src", 10, 2).rglob("*.jpg"))
    deep = "[" * 100_000 + "]" * 100_000
    labels = [  # (the .json member, the label it must give, or None: that sample fails)
        (b'{"label": 3}', 3),
        (b'{"meta": {"label": 9}, "label": 2}', 2),
        (b' {"label" : -4 , "x": "label: 7"} ', -4),
        (('{"x": %s, "label": 5}' % deep).encode(), 5),
        (b'{"label": 3.7}', None),
        (b'{"label": 1e3}', None),
        (b'{"meta": {"label": 9}}', None),
        (b'{"label": 12abc}', None),
        (b'{"label": 9223372036854775808}', None),
        (b'[{"label": 1}]', None),
    ]
    write_shard(tmp_path / "shards" / "shard-0.tar", [
        member for i, (jpg, (text, _)) in enumerate(zip(jpgs, labels)) for member in (
            (f"s{i:02d}.jpg", jpg.read_bytes()), (f"s{i:02d}.json", text))])
    with rl.Daemon(datasets={"j": {"format": "webdataset", "path": str(tmp_path / "shards"),
                                   "label_key": "json:label"}}, memory_limit="1GiB") as d:
        loader = rl.Loader("j", endpoint=d.endpoint, batch_size=2, image_size=32,
                           augment="eval", shuffle=False, output="numpy")
        got = {int(i): int(label) for b in loader for i, label in zip(b["indices"], b["labels"])}
        stats = d.stats()
    assert got == {i: label for i, (_, label) in enumerate(labels) if label is not None}
    # (The ring reads ahead into later epochs, so the counters may have seen them again.)
    bad = {(f["path"], f["reason"]) for f in stats["recent_bad_files"]}
    assert bad == {(f"shard-0.tar#s{i:02d}", "corrupt")
                   for i, (_, label) in enumerate(labels) if label is None}
    assert set(stats["decode_errors_by_reason"]) == {"corrupt"}


def npy_header_claiming(shape: tuple, descr: str = "|u1") -> bytes:
    """A .npy that is only a header: it claims `shape` and holds no data."""
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    text += " " * (63 - (10 + len(text)) % 64) + "\n"  # numpy pads the header to 64 bytes
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


def test_a_webdataset_member_named_like_a_batch_tensor_is_not_served(tmp_path: Path) -> None:
    """KEY.images.npy would have been written over the batch's images (a heap overflow in the
    daemon); it is left out, the shard's problem names it, and every sample still comes."""
    jpgs = sorted(make_dataset(tmp_path / "src", 6, 2).rglob("*.jpg"))
    shards = tmp_path / "shards"
    write_shard(shards / "shard-0.tar", [
        member for i, jpg in enumerate(jpgs) for member in (
            (f"s{i:02d}.jpg", jpg.read_bytes()),
            (f"s{i:02d}.cls", str(i % 2).encode()),
            (f"s{i:02d}.images.npy", npy_bytes(np.ones((64, 64, 3)))),
            (f"s{i:02d}.depth.npy", npy_bytes(np.full((2, 2), i, np.float32))))])
    with rl.Daemon(datasets={"shards": {"format": "webdataset", "path": str(shards)}},
                   memory_limit="1GiB") as d:
        loader = rl.Loader("shards", endpoint=d.endpoint, batch_size=3, image_size=32,
                           augment="eval", shuffle=False, output="numpy")
        batches = list(loader)
        assert [list(b) for b in batches] == [["images", "labels", "indices", "depth"]] * 2
        assert batches[0]["images"].dtype == np.uint8
        assert batches[0]["images"].shape == (3, 32, 32, 3)
        assert [int(b["depth"][k, 0, 0]) for b in batches for k in range(3)] == list(range(6))
        assert "s00.images.npy" in d.log() and "batch's own images" in d.log()
        loader.close()


def test_an_arrays_labels_npy_is_the_label_column_and_clashes_with_another_one(
        tmp_path: Path) -> None:
    root = tmp_path / "cols"
    root.mkdir()
    np.save(root / "labels.npy", np.arange(4))
    np.save(root / "y.npy", np.arange(4))
    np.save(root / "x.npy", np.zeros((4, 2), np.float32))
    # Another label column: labels.npy would be a second "labels" tensor.
    with pytest.raises(rl.Error, match=r"labels\.npy.*set label = \"labels\""):
        rl.Daemon(datasets={"cols": {"format": "arrays", "path": str(root), "label": "y"}},
                  startup_timeout=30)
    # Without `label`, labels.npy is the label column, as make-dataset writes it.
    (root / "y.npy").unlink()
    with rl.Daemon(datasets={"cols": {"format": "arrays", "path": str(root)}},
                   memory_limit="1GiB") as d:
        batch = next(iter(rl.Loader("cols", endpoint=d.endpoint, batch_size=4, image_size=8,
                                    shuffle=False, output="numpy")))
        assert batch["labels"].tolist() == [0, 1, 2, 3] and list(batch) == [
            "labels", "indices", "x"]


def test_the_arrays_dataset_make_dataset_writes_serves_its_images_column_as_written(
        tmp_path: Path) -> None:
    """Its images.npy is [N, 16, 16, 3]: a column like any other, not checked as decoded images."""
    ctl("make-dataset", "--out", str(tmp_path / "arr"), "--count", "6", "--classes", "3",
        "--format", "arrays", "--image-size", "16")
    with rl.Daemon(datasets={"arr": {"format": "arrays", "path": str(tmp_path / "arr")}},
                   memory_limit="1GiB") as d:
        batch = next(iter(rl.Loader("arr", endpoint=d.endpoint, batch_size=6, shuffle=False,
                                    output="numpy")))
        assert batch["images"].shape == (6, 16, 16, 3)
        assert np.array_equal(batch["images"], np.load(tmp_path / "arr" / "images.npy"))
        assert batch["labels"].tolist() == np.load(tmp_path / "arr" / "labels.npy").tolist()


def test_an_npy_claiming_a_trillion_empty_rows_is_refused_by_daemon_and_validate(
        tmp_path: Path) -> None:
    """128 bytes claiming shape (10**12, 0): indexing would have allocated without limit."""
    root = tmp_path / "empty-rows"
    root.mkdir()
    (root / "x.npy").write_bytes(npy_header_claiming((10**12, 0)))
    assert (root / "x.npy").stat().st_size == 128
    with pytest.raises(rl.Error, match=r"x\.npy.*rows of 0 bytes"):
        rl.Daemon(datasets={"e": {"format": "arrays", "path": str(root)}}, startup_timeout=30)
    out = ctl("validate", "--format", "arrays", "--path", str(root), check=False)
    assert out.returncode != 0
    assert "rows of 0 bytes" in out.stdout + out.stderr


def shard_samples(tmp_path: Path, count: int, extra) -> Path:
    """Shards of `count` JPEG samples (label i % 2), each with the members extra(i) gives."""
    jpgs = sorted(make_dataset(tmp_path / "src", count, 2).rglob("*.jpg"))
    shards = tmp_path / "shards"
    write_shard(shards / "shard-0.tar", [
        member for i, jpg in enumerate(jpgs) for member in (
            (f"s{i:02d}.jpg", jpg.read_bytes()), (f"s{i:02d}.cls", str(i % 2).encode()),
            *extra(i))])
    return shards


def served(d: rl.Daemon, name: str, **options) -> dict:
    loader = rl.Loader(name, endpoint=d.endpoint, batch_size=4, image_size=16, augment="eval",
                       shuffle=False, output="numpy", **options)
    out = {}
    for batch in loader:
        for k, i in enumerate(batch["indices"].tolist()):
            out[i] = {t: np.array(batch[t][k]) for t in batch if t != "images"}
    loader.close()
    return out


def test_one_odd_tensor_shape_costs_its_own_sample_not_the_other_twenty(tmp_path: Path) -> None:
    """Twenty depth.npy of [8, 8] and one of [9, 9], the odd one first: the batch's shape is the
    majority's, the odd sample alone fails (named at start with both shapes), in the daemon and
    in validate."""
    shards = shard_samples(tmp_path, 21, lambda i: [(
        f"s{i:02d}.depth.npy", npy_bytes(np.full((9, 9) if i == 0 else (8, 8), i, np.float32)))])
    with rl.Daemon(datasets={"w": {"format": "webdataset", "path": str(shards)}},
                   memory_limit="1GiB") as d:
        got = served(d, "w")
        log = d.log()
        stats = d.stats()
    assert sorted(got) == list(range(1, 21))
    assert all(v["depth"].shape == (8, 8) and v["depth"][0, 0] == i for i, v in got.items())
    assert "shard-0.tar#s00.depth.npy is float32 [9, 9] but 20 of 21 samples' 'depth' are " \
           "float32 [8, 8]" in log
    assert {(f["path"], f["reason"]) for f in stats["recent_bad_files"]} == {
        ("shard-0.tar#s00", "corrupt")}
    out = ctl("validate", "--format", "webdataset", "--path", str(shards), check=False)
    assert out.returncode == 1
    assert "20 good, 1 bad" in out.stdout and "float32 [9, 9] but 20 of 21" in out.stdout


def test_a_scalar_npy_member_is_served_as_one_number_per_sample(tmp_path: Path) -> None:
    """np.save(f, np.float32(x)) once vanished from batches without a word."""
    shards = shard_samples(tmp_path, 6, lambda i: [
        (f"s{i:02d}.score.npy", npy_bytes(np.float32(i / 4))),
        (f"s{i:02d}.id.npy", npy_bytes(np.int64(1000 + i)))])
    with rl.Daemon(datasets={"w": {"format": "webdataset", "path": str(shards)}},
                   memory_limit="1GiB") as d:
        loader = rl.Loader("w", endpoint=d.endpoint, batch_size=3, image_size=16,
                           augment="eval", shuffle=False, output="numpy")
        batch = next(iter(loader))
        assert list(batch) == ["images", "labels", "indices", "id", "score"]
        assert batch["score"].shape == (3,) and batch["score"].dtype == np.float32
        assert batch["score"].tolist() == [0.0, 0.25, 0.5]
        assert batch["id"].tolist() == [1000, 1001, 1002]
        loader.close()


def test_one_huge_ragged_sample_is_named_at_start_and_a_cap_bounds_every_batch(
        tmp_path: Path) -> None:
    """One sample with 300,000 boxes among ones with 3: a warning names it and its cost; with
    ragged_max_rows it alone fails (too_large) and every batch pads to the cap."""
    shards = shard_samples(tmp_path, 8, lambda i: [(
        f"s{i:02d}.boxes.npy",
        npy_bytes(np.full((300_000 if i == 5 else 3, 4), i, np.float32)))])
    spec = {"format": "webdataset", "path": str(shards), "ragged": ["boxes"]}
    with rl.Daemon(datasets={"w": spec}, memory_limit="1GiB") as d:
        log = d.log()
    assert "ragged tensor 'boxes': every sample is padded to 300000 rows (4800000 bytes per " \
           "sample in every batch) because of shard-0.tar#s05" in log
    assert "half the samples have at most 3 rows" in log and "ragged_max_rows" in log
    with rl.Daemon(datasets={"w": {**spec, "ragged_max_rows": 16}}, memory_limit="1GiB") as d:
        got = served(d, "w")
        log = d.log()
        stats = d.stats()
    assert sorted(got) == [0, 1, 2, 3, 4, 6, 7]
    assert all(v["boxes"].shape == (16, 4) and v["boxes_lengths"] == 3 for v in got.values())
    assert "1 samples have more than ragged_max_rows = 16 rows" in log
    assert {(f["path"], f["reason"]) for f in stats["recent_bad_files"]} == {
        ("shard-0.tar#s05", "too_large")}


def test_a_huge_member_in_an_intact_shard_costs_its_sample_not_the_rest_of_the_shard(
        tmp_path: Path) -> None:
    """A 1.5 GiB image member (a sparse file: nothing is written) once stopped the index of its
    shard (above the 1 GiB record limit): now that sample alone fails too_large (above
    max_file_bytes) and the members after it are all served."""
    jpgs = sorted(make_dataset(tmp_path / "src", 6, 2).rglob("*.jpg"))
    huge = 3 << 29
    shard = tmp_path / "shards" / "shard-0.tar"
    shard.parent.mkdir()
    with open(shard, "wb") as f:
        for i, jpg in enumerate(jpgs):
            for name, data in ((f"s{i:02d}.jpg", jpg.read_bytes()),
                               (f"s{i:02d}.cls", str(i % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = huge if (i, name[-3:]) == (1, "jpg") else len(data)
                f.write(info.tobuf(format=tarfile.GNU_FORMAT))
                if info.size == huge:
                    f.seek(huge, io.SEEK_CUR)
                else:
                    f.write(data + b"\0" * (-len(data) % 512))
        f.write(b"\0" * 1024)
    assert shard.stat().st_size > huge
    with rl.Daemon(datasets={"w": {"format": "webdataset", "path": str(shard.parent)}},
                   memory_limit="1GiB") as d:
        got = served(d, "w")
        stats = d.stats()
    assert sorted(got) == [0, 2, 3, 4, 5]
    assert {(f["path"], f["reason"]) for f in stats["recent_bad_files"]} == {
        ("shard-0.tar#s01", "too_large")}
    assert stats["datasets"][0]["samples"] == 6


def test_indexing_is_bounded_by_memory_limit(tmp_path: Path) -> None:
    """An arrays column of 10^9 one-byte rows (a sparse 1 GB file: nothing written) once made
    indexing allocate ~26 GB for the sample list; the index's growth is drawn from memory_limit,
    so the start fails with the numbers instead."""
    root = tmp_path / "huge"
    root.mkdir()
    header = npy_header_claiming((10**9,))
    with open(root / "x.npy", "wb") as f:
        f.write(header)
        f.truncate(len(header) + 10**9)
    with pytest.raises(rl.Error, match=r"dataset 'huge': indexing \(its sample list growing "
                                       r"to \d+ bytes\) needs .*memory_limit 256 MiB"):
        rl.Daemon(datasets={"huge": {"format": "arrays", "path": str(root)}},
                  memory_limit="256MiB", startup_timeout=60)
