# SPDX-License-Identifier: Apache-2.0
"""Issue 18: an ImageFolder tree as torchvision's ImageFolder sees it: every image format it
lists (PNG, WebP, BMP, PPM/PGM besides JPEG, chosen by content), the same samples in the same
order with the same labels, ignored files named, empty classes refused."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest
import torchvision
from PIL import Image

import ringloader as rl
from conftest import ctl


def picture(seed: int, size: Tuple[int, int] = (40, 30), mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def make_mixed_folder(root: Path) -> Path:
    """Classes of every kind torchvision lists, plus files it does not."""
    files = {
        "apfel/a.jpg": ("JPEG", picture(1)),
        "apfel/b.PNG": ("PNG", picture(2, mode="RGBA")),
        "apfel/nested/c.jpeg": ("JPEG", picture(3)),
        "apfel/.hidden.png": ("PNG", picture(4, mode="L")),
        "birne/only.png": ("PNG", picture(5, mode="LA")),
        "birne/palette.png": ("PNG", picture(6).convert("P", palette=Image.ADAPTIVE)),
        "dattel/x.webp": ("WEBP", picture(7)),
        "dattel/y.WebP": ("WEBP", picture(8, mode="RGBA")),
        "feige/z.bmp": ("BMP", picture(9)),
        "feige/p.ppm": ("PPM", picture(10)),
        "feige/g.pgm": ("PPM", picture(11, mode="L")),
        "feige/png_named.jpg": ("PNG", picture(12)),  # ImageNet has one of these
        "feige/scan.tiff": ("TIFF", picture(13)),    # listed; no TIFF decoder: fails, counted
    }
    for name, (fmt, im) in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        im.save(path, format=fmt)
    (root / "dattel/README.txt").write_text("not an image\n")
    (root / "feige/notes.md").write_text("neither\n")
    return root


def delivered(endpoint: str, dataset: str, out: Path) -> List[List[str]]:
    ctl("--endpoint", endpoint, "consume", "--dataset", dataset, "--no-shuffle", "--batch-size",
        "4", "--image-size", "16", "--samples-out", str(out))
    return [line.split("\t") for line in out.read_text().splitlines()]


def test_the_sample_list_is_torchvisions_imagefolder(tmp_path: Path) -> None:
    root = make_mixed_folder(tmp_path / "mixed")
    reference = torchvision.datasets.ImageFolder(str(root))
    expected = [(os.path.relpath(path, root), label) for path, label in reference.samples]
    with rl.Daemon(datasets={"mixed": root}) as d:
        lines = delivered(d.endpoint, "mixed", tmp_path / "samples.tsv")
        stats = ctl("--endpoint", d.endpoint, "stats").stdout
        log = d.log()
    # samples-out: epoch, sequence, sample_index, label, relative_path, digest.
    got = {int(index): (path, int(label)) for _, _, index, label, path, _ in lines}
    tiff = {i for i, (path, _) in enumerate(expected) if path.endswith(".tiff")}
    assert len(expected) == 13 and len(tiff) == 1
    # Every sample but the TIFF, each at torchvision's index with torchvision's label.
    assert sorted(got) == [i for i in range(len(expected)) if i not in tiff]
    for index, sample in got.items():
        assert sample == expected[index]
    assert reference.classes == ["apfel", "birne", "dattel", "feige"]
    # What was not listed is said, and so is the file no decoder reads.
    assert "ignored 2 files without an image extension, e.g. dattel/README.txt" in stats
    assert "ignored 2 files without an image extension" in log
    assert "unsupported 1" in stats and "scan.tiff" in stats


def test_validate_counts_formats_by_content_and_names_what_it_ignored(tmp_path: Path) -> None:
    root = make_mixed_folder(tmp_path / "mixed")
    out = ctl("validate", "--path", str(root), check=False)
    assert out.returncode == 1, out.stdout + out.stderr  # the TIFF
    assert "BAD feige/scan.tiff: unsupported: TIFF images are not decoded" in out.stdout
    assert "checked 13 files: 12 good, 1 bad (unsupported: 1)" in out.stdout
    # By content: the PNG named .jpg is a png.
    assert "formats: bmp 1, jpeg 2, png 5, pnm 2, tiff 1, webp 2" in out.stdout
    assert "ignored 2 files without an image extension, e.g. dattel/README.txt" in out.stdout


def test_a_class_folder_without_images_stops_the_start_naming_it(tmp_path: Path) -> None:
    root = make_mixed_folder(tmp_path / "mixed")
    (root / "leer").mkdir()
    (root / "leer/README.txt").write_text("nothing here yet\n")
    with pytest.raises(FileNotFoundError):  # torchvision refuses it too
        torchvision.datasets.ImageFolder(str(root))
    with pytest.raises(rl.Error, match="no file with an image extension in the class folder leer"):
        rl.Daemon(datasets={"mixed": root}, startup_timeout=30)


def test_the_same_pixels_in_every_format_make_the_same_batch(tmp_path: Path) -> None:
    # One picture, stored losslessly as PNG, WebP, BMP and PPM (and JPEG as the PIL-eval check):
    # decoded by four libraries, every copy must come out of the shared crop and resize path with
    # the same bytes, close to torchvision's own eval transform of the PIL image.
    root = tmp_path / "same"
    original = picture(20, size=(48, 40))
    for name, fmt, kwargs in [("a/pic.png", "PNG", {}), ("b/pic.webp", "WEBP", {"lossless": True}),
                              ("c/pic.bmp", "BMP", {}), ("d/pic.ppm", "PPM", {})]:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        original.save(path, format=fmt, **kwargs)
    with rl.Daemon(datasets={"same": root}) as d:
        loader = rl.Loader("same", endpoint=d.endpoint, batch_size=4, image_size=32,
                           augment="eval", shuffle=False, output="numpy")
        batch = next(iter(loader))
        images = np.array(batch["images"])
        assert list(np.array(batch["labels"])) == [0, 1, 2, 3]
    for k in range(1, 4):
        assert np.array_equal(images[k], images[0])
    import torchvision.transforms as T
    reference = np.asarray(T.Compose([T.Resize(36), T.CenterCrop(32)])(original), dtype=np.int16)
    assert np.abs(images[0].astype(np.int16) - reference).mean() < 3.0


def test_loader_peek_is_the_sheet_ringloaderctl_peek_writes_and_the_batch_a_trainer_gets(
        tiny_dataset: Path, tmp_path: Path) -> None:
    with rl.Daemon(datasets={"tiny": tiny_dataset}) as d:
        loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=6, image_size=32, seed=4,
                           output="numpy")
        sheet = loader.peek(epoch=1, batch=2, columns=4)
        assert loader.epoch == 0  # the loader itself did not move
        out = tmp_path / "sheet.png"
        ctl("--endpoint", d.endpoint, "peek", "--dataset", "tiny", "--epoch", "1", "--batch", "2",
            "--seed", "4", "--batch-size", "6", "--image-size", "32", "--columns", "4",
            "--out", str(out))
        assert np.array_equal(sheet, np.asarray(Image.open(out).convert("RGB")))
        loader.set_epoch(1)
        batches = iter(loader)
        for _ in range(3):
            batch = next(batches)
        images = np.array(batch["images"])
        assert sheet.shape == (64, 128, 3)
        for k in range(6):
            y, x = (k // 4) * 32, (k % 4) * 32
            assert np.array_equal(sheet[y:y + 32, x:x + 32], images[k])
        assert not sheet[32:, 64:].any()  # tiles 6 and 7: no sample
        legend = (tmp_path / "sheet.tsv").read_text().splitlines()
        assert legend[1].split("\t")[1] == str(int(batch["indices"][0]))
        with pytest.raises(rl.InvalidArgument, match="there is no batch 99"):
            loader.peek(batch=99)
