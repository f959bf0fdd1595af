#!/usr/bin/env python3
"""torchvision's classification reference recipe, fed by stokerd with the Compose unchanged.

    pip install ./python torch torchvision
    python examples/torchvision_reference.py /path/to/imagefolder --steps 20

The recipe of torchvision's references/classification (presets.py with
`auto_augment="ta_wide"`, `random_erase=0.1`; train.py's MixUp / CutMix choice):
RandomResizedCrop(176), RandomHorizontalFlip, TrivialAugmentWide, PILToTensor, ToDtype,
Normalize, RandomErasing(0.1), and MixUp(0.2) or CutMix(1.0) on each batch. The Compose is
the one a torchvision Dataset would take; `stoker.Loader(transform=..., batch_transform=...)`
translates it into stoker's pipeline spec (docs/python.md, "Keep your torchvision code") and
the daemon runs it. A small convolutional network trains on the batches for a few steps with
the soft labels MixUp / CutMix give.

`--no-mix` leaves the batch mix out (the labels are then class indices). The batch mix is
served by the CPU backend (docs/augment.md, section 7); `device="cuda"` refuses it today.

The dataset must carry labels: an ImageFolder tree (one subfolder per class), a file list
with labels, or labelled tar shards.
"""

import argparse
import sys
import time

import torch
import torchvision.transforms.v2 as T

import stoker

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipe(num_classes):
    train_tf = T.Compose([
        T.RandomResizedCrop(176, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
        T.RandomHorizontalFlip(0.5),
        T.TrivialAugmentWide(interpolation=T.InterpolationMode.BILINEAR),
        T.PILToTensor(),
        T.ToDtype(torch.float, scale=True),
        T.Normalize(mean=MEAN, std=STD),
        T.RandomErasing(p=0.1),
        T.ToPureTensor(),
    ])
    mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=num_classes),
                          T.CutMix(alpha=1.0, num_classes=num_classes)])
    return train_tf, mix


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="an ImageFolder tree (or any dataset stoker reads) with labels")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mix", action="store_true", help="leave MixUp / CutMix out")
    ap.add_argument("--socket", default=None, help="stokerd's socket (default: find or start)")
    args = ap.parse_args()

    # The number of classes comes from the dataset: ask a plain loader first.
    probe = stoker.Loader(args.data, batch_size=1, crop=8, socket=args.socket, epochs=1)
    num_classes = probe.info["num_classes"]
    probe.close()
    if num_classes < 2:
        print(f"{args.data}: {num_classes} class(es); the recipe trains a classifier",
              file=sys.stderr)
        return 2

    train_tf, mix = recipe(num_classes)
    loader = stoker.Loader(args.data, batch_size=args.batch_size, drop_last=True,
                           seed=args.seed, socket=args.socket, transform=train_tf,
                           batch_transform=None if args.no_mix else mix)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5, stride=4), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, start = 0, time.monotonic()
    while step < args.steps:
        for images, labels in loader:
            x = torch.from_dlpack(images)          # [B, 3, 176, 176] float32, normalised
            y = torch.from_dlpack(labels)          # [B, classes] soft labels, or [B] int64
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 5 == 0 or step == 1:
                print(f"step {step}: images {tuple(x.shape)} {x.dtype}, labels "
                      f"{tuple(y.shape)} {y.dtype}, loss {loss.item():.3f}")
            del x, y, images, labels
            if step >= args.steps:
                break
    took = time.monotonic() - start
    print(f"{step} steps, {step * args.batch_size / took:.0f} images/s, "
          f"data stall {loader.stats()['wait_fraction']:.0%}")
    loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
