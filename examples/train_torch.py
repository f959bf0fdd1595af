#!/usr/bin/env python3
"""A minimal PyTorch training loop fed by stokerd.

    pip install ./python torch      # the wheel carries the daemon: nothing else to start
    python examples/train_torch.py /path/to/imagefolder --steps 20

It trains a classifier, so the dataset must carry labels: an ImageFolder tree (one subfolder
per class), a file list with labels, or labelled tar shards. On a flat folder of JPEGs (no
classes, every label -1) it stops before training with a message saying so and exit code 2.

Under torchrun every rank gets its share of each epoch (rank, world size and the job key come
from the environment torchrun sets):

    torchrun --nproc-per-node 2 examples/train_torch.py /path/to/imagefolder --socket ...

Batches arrive as DLPack tensors viewing the daemon's shared ring; `torch.from_dlpack` wraps
them without a copy. The slot goes back to the daemon once the tensors made from it are freed,
so the loop drops them each step (here by rebinding the names).

Preemption (Slurm, Kubernetes, spot instances) is survived: with `--checkpoint PATH` the model,
optimiser and loader state are saved together every `--checkpoint-every` steps and when SIGTERM
arrives (at the end of the step running then, every rank at the same step; exit code 143), and
`--resume` continues from PATH when it exists, with exactly the batches an uninterrupted run
would have seen next:

    python examples/train_torch.py DATA --steps 1000 --checkpoint ck.pt --resume

`--device cuda` has the daemon decode and augment on this rank's GPU (cuda:LOCAL_RANK under
torchrun) and hand the images over in GPU memory: `torch.from_dlpack` gives a CUDA tensor
viewing the ring, and the slot goes back once the work queued on it has run.

The throughput run of issue 40 (scripts/gpu-check's training step): `--model resnet50`
(torchvision, no weights; `resnet18` too) trains in bf16 autocast with channels_last, fed by
`--source stoker` (the Loader; for a ResNet the batches come as bf16 NHWC, which is
channels_last NCHW without a copy), `--source dali` (DALI's GPU pipeline: mixed decode,
random_resized_crop, crop_mirror_normalize, sharded by rank) or `--source synthetic` (one
random batch already on the device, the ceiling: no input pipeline at all):

    python examples/train_torch.py DATA --model resnet50 --batch 256 --size 224 --device cuda \
        --source stoker --steps 60 --json run.json

After `--warmup-steps` it prints images/s (every rank together) and the data stall: the time
the loop waited for its next batch over the time of the timed steps (for stoker, the Loader's
own figure beside it). `--json FILE` writes them (rank 0).
"""

import argparse
import json
import os
import signal
import sys
import time

# Exit code when the dataset has no labels to train on.
EXIT_UNLABELED = 2
# Exit code after a SIGTERM's checkpoint (128 + SIGTERM, as a shell reports it): not 0, so that
# a scheduler does not count a preempted run as finished.
EXIT_TERMINATED = 128 + signal.SIGTERM


def tiny_cnn(classes):
    import torch.nn as nn
    import torch.nn.functional as F

    class TinyCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.head = nn.Linear(32, classes)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            return self.head(x.mean(dim=(2, 3)))

    return TinyCNN()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("dataset", help="dataset path (or a name registered with the daemon)")
    p.add_argument("--socket", default=None,
                   help="stokerd socket (default: $STOKER_SOCKET, the system daemon, else this "
                        "user's own, started on first use)")
    p.add_argument("--batch-size", "--batch", dest="batch_size", type=int, default=32)
    p.add_argument("--crop", "--size", dest="crop", type=int, default=64)
    p.add_argument("--source", choices=["stoker", "synthetic", "dali"], default="stoker",
                   help="where batches come from (synthetic and dali: no checkpoints)")
    p.add_argument("--model", choices=["tiny", "resnet18", "resnet50"], default="tiny")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="auto: bf16 autocast and channels_last for a ResNet, fp32 for tiny")
    p.add_argument("--classes", type=int, default=1000,
                   help="classes of the synthetic source's labels")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="steps before the timing starts (at most steps - 1)")
    p.add_argument("--json", default=None, help="write images/s and the data stall here")
    p.add_argument("--steps", type=int, default=20, help="optimiser steps to run")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None,
                   help="save model, optimiser and loader state here: every --checkpoint-every "
                        "steps, on SIGTERM and at the end")
    p.add_argument("--checkpoint-every", type=int, default=100, metavar="N")
    p.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint when that file exists")
    p.add_argument("--device", default="cpu",
                   help="cpu, or cuda / cuda:N: batches in this GPU's memory (the daemon's CUDA "
                        "backend; a bare cuda is cuda:LOCAL_RANK under torchrun)")
    args = p.parse_args()
    args.bf16 = args.precision == "bf16" or (args.precision == "auto" and args.model != "tiny")
    if args.source != "stoker":
        if args.checkpoint or args.resume:
            p.error(f"--source {args.source}: checkpoints are for --source stoker")
        return train(args, *other_source(args))

    import stoker

    # A ResNet in bf16 takes bf16 NHWC batches: permuted to NCHW they are channels_last.
    fast = args.bf16 and args.model != "tiny"
    loader = stoker.Loader(args.dataset, batch_size=args.batch_size, crop=args.crop,
                           seed=args.seed, socket=args.socket, device=args.device,
                           dtype="bf16" if fast else "f32", layout="nhwc" if fast else "nchw")
    classes = loader.info["num_classes"]
    if classes == 0:
        # A flat folder: every label is -1, which no classification loss accepts.
        loader.close()
        sys.stderr.write(
            f"train_torch.py: {args.dataset} has no class labels (a flat folder of images: "
            "every label is -1), so there is nothing to train a classifier on. Arrange it as an "
            "ImageFolder tree (one subfolder per class) or a file list with labels.\n")
        return EXIT_UNLABELED

    return train(args, loader, classes)


def distributed_rank():
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))


def device_name(args):
    """The torch device this rank trains on: cuda is this rank's GPU under torchrun."""
    if args.device == "cuda":
        import torch

        return f"cuda:{distributed_rank()[2] % max(1, torch.cuda.device_count())}"
    return args.device


class Batches:
    """The Loader's face for the sources that are not stoker: rank, device, epoch, close(),
    stats(), and iteration over (images, labels) tensors already on the device."""

    def __init__(self, device, rank, make_iter, close=lambda: None):
        self.device, self.rank, self.epoch = device, rank, 0
        self._make_iter, self._close = make_iter, close

    def __iter__(self):
        self.epoch += 1
        return self._make_iter()

    def close(self):
        self._close()

    def stats(self):
        return None


def other_source(args):
    """(Batches, classes) for --source synthetic or dali."""
    import torch

    rank, world, _ = distributed_rank()
    device = device_name(args)
    if args.source == "synthetic":
        gen = torch.Generator(device="cpu").manual_seed(args.seed + rank)
        x = torch.randn(args.batch_size, 3, args.crop, args.crop, generator=gen).to(device)
        if args.bf16:
            x = x.to(torch.bfloat16)
        y = torch.randint(0, args.classes, (args.batch_size,), generator=gen).to(device)

        def forever():
            while True:
                yield x, y
        return Batches(device, rank, forever), args.classes
    return dali_source(args, rank, world, device)


def dali_source(args, rank, world, device):
    """DALI's GPU pipeline over an ImageFolder, this rank's shard, as (images, labels)."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError:
        sys.stderr.write("train_torch.py: --source dali: DALI is not installed "
                         "(nvidia-dali-cuda120 / -cuda130; offline: scripts/gpu-wheels)\n")
        sys.exit(3)
    classes = len([d for d in os.scandir(args.dataset) if d.is_dir()])
    gpu = int(device.split(":")[1]) if ":" in device else 0

    @pipeline_def(batch_size=args.batch_size, num_threads=8, device_id=gpu, seed=args.seed)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=args.dataset, random_shuffle=True,
                                        shard_id=rank, num_shards=world, name="reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=[args.crop, args.crop])
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
            std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels.gpu()

    p = pipe()
    p.build()
    it = DALIGenericIterator(p, ["images", "labels"], reader_name="reader", auto_reset=True,
                             last_batch_policy=LastBatchPolicy.DROP)

    def epoch():
        for out in it:
            yield out[0]["images"], out[0]["labels"].view(-1).long()
    return Batches(device, rank, epoch), classes


def make_model(args, classes):
    if args.model == "tiny":
        return tiny_cnn(classes)
    import torchvision

    return getattr(torchvision.models, args.model)(weights=None, num_classes=classes)


class Preemption:
    """SIGTERM noted by a handler and agreed on by every rank at the end of each step, so that
    all ranks stop after the same step (a rank that stopped alone would hang the others in
    their next allreduce)."""

    def __init__(self, distributed, device):
        self.signalled = False
        self.distributed = distributed
        self.device = device
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum, frame):
        self.signalled = True

    def requested(self):
        if not self.distributed:
            return self.signalled
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(self.signalled)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def save_checkpoint(path, model, opt, loader, step):
    """Model, optimiser and loader state together, written by rank 0 (ranks move in step, so
    its loader state is every rank's) and renamed into place: a SIGKILL while writing leaves
    the previous checkpoint whole."""
    import torch

    if loader.rank == 0:
        state = {"model": getattr(model, "module", model).state_dict(), "opt": opt.state_dict(),
                 "loader": loader.state_dict(), "step": step}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"saved {path} at step {step}, loader position {state['loader']['epoch']}:"
              f"{state['loader']['step']}", flush=True)


def resume(path, model, opt, loader, device):
    """The step to continue from: the checkpoint's, with model, optimiser and loader restored;
    0 when there is no checkpoint yet (the first run of a job that is always started with
    --resume)."""
    import torch

    if not path or not os.path.exists(path):
        return 0
    state = torch.load(path, map_location=device)
    getattr(model, "module", model).load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    loader.load_state_dict(state["loader"])
    if loader.rank == 0:
        print(f"resumed from {path} at step {state['step']}", flush=True)
    return state["step"]


def dist_backend(device):
    """NCCL where every rank has a GPU of its own; gloo on the CPU and where ranks share a GPU
    (NCCL refuses two ranks on one device)."""
    import torch

    if not device.startswith("cuda"):
        return "gloo"
    return "nccl" if torch.cuda.device_count() >= distributed_rank()[1] else "gloo"


def train(args, loader, classes):
    import torch

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group(dist_backend(loader.device))
    torch.manual_seed(args.seed)
    device = torch.device(loader.device if loader.device.startswith("cuda") else "cpu")
    model = make_model(args, classes).to(device)
    if args.model != "tiny":
        model = model.to(memory_format=torch.channels_last)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    preemption = Preemption(distributed, device)
    try:
        step = resume(args.checkpoint, model, opt, loader, device) if args.resume else 0
        return run_steps(args, loader, model, opt, device, step, preemption)
    finally:
        loader.close()
        if distributed:
            dist.destroy_process_group()


class Meter:
    """Images/s and the data stall over the steps after the warm-up: the time spent waiting
    for the next batch over the time of those steps (the device synchronised at both ends,
    so queued GPU work is counted in the step that queued it)."""

    def __init__(self, args, device, start_step):
        self.device, self.warm = device, start_step + max(0, min(args.warmup_steps,
                                                                   args.steps - start_step - 1))
        self.t0, self.wait, self.images, self.steps = None, 0.0, 0, 0

    def sync(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def waited(self, step, seconds, images):
        """Called with the step about to run, the seconds its batch took to arrive."""
        if step == self.warm:
            self.sync()
            self.t0 = time.perf_counter()
            self.wait = 0.0
        if self.t0 is not None:
            self.wait += seconds
            self.images += images
            self.steps += 1

    def result(self):
        self.sync()
        wall = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        return {"timed_steps": self.steps, "seconds": wall, "images": self.images,
                "images_per_s": self.images / wall if wall > 0 else None,
                "data_stall": self.wait / wall if wall > 0 else None}


def to_model_input(args, images, labels, device):
    """(x, y) for the model: stoker's DLPack batches viewed as tensors (NHWC permuted to a
    channels_last NCHW view), other sources' tensors as they come."""
    import torch

    if not isinstance(images, torch.Tensor):
        x = torch.from_dlpack(images)  # a view of the ring
        if x.shape[-1] == 3 and x.dim() == 4:
            x = x.permute(0, 3, 1, 2)  # NHWC -> NCHW, channels_last strides
        y = torch.from_dlpack(labels).to(device, non_blocking=True)  # [B] int64
        return x, y
    return images, labels


def run_steps(args, loader, model, opt, device, step, preemption):
    """Optimiser steps from `step` to `args.steps`, checkpointing on the way; the exit code."""
    import contextlib

    import torch
    import torch.nn.functional as F

    rank, seen, t0, loss = loader.rank, 0, time.perf_counter(), None
    meter = Meter(args, device, step)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if args.bf16
                else contextlib.nullcontext())
    while step < args.steps:
        batches = iter(loader)  # one epoch of this rank's share
        while step < args.steps:
            waited = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            x, y = to_model_input(args, images, labels, device)
            meter.waited(step, time.perf_counter() - waited, x.shape[0])
            with autocast:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            seen += x.shape[0]
            if rank == 0 and (step % 5 == 0 or step == 1):
                rate = seen / (time.perf_counter() - t0)
                print(f"epoch {loader.epoch} step {step} loss {loss.item():.4f} "
                      f"({rate:.0f} images/s on rank 0)", flush=True)
            # Dropping the views hands the slot back before the next batch is awaited.
            del x, y, images, labels
            if preemption.requested():
                if args.checkpoint:
                    save_checkpoint(args.checkpoint, model, opt, loader, step)
                if rank == 0:
                    print(f"stopped by SIGTERM after step {step}", flush=True)
                return EXIT_TERMINATED
            if args.checkpoint and step % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint, model, opt, loader, step)
        del batches

    if args.checkpoint and step % args.checkpoint_every != 0:
        save_checkpoint(args.checkpoint, model, opt, loader, step)
    report(args, loader, meter.result(), step, seen, loss, device)
    return 0


def report(args, loader, timed, step, seen, loss, device):
    """The closing lines (rank 0): steps and loss, images/s of every rank together, the data
    stall (and the Loader's own figure for stoker); the same as JSON with --json."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rate = timed["images_per_s"] or 0.0
    if world > 1:
        import torch.distributed as dist

        # gloo reduces host tensors everywhere; NCCL wants this rank's GPU.
        on = device if dist.get_backend() == "nccl" else "cpu"
        total = torch.tensor([rate], dtype=torch.float64, device=on)
        dist.all_reduce(total)
        rate = float(total.item())
    if loader.rank != 0:
        return
    stall = loader.stats()
    final = f"{loss.item():.6f}" if loss is not None else "none"
    waited = (f"; waited for data {stall['wait_fraction']:.0%} of the time"
              if stall is not None else "")
    print(f"done: {step} steps, {seen} images on rank 0, final loss {final}{waited}", flush=True)
    shown = "n/a" if timed["data_stall"] is None else f"{timed['data_stall']:.4f}"
    print(f"train {args.model} source={args.source} batch={args.batch_size} size={args.crop} "
          f"world={world} {'bf16' if args.bf16 else 'fp32'}: {timed['timed_steps']} timed "
          f"steps, data stall {shown} = {rate:.1f} img/s", flush=True)
    if args.json:
        out = dict(timed, source=args.source, model=args.model, batch=args.batch_size,
                   size=args.crop, world=world, device=str(device),
                   precision="bf16" if args.bf16 else "fp32", images_per_s_all_ranks=rate,
                   steps=step, final_loss=None if loss is None else float(loss.item()),
                   stoker_wait_fraction=None if stall is None else stall["wait_fraction"])
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
