"""The README's Python quick start, run as written, and the training example's behaviour."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(os.environ.get("STOKER_REPO", Path(__file__).resolve().parents[2]))


def quick_start():
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- quick-start")[1].split("<!-- /quick-start -->")[0]
    sh = re.search(r"```sh\n(.*?)```", block, re.S).group(1)
    py = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    return sh, py


def test_the_readme_quick_start_runs_verbatim(env, tmp_path):
    sh, py = quick_start()
    for line in sh.strip().splitlines():
        if line.startswith("pip install ./python"):
            # This environment was made by installing the wheel that command builds.
            continue
        out = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, f"{line}: {out.stderr}"
    out = subprocess.run([sys.executable, "-c", py], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 8, out.stdout  # 256 images / 32
    assert lines[0].startswith("(32, 3, 224, 224) [")
    assert "waiting for data" in lines[-1]


def test_the_training_example_explains_a_flat_folder(env, tmp_path):
    flat = tmp_path / "flat"
    subprocess.run(["stoker", "synth", str(tmp_path / "tree"), "--images", "16", "--scale",
                    "0.1"], check=True, capture_output=True, env=env)
    flat.mkdir()
    for f in (tmp_path / "tree").rglob("*.jpg"):
        shutil.copy(f, flat / f"{f.parent.name}-{f.name}")
    out = subprocess.run([sys.executable, str(REPO / "examples/train_torch.py"), str(flat)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "has no class labels" in out.stderr and "ImageFolder" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_the_training_example_trains_on_an_imagefolder_tree(env, dataset):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        pytest.skip(f"SKIPPED training example on an ImageFolder tree: torch is not installed "
                    f"({e})")
    out = subprocess.run([sys.executable, str(REPO / "examples/train_torch.py"), str(dataset),
                          "--steps", "6", "--batch-size", "8", "--crop", "32"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "done: 6 steps" in out.stdout, out.stdout
