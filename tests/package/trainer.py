# SPDX-License-Identifier: Apache-2.0
"""A trainer inside the package test's Debian root (tests/package/install_test).

Reads EPOCHS epochs of DATASET through the installed ringloader package and writes one line per
batch to OUT: the epoch, the sample indices and a CRC-32 of the images' bytes. With --pause-after
N it writes "paused" to --status after N batches and waits (holding no batch) until the --go file
exists: the test upgrades the packages meanwhile, and the daemon restarts under it; the trainer
then says how many reconnects its stream made.
"""
import argparse
import os
import time
import zlib

import ringloader as rl


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pause-after", type=int, default=-1)
    parser.add_argument("--status")
    parser.add_argument("--go")
    args = parser.parse_args()
    loader = rl.Loader(args.dataset, batch_size=8, image_size=32, seed=7, output="numpy",
                       reconnect_deadline=120.0)
    done = 0
    reconnects_after_pause = None
    with open(args.out, "w") as out:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                indices = ",".join(str(i) for i in batch["indices"].tolist())
                crc = zlib.crc32(batch["images"].tobytes())
                out.write(f"{epoch} {indices} {crc:08x}\n")
                out.flush()
                del batch
                done += 1
                if done == args.pause_after + 1:  # the first batch after the pause
                    reconnects_after_pause = loader.stats["reconnects"]
                if done == args.pause_after:
                    with open(args.status, "w") as status:
                        status.write(f"paused {rl.__version__}\n")
                    while not os.path.exists(args.go):
                        time.sleep(0.05)
    print(f"trainer: {done} batches, ringloader {rl.__version__}")
    if reconnects_after_pause is not None:
        print(f"trainer: reconnects after the pause: {reconnects_after_pause}")


if __name__ == "__main__":
    main()
