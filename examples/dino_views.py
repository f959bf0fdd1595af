#!/usr/bin/env python3
"""DINO's data pipeline (2 global views of 224 and 6 local views of 96, each with its own
colour operations), fed by stokerd with DINO's Composes unchanged.

    pip install ./python torch torchvision
    python examples/dino_views.py /path/to/images --steps 10

`DataAugmentationDINO` of facebookresearch/dino (main_dino.py), written with
torchvision.transforms.v2: per view RandomResizedCrop, RandomHorizontalFlip, ColorJitter (p
0.8), RandomGrayscale (0.2), GaussianBlur (1.0 / 0.1 / 0.5), RandomSolarize (second global view,
0.2), Normalize. `stoker.Loader(views=[...])` takes one Compose per view, translates each into
the pipeline spec (docs/python.md, "Keep your torchvision code") and decodes each image once
for all eight views (docs/views.md). Each batch is a list of 8 tensors; the script checks their
shapes and prints the rate.

Any folder of images works (labels are not used).
"""

import argparse
import sys
import time

import torch
import torchvision.transforms.v2 as T

import stoker

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def dino_views(local_crops=6):
    flip_and_color_jitter = T.Compose([
        T.RandomHorizontalFlip(p=0.5),
        T.RandomApply([T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)],
                      p=0.8),
        T.RandomGrayscale(p=0.2),
    ])
    normalize = T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True),
                           T.Normalize(MEAN, STD)])
    global1 = T.Compose([T.RandomResizedCrop(224, scale=(0.4, 1.0)), flip_and_color_jitter,
                         T.GaussianBlur(23, sigma=(0.1, 2.0)), normalize])
    global2 = T.Compose([T.RandomResizedCrop(224, scale=(0.4, 1.0)), flip_and_color_jitter,
                         T.RandomApply([T.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.1),
                         T.RandomSolarize(128, p=0.2), normalize])
    local = T.Compose([T.RandomResizedCrop(96, scale=(0.05, 0.4)), flip_and_color_jitter,
                       T.RandomApply([T.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5),
                       normalize])
    return [global1, global2] + [local] * local_crops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="a folder of images (or any dataset stoker reads)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--local-crops", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--socket", default=None, help="stokerd's socket (default: find or start)")
    args = ap.parse_args()

    views = dino_views(args.local_crops)
    loader = stoker.Loader(args.data, batch_size=args.batch_size, drop_last=True,
                           seed=args.seed, socket=args.socket, views=views)
    step, start = 0, time.monotonic()
    while step < args.steps:
        for crops, _labels in loader:
            crops = [torch.from_dlpack(c) for c in crops]
            shapes = [tuple(c.shape[1:]) for c in crops]
            want = [(3, 224, 224)] * 2 + [(3, 96, 96)] * args.local_crops
            if shapes != want:
                print(f"views of shapes {shapes}, expected {want}", file=sys.stderr)
                return 1
            step += 1
            if step == 1:
                g, lo = crops[0], crops[2]
                print(f"{len(crops)} views: 2 of {tuple(g.shape)}, {args.local_crops} of "
                      f"{tuple(lo.shape)}; global mean {g.mean():.3f}, std {g.std():.3f}")
            del crops, _labels
            if step >= args.steps:
                break
    took = time.monotonic() - start
    print(f"{step} batches, {step * args.batch_size / took:.0f} images/s "
          f"({step * args.batch_size * len(views) / took:.0f} views/s)")
    loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
