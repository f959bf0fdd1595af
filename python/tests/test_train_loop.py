"""examples/train_torch.py's throughput run (issue 40 item 6) on the CPU: a torchvision ResNet
for a few steps fed by synthetic tensors and by a real stokerd, each writing the images/s and
the data stall it measured. scripts/gpu-train runs the same script on a GPU with ResNet-50.

Needs torch and torchvision: skipped (by name) without them, a failure where
STOKER_TEST_TORCH=1 says they must be there (scripts/test)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def need_torch():
    if os.environ.get("STOKER_TEST_TORCH") == "1":
        import torch  # noqa: F401  (must be there: a failure, not a skip)
        import torchvision  # noqa: F401
    else:
        pytest.importorskip("torch")
        pytest.importorskip("torchvision")


def train(dataset, tmp_path, *args):
    out = tmp_path / "run.json"
    run = subprocess.run([sys.executable, str(REPO / "examples" / "train_torch.py"),
                          str(dataset), "--model", "resnet18", "--steps", "3", "--batch", "8",
                          "--size", "64", "--json", str(out), *args],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text())


def check_timed(report, source, precision):
    assert report["source"] == source and report["model"] == "resnet18"
    assert report["steps"] == 3 and report["world"] == 1 and report["device"] == "cpu"
    assert report["precision"] == precision
    # Warm-up: min(5, steps - 1) = 2 steps, so one step is timed.
    assert report["timed_steps"] == 1 and report["images"] == 8
    assert report["images_per_s"] > 0 and report["images_per_s_all_ranks"] > 0
    assert 0.0 <= report["data_stall"] <= 1.0
    assert report["final_loss"] == report["final_loss"]  # not NaN


def test_resnet_trains_on_synthetic_batches_and_reports_its_rate(tmp_path):
    need_torch()
    out, report = train(tmp_path, tmp_path, "--source", "synthetic", "--precision", "fp32",
                        "--classes", "10")
    check_timed(report, "synthetic", "fp32")
    assert report["stoker_wait_fraction"] is None
    assert "train resnet18 source=synthetic batch=8 size=64 world=1 fp32: 1 timed steps" in out
    assert out.rstrip().endswith("img/s"), out


def test_resnet_trains_in_bf16_channels_last_on_stokers_batches(dataset, daemon, tmp_path):
    need_torch()
    out, report = train(dataset, tmp_path, "--source", "stoker", "--socket", daemon)
    # bf16 autocast by default for a ResNet: the Loader serves bf16 NHWC batches, which the
    # loop views as channels_last NCHW.
    check_timed(report, "stoker", "bf16")
    assert 0.0 <= report["stoker_wait_fraction"] <= 1.0
    assert "done: 3 steps, 24 images on rank 0" in out, out
    assert "source=stoker" in out and "data stall" in out, out


def test_checkpoints_are_refused_for_sources_other_than_stoker(tmp_path):
    need_torch()
    run = subprocess.run([sys.executable, str(REPO / "examples" / "train_torch.py"), str(tmp_path),
                          "--source", "synthetic", "--checkpoint", str(tmp_path / "ck.pt")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "checkpoints are for --source stoker" in run.stderr, run.stderr


def test_two_ranks_under_torchrun_share_one_daemon(dataset, daemon, tmp_path):
    need_torch()
    out = tmp_path / "run.json"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", str(REPO / "examples" / "train_torch.py"),
                          str(dataset), "--source", "stoker", "--socket", daemon, "--steps", "3",
                          "--batch", "4", "--size", "32", "--json", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    # Rank 0 reports for both: each rank attached with its own rank of world 2 to one daemon.
    assert report["world"] == 2 and report["steps"] == 3 and report["model"] == "tiny"
    assert report["images_per_s_all_ranks"] >= report["images_per_s"] > 0
    assert "done: 3 steps, 12 images on rank 0" in run.stdout, run.stdout
    assert "world=2" in run.stdout, run.stdout
