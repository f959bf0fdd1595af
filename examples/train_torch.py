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
"""

import argparse
import os
import signal
import sys
import time

import stoker

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
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=64)
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

    loader = stoker.Loader(args.dataset, batch_size=args.batch_size, crop=args.crop,
                           seed=args.seed, socket=args.socket, device=args.device)
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


def train(args, loader, classes):
    import torch

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if loader.device.startswith("cuda") else "gloo")
    torch.manual_seed(args.seed)
    device = torch.device(loader.device if loader.device.startswith("cuda") else "cpu")
    model = tiny_cnn(classes).to(device)
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


def run_steps(args, loader, model, opt, device, step, preemption):
    """Optimiser steps from `step` to `args.steps`, checkpointing on the way; the exit code."""
    import torch
    import torch.nn.functional as F

    rank, seen, t0, loss = loader.rank, 0, time.perf_counter(), None
    while step < args.steps:
        for images, labels in loader:  # one epoch of this rank's share
            x = torch.from_dlpack(images)  # [B, 3, H, W] float32, a view of the ring
            y = torch.from_dlpack(labels).to(device, non_blocking=True)  # [B] int64
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
            if step >= args.steps:
                break

    if args.checkpoint and step % args.checkpoint_every != 0:
        save_checkpoint(args.checkpoint, model, opt, loader, step)
    if rank == 0:
        stall = loader.stats()
        final = f"{loss.item():.6f}" if loss is not None else "none"
        print(f"done: {step} steps, {seen} images on rank 0, final loss {final}; waited for "
              f"data {stall['wait_fraction']:.0%} of the time", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
