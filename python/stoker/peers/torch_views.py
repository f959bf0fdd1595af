#!/usr/bin/env python3
"""Peer baseline for several views of one image: a PyTorch DataLoader + torchvision doing
DINO's multi-crop on a folder of JPEGs, as a user would write it: each image decoded with Pillow
once, then 2 global views (RandomResizedCrop 224, scale 0.4-1) and 6 local views (96, scale
0.05-0.4), each flipped with probability 0.5, ToTensor and Normalize (DINO's colour jitter, blur
and solarisation left out, as `stoker bench --views dino` leaves them out). Prints images/s
(images, not views) after `--warmup` untimed epochs.

usage: torch_views.py DIR [--workers N] [--batch B] [--epochs E] [--warmup W]
"""
import argparse, os, time

import torch
from torch.utils.data import DataLoader, Dataset
import torchvision.transforms as T
from PIL import Image


class MultiCrop(Dataset):
    def __init__(self, root):
        self.files = sorted(
            os.path.join(d, f)
            for d, _, fs in os.walk(root)
            for f in fs
            if f.lower().endswith((".jpg", ".jpeg"))
        )
        norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])

        def view(side, scale):
            return T.Compose([T.RandomResizedCrop(side, scale=scale), T.RandomHorizontalFlip(),
                              T.ToTensor(), norm])

        self.views = [view(224, (0.4, 1.0))] * 2 + [view(96, (0.05, 0.4))] * 6

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        return [v(img) for v in self.views], 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dl = DataLoader(MultiCrop(a.root), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    persistent_workers=a.workers > 0, drop_last=False)
    for _ in range(a.warmup):
        for views, _ in dl:
            pass
    t0 = time.perf_counter(); n = 0
    for _ in range(a.epochs):
        for views, _ in dl:
            assert len(views) == 8
            n += views[0].shape[0]
    dt = time.perf_counter() - t0
    print(f"torch DataLoader multi-crop 2x224+6x96 workers={a.workers} batch={a.batch}: "
          f"{n} images in {dt:.2f}s = {n/dt:.1f} img/s")


if __name__ == "__main__":
    main()
