"""`Loader(device="cuda")` against the real `stokerd --backend cuda` on the emulated GPU (two
devices, tests/gpu-emulator): 2 ranks, one per GPU, as 2 separate client processes choosing
their GPU by LOCAL_RANK, get for every dtype and layout the batches the CPU backend gives for
the same (seed, epoch, step): equal indices, labels and statuses, pixels at PSNR >= 30 dB (nvJPEG,
and the emulator after it, upsamples chroma by replication, the CPU decoder with a triangle filter:
docs/cuda.md, "First GPU run").

Needs the emulated GPU's libraries (`cargo build -p stoker-emu-cuda -p stoker-emu-nvjpeg`,
which python/run-tests does) and NVIDIA's NVRTC wheel (scripts/cuda-wheels); without them the
test is skipped loudly, or fails under STOKER_REQUIRE_DAEMON=1.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker

from conftest import _unavailable, find_stokerd, serve_stokerd
from formats_data import HEIGHT, WIDTH, write_dataset, write_oriented

SEED = 11
# Least PSNR of a CUDA-backend batch against the CPU backend's (tests/kit's MIN_BACKEND_PSNR_DB).
MIN_BACKEND_PSNR = 30
HERE = Path(__file__).resolve().parent


def _emulator_env():
    stokerd = find_stokerd()
    if stokerd is None:
        _unavailable("stokerd is not built")
    env = {"STOKER_GPU_EMULATOR": "1"}
    for var, name in (("STOKER_LIBCUDA", "cuda"), ("STOKER_NVJPEG", "nvjpeg")):
        found = [d / f"libstoker_emu_{name}.so" for d in (stokerd.parent, stokerd.parent / "deps")]
        found = [p for p in found if p.is_file()]
        if not found:
            _unavailable(f"the emulated GPU is not built (cargo build -p stoker-emu-{name})")
        env[var] = str(found[0])
    wheels = Path(os.environ.get("STOKER_NVIDIA_DIR")
                  or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                  / "stoker/nvidia")
    if not (wheels / "nvidia").is_dir():
        _unavailable(f"NVIDIA's NVRTC wheel is not in {wheels} (scripts/cuda-wheels)")
    env["STOKER_NVIDIA_DIR"] = str(wheels)
    return env


@pytest.fixture(scope="module")
def cuda_daemon(tmp_path_factory):
    """(socket, environment) of a `stokerd --backend cuda` on the emulated GPU."""
    env = _emulator_env()
    d = tmp_path_factory.mktemp("cuda-daemon")
    for sock in serve_stokerd(d, ["--backend", "cuda", "--threads", "2", "--slots", "2"],
                              env={**os.environ, **env, "XDG_CACHE_HOME": str(d / "cache")},
                              timeout=120, what="stokerd --backend cuda"):
        yield sock, env


@pytest.fixture(scope="module")
def smooth_dataset(tmp_path_factory):
    """An ImageFolder of 2 classes x 8 smooth JPEGs (photos are smooth; noise would measure
    the decoders' rounding, not the pipeline)."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path_factory.mktemp("smooth") / "images"
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(8):
            w, h = 40 + 3 * i, 64 - 2 * i
            y, x = np.mgrid[0:h, 0:w]
            rgb = np.stack([x * 255 // w, y * 255 // h, (x + y + 40 * i + 90 * c) % 256],
                           axis=-1).astype(np.uint8)
            Image.fromarray(rgb).save(root / f"class{c}" / f"{i:03}.jpg", quality=92)
    return root


def _specs():
    out = []
    for dtype in ("u8", "f16", "bf16", "f32"):
        for layout in ("nchw", "nhwc"):
            out.append(stoker.build_spec(4, 16, dtype=dtype, layout=layout, epochs=1))
    return out


def _pixels(spec, a):
    """Images on the pixel scale (0..255); bfloat16 arrives as its uint16 bits."""
    if spec["dtype"] == "u8":
        return a.astype(np.float64)
    if spec["dtype"] == "bf16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    a = a.astype(np.float64)
    shape = (1, 3, 1, 1) if spec["layout"] == "nchw" else (1, 1, 1, 3)
    mean = np.array(spec["mean"]).reshape(shape)
    std = np.array(spec["std"]).reshape(shape)
    return (a * std + mean) * 255.0


def _psnr(spec, a, b):
    mse = np.mean((_pixels(spec, a) - _pixels(spec, b)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _cpu_batches(sock, dataset, spec, i, rank):
    loader = stoker.Loader(dataset, spec=spec, device="cpu", rank=rank, world_size=2,
                           job=f"cpu-{i}", seed=SEED, socket=sock, autostart=False)
    out = []
    for b in loader.batches():
        out.append({"pos": (b.epoch, b.step), "images": b.images.copy_to_host(),
                    "indices": b.indices.copy_to_host(), "labels": b.labels.copy_to_host(),
                    "status": b.status.copy_to_host()})
        del b
    loader.close()
    return out


def test_two_gpu_ranks_in_two_processes_get_the_cpu_backends_batches(cuda_daemon,
                                                                     smooth_dataset, tmp_path):
    dataset = smooth_dataset
    sock, env = cuda_daemon
    specs = _specs()
    procs = []
    for rank in (0, 1):
        out = tmp_path / f"rank{rank}.npz"
        cmd = [sys.executable, str(HERE / "cuda_client_proc.py"), sock, str(dataset),
               json.dumps(specs), str(out), str(SEED)]
        p = subprocess.Popen(cmd, env={**os.environ, **env, "RANK": str(rank),
                                       "LOCAL_RANK": str(rank)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((p, out))
    results = []
    for p, out in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, (stdout + stderr).decode(errors="replace")[-4000:]
        results.append(np.load(out))
    worst = float("inf")
    for i, spec in enumerate(specs):
        for rank in (0, 1):
            want = _cpu_batches(sock, dataset, spec, i, rank)
            got = results[rank]
            steps = sorted(int(k.split("_")[2]) for k in got.files
                           if k.startswith(f"pos_{i}_"))
            assert len(steps) == len(want) > 0, (spec["dtype"], spec["layout"], rank)
            for step, w in enumerate(want):
                key = f"{i}_{step}"
                at = f"{spec['dtype']}/{spec['layout']} rank {rank} batch {w['pos']}"
                assert tuple(got[f"pos_{key}"]) == w["pos"], at
                for field in ("indices", "labels", "status"):
                    assert np.array_equal(got[f"{field}_{key}"], w[field]), f"{at}: {field}"
                db = _psnr(spec, got[f"images_{key}"], w["images"])
                assert db >= MIN_BACKEND_PSNR, f"{at}: PSNR {db:.1f} dB"
                worst = min(worst, db)
    print(f"lowest PSNR against the CPU backend: {worst:.1f} dB")


def _gpu_ranks(sock, env, dataset, specs, tmp_path, job):
    """Every spec of `specs` served to 2 GPU ranks, one client process each: their .npz files."""
    procs = []
    for rank in (0, 1):
        out = tmp_path / f"{job}-rank{rank}.npz"
        cmd = [sys.executable, str(HERE / "cuda_client_proc.py"), sock, str(dataset),
               json.dumps(specs), str(out), str(SEED), job]
        p = subprocess.Popen(cmd, env={**os.environ, **env, "RANK": str(rank),
                                       "LOCAL_RANK": str(rank)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((p, out))
    results = []
    for p, out in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, (stdout + stderr).decode(errors="replace")[-4000:]
        results.append(np.load(out))
    return results


def test_every_format_on_the_emulated_gpu_gives_the_cpu_backends_samples(cuda_daemon,
                                                                         tmp_path):
    """The mixed-format dataset of test_formats.py (JPEG, CMYK JPEG, PNG of every kind, WebP)
    served whole by `stokerd --backend cuda`: no replaced sample, and each PNG and WebP (decoded
    on the CUDA backend's CPU route) exactly the CPU backend's; the JPEGs, which nvJPEG decodes,
    at PSNR >= 30 dB."""
    pytest.importorskip("PIL.Image", reason="Pillow writes the test images")
    sock, env = cuda_daemon
    root = tmp_path / "formats"
    files = write_dataset(root / "mixed")
    spec = stoker.build_spec(len(files) // 2, (HEIGHT, WIDTH), train=False, resize=HEIGHT,
                             dtype="u8", layout="nhwc", epochs=1)
    results = _gpu_ranks(sock, env, root, [spec], tmp_path, "formats")
    for rank in (0, 1):
        [want] = _cpu_batches(sock, root, spec, "formats", rank)
        got = results[rank]
        assert np.array_equal(got["indices_0_0"], want["indices"])
        assert np.all(want["status"] == 0) and np.array_equal(got["status_0_0"], want["status"])
        for k, index in enumerate(want["indices"]):
            name = files[int(index)][0]
            a, b = got["images_0_0"][k], want["images"][k]
            if name.endswith(".jpg"):
                assert _psnr(spec, a, b) >= MIN_BACKEND_PSNR, name
            else:
                assert np.array_equal(a, b), f"{name}: the CUDA backend's pixels differ"


def test_exif_orientation_on_the_emulated_gpu_gives_the_cpu_backends_samples(cuda_daemon,
                                                                            tmp_path):
    """With `exif_orientation`, the CUDA backend turns each tagged JPEG as the CPU backend does
    (it sends them to its CPU route): random crops of the 8 orientations equal the CPU
    backend's; the untagged one (orientation 1, decoded by nvJPEG) at PSNR >= 30 dB."""
    pytest.importorskip("PIL.Image", reason="Pillow writes the test images")
    sock, env = cuda_daemon
    root = tmp_path / "oriented"
    names = write_oriented(root / "c")
    spec = stoker.build_spec(4, (20, 30), scale=(0.3, 1.0), dtype="u8", layout="nhwc",
                             epochs=1, shuffle=False, exif_orientation=True)
    results = _gpu_ranks(sock, env, root, [spec], tmp_path, "exif")
    for rank in (0, 1):
        [want] = _cpu_batches(sock, root, spec, "exif", rank)
        got = results[rank]
        assert np.array_equal(got["indices_0_0"], want["indices"])
        assert not want["status"].any() and not got["status_0_0"].any()
        for k, index in enumerate(want["indices"]):
            a, b = got["images_0_0"][k], want["images"][k]
            if names[int(index)] == "o1.jpg":
                assert _psnr(spec, a, b) >= MIN_BACKEND_PSNR
            else:
                assert np.array_equal(a, b), f"{names[int(index)]} differs from the CPU backend"


def _fenced_consumer(mode, cuda_daemon, smooth_dataset, tmp_path):
    """Runs cuda_client_proc.py `mode` (a consumer writing a marker into every slot on a
    delayed stream before it drops the batch) and checks every batch it read against the CPU
    backend's: a slot given back before the write ran would show the marker in a later
    batch."""
    sock, env = cuda_daemon
    spec = stoker.build_spec(4, 16, epochs=3)
    out = tmp_path / f"{mode}.npz"
    cmd = [sys.executable, str(HERE / "cuda_client_proc.py"), mode, sock,
           str(smooth_dataset), json.dumps(spec), str(out), str(SEED)]
    p = subprocess.run(cmd, env={**os.environ, **env, "STOKER_EMU_OP_DELAY_US": "100000"},
                       capture_output=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr).decode(errors="replace")[-4000:]
    got = np.load(out)
    loader = stoker.Loader(smooth_dataset, spec=spec, device="cpu", job=f"{mode}-cpu",
                           seed=SEED, socket=sock, autostart=False)
    n = 0
    for step, b in enumerate(loader.batches()):
        assert np.array_equal(got[f"indices_{step}"], b.indices.copy_to_host())
        db = _psnr(spec, got[f"images_{step}"], b.images.copy_to_host())
        assert db >= MIN_BACKEND_PSNR, \
            f"batch {step}: PSNR {db:.1f} dB (a refilled slot got the marker?)"
        n += 1
        del b
    loader.close()
    assert n == len([k for k in got.files if k.startswith("images_")]) == 12


def test_the_stream_given_to_dlpack_fences_the_release(cuda_daemon, smooth_dataset, tmp_path):
    """A consumer's stream passed to `__dlpack__(stream=...)` holds the slot until the work
    queued there ran (every operation on it delayed): a marker written there into each slot
    never shows in a later batch, which all equal the CPU backend's."""
    _fenced_consumer("fence", cuda_daemon, smooth_dataset, tmp_path)


def test_a_jax_style_consumer_waits_for_its_work_before_dropping_the_batch(
        cuda_daemon, smooth_dataset, tmp_path):
    """JAX's protocol without JAX (not installed in CI): `jax.dlpack.from_dlpack` names its
    stream for external ready events in `__dlpack__(stream=...)`, while its computations run on
    another stream. The consumer here does the same (the marker is written on a second,
    delayed stream) and then what docs/python.md tells a JAX user: wait for the work that reads
    the batch before dropping it. Every batch equals the CPU backend's."""
    _fenced_consumer("jax", cuda_daemon, smooth_dataset, tmp_path)
