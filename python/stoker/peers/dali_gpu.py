#!/usr/bin/env python3
"""GPU peer: NVIDIA DALI's GPU pipeline, as DALI's own ImageNet examples build it.

`fn.readers.file` (shuffled) -> `fn.decoders.image(device="mixed")` (nvImageCodec under it:
the hardware JPEG engines take `hw_decoder_load` of each batch, the CUDA decoder the rest) ->
`fn.random_resized_crop` 224 on the GPU -> `fn.crop_mirror_normalize` (random flip, ImageNet
mean and std, float CHW). One pipeline per configuration: `hw_decoder_load` left to DALI's
default and 0.65 (`--loads default,0.65`), each with 4 and 8 CPU threads (`--threads 4,8`).
(DALI 2.4's `decoders.image` documents 0.65 as its default, so the two coincide there; the
default row is what a user who sets nothing gets in whatever version is installed.)

Each configuration runs `--warmup` batches, then enough batches of `--batch` to time at least
`--min-images` (16384) images, cycling over the files (the reader wraps round the folder);
the timed part ends by copying the last batch's labels (computed on the GPU in the same
iteration) to the host. Prints one line per configuration
(timed_run.py: CPU-seconds per 1000 images, `= R img/s`). `--dry-run` checks the arguments and
the dataset and prints what it would run without importing DALI; without DALI it says "not
installed" and exits 3.

usage: dali_gpu.py DIR [--batch 256] [--min-images 16384] [--loads default,0.65]
                   [--threads 4,8] [--warmup 4] [--json FILE] [--dry-run]
"""
import argparse
import sys

from timed_run import (MIN_IMAGES, Timer, batches_for, check_dataset, dry_run, installed,
                       not_installed, report, write_json)

MODULE = "nvidia.dali"
WHEELS = "nvidia-dali-cuda120 (CUDA 12) or nvidia-dali-cuda130 (CUDA 13)"
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--min-images", type=int, default=MIN_IMAGES)
    ap.add_argument("--loads", default="default,0.65",
                    help="comma-separated hw_decoder_load values; 'default' leaves DALI's")
    ap.add_argument("--threads", default="4,8", help="comma-separated CPU thread counts")
    ap.add_argument("--warmup", type=int, default=4, help="batches before timing")
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the runs as JSON here")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    a.load_list = []
    for item in (s.strip() for s in a.loads.split(",") if s.strip()):
        if item == "default":
            a.load_list.append(None)
            continue
        try:
            load = float(item)
        except ValueError:
            ap.error(f"--loads {a.loads!r}: 'default' or numbers from 0 to 1")
        if not 0.0 <= load <= 1.0:
            ap.error(f"--loads {a.loads!r}: each hw_decoder_load is from 0 to 1")
        a.load_list.append(load)
    try:
        a.thread_list = [int(t) for t in a.threads.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads {a.threads!r}: comma-separated whole numbers")
    if not a.load_list or not a.thread_list or min(a.thread_list) < 1:
        ap.error("--loads and --threads each need at least one value, threads at least 1")
    for name in ("batch", "min_images", "crop"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.warmup < 0:
        ap.error("--warmup must be 0 or more")
    return a


def label(a, load, threads):
    shown = "default" if load is None else f"{load:g}"
    return (f"DALI gpu hw_decoder_load={shown} threads={threads} batch={a.batch} "
            f"crop={a.crop}")


def build(a, files, load, threads):
    from nvidia.dali import fn, pipeline_def, types

    decoder_args = {} if load is None else {"hw_decoder_load": load}

    @pipeline_def(batch_size=a.batch, num_threads=threads, device_id=0, seed=a.seed)
    def pipe():
        jpegs, labels = fn.readers.file(files=files, labels=[0] * len(files),
                                        random_shuffle=True, name="reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB,
                                   **decoder_args)
        images = fn.random_resized_crop(images, size=[a.crop, a.crop],
                                        random_area=[0.08, 1.0],
                                        random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=MEAN, std=STD, mirror=fn.random.coin_flip())
        return images, labels.gpu()

    p = pipe()
    p.build()
    return p


def run(a, files):
    records, device = [], None
    for load in a.load_list:
        for threads in a.thread_list:
            p = build(a, files, load, threads)
            for _ in range(a.warmup):
                p.run()
            n = 0
            with Timer() as timer:
                for _ in range(batches_for(a.min_images, a.batch)):
                    images, labels = p.run()
                    n += len(images)
                # The last iteration's labels brought to the host: its GPU work has finished.
                labels.as_cpu()
            report(label(a, load, threads), n, timer, records)
            device = device or getattr(p, "device_id", 0)
            del p
    print(f"on GPU {device}, {len(files)} files cycled", flush=True)
    return records


def main(argv=None):
    a = parse_args(argv)
    files = check_dataset(a.root)
    total = batches_for(a.min_images, a.batch) * a.batch
    configs = [(label(a, load, t), total) for load in a.load_list for t in a.thread_list]
    if a.dry_run:
        dry_run("DALI", files, configs, MODULE, a.json)
    if not installed(MODULE):
        not_installed("DALI", MODULE, WHEELS)
    write_json(a.json, "DALI", run(a, files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
