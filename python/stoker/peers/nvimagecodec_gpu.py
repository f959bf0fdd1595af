#!/usr/bin/env python3
"""GPU peer: nvImageCodec's batched decode, then RandomResizedCrop 224 / flip / normalise in
torch on the GPU (the transform of torchvision_gpu.py and of stoker's GPU benchmark).

nvImageCodec (PyPI `nvidia-nvimgcodec-cu12` / `-cu13`, module `nvidia.nvimgcodec`) is the
decoder under DALI. Its decoder takes a list of backends, each with a `load_hint`: the share of
a batch that backend is given. One configuration per `--load-hints` value:
- `1.0`: every image the hardware JPEG engines take goes there (then the CUDA decoder, the
  hybrid CPU+GPU decoder and the CPU for the rest);
- `0.65`: the engines get 65% of each batch and the CUDA decoder the rest, at the same time
  (DALI's default split);
- `0`: the engines are left out: the CUDA decoder (GPU Huffman) and the hybrid decoder only.

The files are read into memory once (storage out of the picture); each configuration decodes
batches of `--batch` cycling over them until at least `--min-images` (16384) were timed, after
`--warmup` batches. The crop is drawn per image in Python (torchvision's RandomResizedCrop
rule: area 0.08-1, log-uniform ratio 3/4-4/3, ten tries then the centre) and applied with one
antialiased `interpolate` per image on the decoded tensor (a view of nvImageCodec's output
through DLPack), then the batch is stacked, flipped and normalised to float CHW; the timed part
ends with a CUDA synchronise.

Prints one line per configuration (timed_run.py: CPU-seconds per 1000 images, `= R img/s`).
`--dry-run` checks the arguments and the dataset and prints what it would run without
importing nvImageCodec or torch; without the package it says "not installed" and exits 3.

usage: nvimagecodec_gpu.py DIR [--batch 256] [--min-images 16384] [--load-hints 1.0,0.65,0]
                           [--threads 8] [--warmup 4] [--json FILE] [--dry-run]
"""
import argparse
import math
import random
import sys

from timed_run import (MIN_IMAGES, Timer, batches_for, check_dataset, dry_run, installed,
                       not_installed, report, write_json)

MODULE = "nvidia.nvimgcodec"
WHEELS = "nvidia-nvimgcodec-cu12 (CUDA 12) or nvidia-nvimgcodec-cu13 (CUDA 13)"
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--min-images", type=int, default=MIN_IMAGES)
    ap.add_argument("--load-hints", default="1.0,0.65,0",
                    help="comma-separated shares of each batch for the hardware engines")
    ap.add_argument("--threads", type=int, default=8, help="nvImageCodec's CPU threads")
    ap.add_argument("--warmup", type=int, default=4, help="batches before timing")
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the runs as JSON here")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    try:
        a.hints = [float(h) for h in a.load_hints.split(",") if h.strip()]
    except ValueError:
        ap.error(f"--load-hints {a.load_hints!r}: comma-separated numbers from 0 to 1")
    if not a.hints or any(not 0.0 <= h <= 1.0 for h in a.hints):
        ap.error(f"--load-hints {a.load_hints!r}: each share is from 0 to 1")
    for name in ("batch", "min_images", "threads", "crop"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.warmup < 0:
        ap.error("--warmup must be 0 or more")
    return a


def label(a, hint):
    return (f"nvImageCodec load_hint={hint:g} threads={a.threads} batch={a.batch} "
            f"crop={a.crop}")


def crop_box(rng, h, w):
    """torchvision's RandomResizedCrop box (top, left, height, width) for an h x w image."""
    area = h * w
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = int(round(math.sqrt(target * ratio)))
        ch = int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    # Centre crop at the nearest allowed ratio, as torchvision falls back.
    ratio = w / h
    if ratio < 3 / 4:
        cw, ch = w, int(round(w / (3 / 4)))
    elif ratio > 4 / 3:
        ch, cw = h, int(round(h * (4 / 3)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def make_decoder(nvimgcodec, hint, threads):
    """A decoder giving the hardware engines `hint` of each batch (none at 0)."""
    kinds = nvimgcodec.BackendKind
    backends = []
    if hint > 0:
        backends.append(nvimgcodec.Backend(kinds.HW_GPU_ONLY, load_hint=hint))
    backends += [nvimgcodec.Backend(kinds.GPU_ONLY, load_hint=1.0),
                 nvimgcodec.Backend(kinds.HYBRID_CPU_GPU, load_hint=1.0),
                 nvimgcodec.Backend(kinds.CPU_ONLY, load_hint=1.0)]
    return nvimgcodec.Decoder(device_id=0, max_num_cpu_threads=threads, backends=backends)


def run(a, files):
    import torch
    import torch.nn.functional as F
    from nvidia import nvimgcodec

    datas = []
    for path in files:
        with open(path, "rb") as f:
            datas.append(f.read())
    # The default parameters decode to 8-bit interleaved sRGB (nvImageCodec 0.9's DecodeParams).
    params = nvimgcodec.DecodeParams()
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255
    rng = random.Random(a.seed)
    order = []

    def next_batch():
        while len(order) < a.batch:
            more = list(range(len(datas)))
            rng.shuffle(more)
            order.extend(more)
        chunk = [datas[i] for i in order[:a.batch]]
        del order[:a.batch]
        return chunk

    def step(decoder):
        # A CodeStream per file and batch, as a loader parses each file it reads.
        streams = [nvimgcodec.CodeStream(data) for data in next_batch()]
        images = decoder.decode(streams, params=params)
        out = []
        for image in images:
            if image is None:  # a file the decoder refused: skipped, as a bad sample
                continue
            t = torch.from_dlpack(image).permute(2, 0, 1)  # HWC u8 -> CHW view
            top, left, ch, cw = crop_box(rng, t.shape[1], t.shape[2])
            crop = t[None, :, top:top + ch, left:left + cw].float()
            crop = F.interpolate(crop, size=(a.crop, a.crop), mode="bilinear",
                                 antialias=True, align_corners=False)
            if rng.random() < 0.5:
                crop = crop.flip(3)
            out.append(crop)
        x = (torch.cat(out) - mean) / std
        return x.shape[0]

    records = []
    for hint in a.hints:
        decoder = make_decoder(nvimgcodec, hint, a.threads)
        for _ in range(a.warmup):
            step(decoder)
        torch.cuda.synchronize()
        n = 0
        with Timer() as timer:
            for _ in range(batches_for(a.min_images, a.batch)):
                n += step(decoder)
            torch.cuda.synchronize()
        report(label(a, hint), n, timer, records)
        del decoder
    print(f"on {torch.cuda.get_device_name()}, {len(files)} files cycled", flush=True)
    return records


def main(argv=None):
    a = parse_args(argv)
    files = check_dataset(a.root)
    total = batches_for(a.min_images, a.batch) * a.batch
    if a.dry_run:
        dry_run("nvImageCodec", files, [(label(a, h), total) for h in a.hints], MODULE, a.json)
    if not installed(MODULE):
        not_installed("nvImageCodec", MODULE, WHEELS)
    write_json(a.json, "nvImageCodec", run(a, files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
