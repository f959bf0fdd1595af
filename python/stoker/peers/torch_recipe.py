#!/usr/bin/env python3
"""Peer baseline for the training recipes of `stoker bench DATA --recipe NAME`: a PyTorch
DataLoader running the same torchvision.transforms.v2 Compose on a folder of JPEGs, each file
decoded with torchvision.io.decode_jpeg to a uint8 tensor (the faster of the DataLoader's usual
two paths; Pillow is the other) and then transformed. Prints images/s (images, not views) after
`--warmup` untimed epochs.

Recipes:
- `torchvision-reference`: torchvision's classification reference training preset
  (references/classification/presets.py, ClassificationPresetTrain with the tensor backend and
  v2) as `train.py --auto-augment ta_wide --random-erase 0.1 --train-crop-size 176` builds it:
  RandomResizedCrop(176, bilinear, antialias), RandomHorizontalFlip(0.5),
  TrivialAugmentWide(bilinear), ToDtype(float32, scale=True), Normalize(ImageNet),
  RandomErasing(0.1), ToPureTensor. With `--mix`, also `--mixup-alpha 0.2 --cutmix-alpha 1.0`:
  RandomChoice([MixUp(0.2), CutMix(1.0)]) on each batch in the DataLoader's collate_fn, as the
  reference's train.py does (collate_fn runs in the worker processes).
- `dino`: DINO's DataAugmentationDINO in torchvision.transforms.v2 terms, 2 global views of 224
  (scale 0.4-1) and 6 local views of 96 (scale 0.05-0.4), each RandomResizedCrop (bilinear,
  antialias), RandomHorizontalFlip(0.5), RandomApply([ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
  RandomGrayscale(0.2); global 1 GaussianBlur(23, sigma 0.1-2) always, global 2
  RandomApply([GaussianBlur(23)], p=0.1) and RandomSolarize(128, p=0.2), local
  RandomApply([GaussianBlur(9)], p=0.5); then ToDtype(float32, scale=True) and Normalize.
  DINO itself uses bicubic crops and Pillow's blur on Pillow images; here, as in stoker's
  preset, bilinear antialiased crops and torchvision's GaussianBlur on tensors.

usage: torch_recipe.py DIR --recipe torchvision-reference|dino [--workers N] [--batch B]
                       [--epochs E] [--warmup W] [--mix] [--classes C]
"""
import argparse, os, time

import torch
from torch.utils.data import DataLoader, Dataset, default_collate
import torchvision.transforms.v2 as T
from torchvision.io import decode_jpeg, read_file, ImageReadMode

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
BILINEAR = T.InterpolationMode.BILINEAR


def reference():
    return T.Compose([
        T.RandomResizedCrop(176, interpolation=BILINEAR, antialias=True),
        T.RandomHorizontalFlip(0.5),
        T.TrivialAugmentWide(interpolation=BILINEAR),
        T.ToDtype(torch.float32, scale=True),
        T.Normalize(MEAN, STD),
        T.RandomErasing(p=0.1),
        T.ToPureTensor(),
    ])


def dino_views():
    def view(side, scale, tail):
        return T.Compose([
            T.RandomResizedCrop(side, scale=scale, interpolation=BILINEAR, antialias=True),
            T.RandomHorizontalFlip(0.5),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            T.RandomGrayscale(0.2),
            *tail,
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(MEAN, STD),
        ])

    glob_scale, loc_scale = (0.4, 1.0), (0.05, 0.4)
    global1 = view(224, glob_scale, [T.GaussianBlur(23, sigma=(0.1, 2.0))])
    global2 = view(224, glob_scale, [T.RandomApply([T.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.1),
                                     T.RandomSolarize(128, p=0.2)])
    local = view(96, loc_scale, [T.RandomApply([T.GaussianBlur(9, sigma=(0.1, 2.0))], p=0.5)])
    return [global1, global2] + [local] * 6


class Folder(Dataset):
    def __init__(self, root, recipe):
        self.files = sorted(
            os.path.join(d, f)
            for d, _, fs in os.walk(root)
            for f in fs
            if f.lower().endswith((".jpg", ".jpeg"))
        )
        self.views = dino_views() if recipe == "dino" else None
        self.tf = reference() if recipe != "dino" else None

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = decode_jpeg(read_file(self.files[i]), mode=ImageReadMode.RGB)
        if self.views is not None:
            return [v(img) for v in self.views], 0
        return self.tf(img), 0


class MixCollate:
    """train.py's collate_fn: default_collate, then one of MixUp / CutMix on the batch."""

    def __init__(self, classes):
        self.mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=classes),
                                   T.CutMix(alpha=1.0, num_classes=classes)])

    def __call__(self, batch):
        return self.mix(*default_collate(batch))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--recipe", required=True, choices=["torchvision-reference", "dino"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--mix", action="store_true", help="MixUp/CutMix on each batch (reference)")
    ap.add_argument("--classes", type=int, default=1000)
    a = ap.parse_args()
    if a.mix and a.recipe == "dino":
        ap.error("--mix is the reference recipe's")
    torch.set_num_threads(1)
    ds = Folder(a.root, a.recipe)
    dl = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    persistent_workers=a.workers > 0, drop_last=False,
                    collate_fn=MixCollate(a.classes) if a.mix else None)
    views = 8 if a.recipe == "dino" else 1

    def epoch():
        n = 0
        for x, y in dl:
            if views > 1:
                assert len(x) == views
                x = x[0]
            elif a.mix:
                assert y.shape == (x.shape[0], a.classes)
            n += x.shape[0]
        return n

    for _ in range(a.warmup):
        epoch()
    t0 = time.perf_counter()
    n = sum(epoch() for _ in range(a.epochs))
    dt = time.perf_counter() - t0
    mix = " + MixUp/CutMix" if a.mix else ""
    print(f"torch DataLoader recipe={a.recipe}{mix} decoder=tv workers={a.workers} "
          f"batch={a.batch}: {n} images in {dt:.2f}s = {n/dt:.1f} img/s")


if __name__ == "__main__":
    main()
