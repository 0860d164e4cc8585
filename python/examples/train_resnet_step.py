#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real PyTorch training loop fed by ringloader: torchvision's resnet18, SGD on the CPU,
checkpointing the model, the optimiser and the loader, and resuming from the checkpoint.

    RINGLOADER_ENDPOINT=unix:/run/ringloader/ringloader.sock \\
        python3 python/examples/train_resnet_step.py --dataset imagenet-train --steps 20

Run it twice with the same --checkpoint: the second run continues with exactly the batch after
the last one the first run trained on.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
import torchvision

import ringloader as rl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a [[datasets]] name of the daemon")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--checkpoint", default="resnet18-ringloader.pt")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # float32, NCHW, normalised with ImageNet's mean and std: what torchvision models expect.
    loader = rl.Loader(args.dataset, batch_size=args.batch_size, image_size=args.image_size,
                       dtype="float32", layout="NCHW", augment="train")

    if os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        print(f"resumed at epoch {ckpt['loader']['epoch']} sequence {ckpt['loader']['sequence']}")

    model.train()
    step = 0
    started = time.monotonic()
    loader_state = loader.state_dict()
    while step < args.steps:
        for batch in loader:
            images, labels = batch["images"], batch["labels"]
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"step {step} epoch {batch.position['epoch']} loss {loss.item():.3f} "
                  f"({images.shape[0] * step / (time.monotonic() - started):.1f} images/s)",
                  flush=True)
            # Taken inside the loop, after the batch: a resumed run continues with the next one.
            # (After a `break` the loader's state is the whole pass the next `for` would run
            # again, as a DataLoader's next `for` would.)
            loader_state = loader.state_dict()
            if step == args.steps:
                break
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "loader": loader_state}, args.checkpoint)
    print(f"saved {args.checkpoint}")


if __name__ == "__main__":
    main()
