"""Training scripts survive preemption, as a user runs them: examples/train_torch.py and the
Kubernetes Job's script (deploy/kubernetes/train-job.yaml), each under torchrun with 2 ranks on
the CPU, stopped by a SIGTERM to torchrun (as Slurm, Kubernetes and spot reclaims send it)
after their first checkpoint, then started again with the same command line: the restarted run
finishes with exactly the final loss of an uninterrupted run, so it saw exactly its batches.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(os.environ.get("STOKER_REPO", Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="module")
def torchrun():
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as e:
        pytest.skip(f"SKIPPED preemption tests: torch and torchvision are not installed ({e})")
    return [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2"]


def run(cmd, env, stop_after=None, timeout=600):
    """Runs `cmd` to the end; with `stop_after`, sends torchrun SIGTERM once a line of its
    output matches that pattern. Returns (exit code, output)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if stop_after and re.search(stop_after, line):
                p.send_signal(signal.SIGTERM)
                stop_after = None
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, "".join(lines)


def final_loss(output):
    found = re.findall(r"done: (\d+) steps.*?loss (\d+\.\d+)", output)
    assert len(found) == 1, output[-4000:]
    return found[0]


def uninterrupted_and_preempted(cmd, tmp_path):
    """(steps and final loss of an uninterrupted run, the same of a run stopped by SIGTERM
    after its first checkpoint and restarted), and the stopped run's output. `cmd(checkpoint)`
    is the (argv, environment) of a run that saves to and resumes from `checkpoint`."""
    reference = tmp_path / "reference.pt"
    code, out = run(*cmd(reference))
    assert code == 0, out[-4000:]
    preempted = tmp_path / "preempted.pt"
    code, stopped = run(*cmd(preempted), stop_after=r"saved .* at step 1\b")
    assert code != 0, f"a SIGTERM'd run must not exit 0 (a scheduler would call it done)\n" \
                      f"{stopped[-4000:]}"
    assert "done:" not in stopped, stopped[-4000:]
    assert preempted.is_file(), stopped[-4000:]
    code, resumed = run(*cmd(preempted))
    assert code == 0, resumed[-4000:]
    return final_loss(out), final_loss(resumed), stopped


def test_the_training_example_resumes_exactly_after_sigterm_under_torchrun(env, dataset,
                                                                            tmp_path, torchrun):
    def cmd(checkpoint):
        return torchrun + [str(REPO / "examples/train_torch.py"), str(dataset), "--steps", "10",
                           "--batch-size", "4", "--crop", "32", "--checkpoint", str(checkpoint),
                           "--checkpoint-every", "1", "--resume"], env

    reference, resumed, stopped = uninterrupted_and_preempted(cmd, tmp_path)
    assert "stopped by SIGTERM after step" in stopped, stopped[-4000:]
    assert resumed == reference, (resumed, reference)


def train_job_script():
    """The Job's train.py exactly as the ConfigMap carries it (its block, unindented)."""
    text = (REPO / "deploy/kubernetes/train-job.yaml").read_text()
    block = text.split("  train.py: |\n", 1)[1].split("\n---\n", 1)[0]
    return "".join(line[4:] if line.strip() else "\n" for line in block.splitlines(True))


def test_the_kubernetes_job_script_runs_as_written_and_survives_sigterm(env, dataset, tmp_path,
                                                                       torchrun):
    script = tmp_path / "train.py"
    script.write_text(train_job_script())
    # What the Job's pod would set, made small for a CPU: the dataset path instead of the
    # daemon-registered name, a checkpoint folder of the test's own, one epoch of 32x32 crops.
    job_env = dict(env, DATASET=str(dataset), EPOCHS="1", BATCH_SIZE="4", CROP="32",
                   LR="0.001", CHECKPOINT_EVERY="1", TORCHELASTIC_RUN_ID="stoker-train")

    def cmd(checkpoint):
        return torchrun + [str(script)], dict(job_env, CHECKPOINT=str(checkpoint))

    reference, resumed, _ = uninterrupted_and_preempted(cmd, tmp_path)
    assert resumed == reference, (resumed, reference)
