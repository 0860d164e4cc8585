#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PNG and WebP decode-to-224 through ringloader's pipeline against Pillow on the same files and
cores (issue 18, item 4).

    /usr/bin/python3 bench/format_compare.py [--count 400] [--size 500x375] [--repeats 3]

For each format the same generated photo-like images (an ImageFolder of 4 classes) are read by
  Pillow:     Image.open(path).convert("RGB") + torchvision's RandomResizedCrop(224) +
              RandomHorizontalFlip, in one process per core (a torch DataLoader's workers do
              the same work);
  ringloader: a private daemon with decode_threads = cores, one rl.Loader (numpy output) reading
              a whole epoch (RandomResizedCrop 224 + flip, uint8 NHWC).
Prints images/s of each, best of --repeats, and the ratio. Goal: >= 1.5x. Figures only, never
pass/fail.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path
from typing import List

import numpy as np
from PIL import Image
from torchvision import transforms

import ringloader as rl


def photo(seed: int, width: int, height: int) -> Image.Image:
    """Smooth shapes and texture: compresses like a photo, not like noise or a flat fill."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        for _ in range(4):
            fx, fy, ph = rng.uniform(0.002, 0.03, 2).tolist() + [rng.uniform(0, 6.3)]
            img[..., c] += np.sin(x * fx + y * fy + ph) * rng.uniform(20, 60)
    img += 128 + rng.normal(0, 6, img.shape)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8))


def make_folder(root: Path, fmt: str, count: int, size: tuple) -> List[str]:
    paths = []
    for i in range(count):
        path = root / f"class_{i % 4}" / f"img_{i:05d}.{fmt.lower()}"
        path.parent.mkdir(parents=True, exist_ok=True)
        kwargs = {"quality": 90} if fmt == "WEBP" else {}
        photo(i, *size).save(path, format=fmt, **kwargs)
        paths.append(str(path))
    return paths


_pil_transform = transforms.Compose([transforms.RandomResizedCrop(224),
                                     transforms.RandomHorizontalFlip()])


def pil_one(path: str) -> int:
    image = _pil_transform(Image.open(path).convert("RGB"))
    return np.asarray(image).shape[0]


def pil_rate(paths: List[str], cores: int) -> float:
    with Pool(cores) as pool:
        pool.map(pil_one, paths[:cores * 2])  # warm the workers
        start = time.perf_counter()
        pool.map(pil_one, paths, chunksize=8)
        return len(paths) / (time.perf_counter() - start)


def ringloader_rate(root: Path, cores: int, repeats: int) -> float:
    best = 0.0
    with rl.Daemon(datasets={"bench": root}, decode_threads=cores) as d:
        loader = rl.Loader("bench", endpoint=d.endpoint, batch_size=32, image_size=224,
                           output="numpy")
        next(iter(loader))  # warm: stream open, first batches
        for epoch in range(1, repeats + 1):
            loader.set_epoch(epoch)
            start = time.perf_counter()
            seen = sum(len(b["labels"]) for b in loader)
            best = max(best, seen / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--size", default="500x375", help="WIDTHxHEIGHT of each image")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    cores = len(os.sched_getaffinity(0))
    print(f"{args.count} images of {size[0]}x{size[1]} per format, decode to 224 "
          f"(RandomResizedCrop + flip), {cores} cores")
    with tempfile.TemporaryDirectory(prefix="rl-formats-") as tmp:
        for fmt in ("PNG", "WEBP"):
            root = Path(tmp) / fmt.lower()
            paths = make_folder(root, fmt, args.count, size)
            mib = sum(os.path.getsize(p) for p in paths) / (1 << 20)
            pil = max(pil_rate(paths, cores) for _ in range(args.repeats))
            ours = ringloader_rate(root, cores, args.repeats)
            print(f"{fmt:5s} ({mib:6.1f} MiB): Pillow + torchvision {pil:7.1f} images/s, "
                  f"ringloader {ours:7.1f} images/s: {ours / pil:.2f}x")


if __name__ == "__main__":
    main()
