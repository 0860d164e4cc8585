#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A Python trainer for the soak (tests/soak/soak.py): rl.Loader as a training loop uses it.

Writes one line per sample it takes, in the format of `ringloaderctl consume --samples-out`
(epoch, sequence, index, label, path "-", XXH64 of the sample's image bytes), and saves its
state after every batch (the loader's state_dict and how many bytes of the samples file it
covers), so a SIGKILLed trainer restarted with the same arguments resumes exactly: lines written
after the last saved state are cut off first, as `consume --state` does.

Habits, each optional: --hold K keeps the last K batches alive (as a trainer that accumulates
gradients over several batches), --pause-after N sleeps --pause-s once after N batches, and
--resize-after N continues from then on with --resize-batch-size (an elastic restart's new batch
size, through load_state_dict). --step-ms is the compute time per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import xxhash

import ringloader as rl


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--dtype", default="uint8")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--samples-out", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--hold", type=int, default=0)
    p.add_argument("--pause-after", type=int, default=-1)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--resize-after", type=int, default=-1)
    p.add_argument("--resize-batch-size", type=int, default=0)
    p.add_argument("--step-ms", type=float, default=0.0)
    p.add_argument("--name", default="python trainer")
    a = p.parse_args()

    def loader_of(batch_size: int) -> rl.Loader:
        return rl.Loader(a.dataset, endpoint=a.endpoint, batch_size=batch_size,
                         image_size=a.image_size, dtype=a.dtype, seed=a.seed, output="numpy",
                         reconnect_deadline=300, client_name=a.name)

    state_path = Path(a.state)
    saved = json.loads(state_path.read_text()) if state_path.exists() else None
    batch_size = saved["batch_size"] if saved else a.batch_size
    taken = saved["taken"] if saved else 0
    keep_bytes = saved["samples_bytes"] if saved else 0
    loader = loader_of(batch_size)
    if saved:
        loader.load_state_dict(saved["loader"])
    out = open(a.samples_out, "ab")
    out.truncate(keep_bytes)  # lines past the saved state are delivered again
    out.seek(keep_bytes)

    def save() -> None:
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"loader": loader.state_dict(), "batch_size": batch_size,
                                   "taken": taken, "samples_bytes": out.tell()}))
        os.replace(tmp, state_path)

    held = []
    paused = False
    while loader.epoch < a.epochs:
        for batch in loader:
            images = np.asarray(batch["images"])
            lines = []
            for k, (index, label) in enumerate(zip(batch["indices"], batch["labels"])):
                digest = xxhash.xxh64(images[k].tobytes()).hexdigest()
                pos = batch.position
                lines.append(f"{pos['epoch']}\t{pos['sequence']}\t{int(index)}\t{int(label)}\t-\t"
                             f"{digest}\n")
            out.write("".join(lines).encode())
            out.flush()
            taken += 1
            save()  # after the lines: a state never covers lines that are not in the file
            if a.hold:
                held.append(batch)
                del held[:-a.hold]
            del batch, images
            if a.step_ms:
                time.sleep(a.step_ms / 1000)
            if taken == a.pause_after and not paused:
                paused = True
                time.sleep(a.pause_s)
            if taken == a.resize_after and batch_size != a.resize_batch_size:
                # An elastic restart mid-epoch: the same job at another batch size.
                state = loader.state_dict()
                held.clear()
                loader.close()
                batch_size = a.resize_batch_size
                loader = loader_of(batch_size)
                loader.load_state_dict(state)
                save()
                break  # the new loader's iter() goes on where the old one stopped
    held.clear()
    loader.close()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
