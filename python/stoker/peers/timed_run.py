"""What the GPU peers share: the dataset read into memory, the timed run over at least
`--min-images` images (cycling the files), the process's CPU time, and the one line per
configuration that `stoker bench` and scripts/gpu-check read.

A rate line ends with `= R img/s` (the form `stoker bench` parses, `parse_rate` in
daemon/tool/src/cli/bench/peers.rs) and carries the CPU-seconds per 1000 images before it:

    DALI gpu hw_decoder_load=0.65 threads=4 batch=256: 16384 images in 1.92s, 0.41 CPU-s per 1000 images = 8533.3 img/s

CPU time is the process's user + system time (every thread of it: DALI's and nvImageCodec's
worker threads are threads of this process) plus that of its waited-for children, taken with
getrusage around the timed part only (the warm-up and the library's set-up are outside it).
Nothing here imports a GPU library, so `--dry-run` can use it on a machine without one.
"""
import importlib.util
import json
import os
import resource
import sys
import time

JPEG_SUFFIXES = (".jpg", ".jpeg")
# Each configuration is timed over at least this many images (issue 40: 16k), cycling the files.
MIN_IMAGES = 16384
# Exit status when the peer's library is not installed (not a failure of the run's arguments).
EXIT_NOT_INSTALLED = 3


def jpeg_files(root):
    """Every JPEG under root (recursively: flat folders and ImageFolder trees), sorted."""
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if f.lower().endswith(JPEG_SUFFIXES))


def check_dataset(root):
    """The JPEG files under root, or exit 2 with a message naming the folder."""
    files = jpeg_files(root) if os.path.isdir(root) else None
    if not files:
        why = "no JPEG files (.jpg, .jpeg) under it" if files is not None else "not a folder"
        print(f"{root}: {why}", file=sys.stderr)
        sys.exit(2)
    return files


def installed(module):
    """Whether `module` can be imported, without importing it (a dry run loads no GPU library)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def not_installed(what, module, wheels):
    """Says that the peer's package is missing, and how to get it, then exits."""
    print(f"{what} not installed: no module {module} in {sys.executable} "
          f"(pip install {wheels}; offline: scripts/gpu-wheels)", flush=True)
    sys.exit(EXIT_NOT_INSTALLED)


def batches_for(min_images, batch):
    """Batches to run so that at least min_images images are timed."""
    return max(1, -(-min_images // batch))


def cpu_seconds():
    """User + system CPU-seconds of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Timer:
    """Wall and CPU time of the block it wraps."""

    def __enter__(self):
        self.wall0, self.cpu0 = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = cpu_seconds() - self.cpu0
        return False


def report(label, images, timer, records):
    """Prints the configuration's rate line and keeps its record for --json."""
    rate = images / max(timer.wall, 1e-9)
    per_1000 = timer.cpu * 1000.0 / max(images, 1)
    print(f"{label}: {images} images in {timer.wall:.2f}s, {per_1000:.2f} CPU-s per 1000 images "
          f"= {rate:.1f} img/s", flush=True)
    records.append({"config": label, "images": images, "seconds": timer.wall,
                    "cpu_seconds": timer.cpu, "cpu_s_per_1000": per_1000,
                    "images_per_s": rate})


def write_json(path, peer, records, dry_run=False):
    """The records as JSON (`{"peer", "dry_run", "runs": [...]}`), where --json asked."""
    if path:
        with open(path, "w") as f:
            json.dump({"peer": peer, "dry_run": dry_run, "runs": records}, f, indent=1)


def dry_run(peer, files, configs, module, json_path):
    """Prints what a run would do, without importing the GPU library, and exits 0."""
    have = "installed" if installed(module) else "not installed"
    print(f"{peer} dry run: {len(files)} JPEG files, module {module} {have}", flush=True)
    for label, images in configs:
        print(f"would run: {label}: {images} images", flush=True)
    write_json(json_path, peer, [{"config": c, "images": n} for c, n in configs], dry_run=True)
    sys.exit(0)
