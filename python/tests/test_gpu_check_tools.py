"""The tools scripts/gpu-check runs beside stoker (issue 40): the ImageNet-like data generator
(scripts/make-imagenet-like), the GPU peers' dry runs (python/stoker/peers/nvimagecodec_gpu.py,
dali_gpu.py) and the wheels' split and join (scripts/gpu-wheels). None needs a GPU: the peers
run in dry run, which imports no GPU library, and say "not installed" where the package is
missing."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PEERS = REPO / "python" / "stoker" / "peers"


def sof(data):
    """(marker, [(component id, h, v)]) of a JPEG's frame header (SOF0..SOF2)."""
    i = 2
    while i + 4 <= len(data):
        assert data[i] == 0xFF, f"marker expected at {i}"
        marker = data[i + 1]
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            seg = data[i + 4:i + 2 + length]
            comps = [(seg[6 + 3 * c], seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15)
                     for c in range(seg[5])]
            return marker, comps
        i += 2 + length
    raise AssertionError("no SOF marker")


def first_luma_quant(data):
    """The first (DC) entry of the JPEG's first quantisation table."""
    i = data.index(b"\xff\xdb")
    return data[i + 5]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the source photos")
    d = tmp_path_factory.mktemp("photos")
    for i, (w, h) in enumerate([(640, 480), (500, 375), (375, 500), (800, 600)]):
        img = Image.new("RGB", (w, h))
        img.putdata([((x * 7 + i * 40) % 256, (y * 3) % 256, (x + y) % 256)
                     for y in range(h) for x in range(w)])
        img.save(d / f"p{i}.jpg", quality=95)
    return d


def generate(photos, out, *extra):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "make-imagenet-like"),
                          "--photos", str(photos), "--out", str(out), "--count", "40",
                          "--classes", "4", "--seed", "7", "--jobs", "2", *extra],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = [line.split("\t") for line in Path(str(out) + ".tsv").read_text().splitlines()[1:]]
    return run.stdout, rows


def test_imagenet_like_data_has_the_sizes_sampling_quality_and_layout_it_claims(photos, tmp_path):
    from PIL import Image

    out, rows = generate(photos, tmp_path / "plain")
    assert "40 JPEGs in 4 classes" in out and "0 progressive" in out, out
    assert len(rows) == 40
    assert sorted(os.listdir(tmp_path / "plain")) == ["c000", "c001", "c002", "c003"]
    assert all(len(os.listdir(tmp_path / "plain" / c)) == 10 for c in os.listdir(tmp_path / "plain"))
    shorts = []
    for rel, w, h, progressive, size in rows:
        path = tmp_path / "plain" / rel
        data = path.read_bytes()
        assert len(data) == int(size)
        with Image.open(path) as img:
            assert img.size == (int(w), int(h)), rel
        marker, comps = sof(data)
        assert marker == 0xC0 and progressive == "0", rel
        # 4:2:0: luma 2x2, both chroma components 1x1.
        assert [(h_, v_) for _, h_, v_ in comps] == [(2, 2), (1, 1), (1, 1)], (rel, comps)
        # libjpeg's luminance table scaled to quality 90: DC entry 16 * 0.2 = 3.
        assert first_luma_quant(data) == 3, rel
        assert 200 // 2 <= max(int(w), int(h)) <= 800, rel
        shorts.append(min(int(w), int(h)))
    # Most short sides fall in ImageNet's usual range.
    assert sum(1 for s in shorts if 150 <= s <= 520) >= 0.8 * len(shorts), shorts


def test_a_progressive_copy_differs_only_in_the_share_of_progressive_files(photos, tmp_path):
    _, plain = generate(photos, tmp_path / "plain")
    out, prog = generate(photos, tmp_path / "prog", "--progressive-share", "0.5")
    _, again = generate(photos, tmp_path / "again", "--progressive-share", "0.5")
    assert [r[:3] for r in prog] == [r[:3] for r in plain]  # same files, same sizes
    marked = 0
    for rel, _, _, progressive, _ in prog:
        data = (tmp_path / "prog" / rel).read_bytes()
        marker, _ = sof(data)
        assert marker == (0xC2 if progressive == "1" else 0xC0), rel
        marked += progressive == "1"
        if progressive == "0":
            assert data == (tmp_path / "plain" / rel).read_bytes(), rel
        # Deterministic: the same seed writes the same bytes.
        assert data == (tmp_path / "again" / rel).read_bytes(), rel
    assert 8 <= marked <= 32, marked
    assert f"{marked} progressive" in out


@pytest.mark.parametrize("peer,lines", [
    ("nvimagecodec_gpu.py", ["load_hint=1 ", "load_hint=0.65 ", "load_hint=0 "]),
    ("dali_gpu.py", ["hw_decoder_load=default threads=4", "hw_decoder_load=default threads=8",
                     "hw_decoder_load=0.65 threads=4", "hw_decoder_load=0.65 threads=8"]),
])
def test_gpu_peers_dry_run_checks_the_dataset_and_lists_what_it_would_time(
        photos, tmp_path, peer, lines):
    js = tmp_path / "peer.json"
    run = subprocess.run([sys.executable, str(PEERS / peer), str(photos), "--dry-run",
                          "--batch", "256", "--json", str(js)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "4 JPEG files" in run.stdout, run.stdout
    would = [l for l in run.stdout.splitlines() if l.startswith("would run: ")]
    assert len(would) == len(lines), run.stdout
    for line, want in zip(would, lines):
        assert want in line and line.endswith(": 16384 images"), line
    report = json.loads(js.read_text())
    assert report["dry_run"] is True and len(report["runs"]) == len(lines)
    # No dataset: refused before anything would run.
    bad = subprocess.run([sys.executable, str(PEERS / peer), str(tmp_path / "none"), "--dry-run"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a folder" in bad.stderr, bad.stderr


def test_gpu_peers_say_not_installed_where_their_package_is_missing(photos):
    for peer, module in [("nvimagecodec_gpu.py", "nvidia.nvimgcodec"), ("dali_gpu.py", "nvidia.dali")]:
        if subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True).returncode == 0:
            print(f"SKIPPED {peer} not installed: {module} is installed here")
            continue
        run = subprocess.run([sys.executable, str(PEERS / peer), str(photos)],
                             capture_output=True, text=True)
        assert run.returncode == 3, run.stdout + run.stderr
        assert "not installed" in run.stdout and module in run.stdout, run.stdout


def test_gpu_wheels_split_and_join_give_back_the_same_bytes_and_catch_a_damaged_part(tmp_path):
    script = str(REPO / "scripts" / "gpu-wheels")
    big = tmp_path / "nvidia_dali_fake-1.0-py3-none-any.whl"
    payload = hashlib.sha256(b"seed").digest() * (2_600_000 // 32)
    big.write_bytes(payload)
    (tmp_path / "small-1.0-py3-none-any.whl").write_bytes(b"small")
    run = subprocess.run([script, "split", str(tmp_path), "--part-mb", "1"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    parts = sorted(p.name for p in tmp_path.glob("*.part*"))
    assert parts == [big.name + f".part00{i}" for i in range(3)], parts
    assert not big.exists() and all((tmp_path / p).stat().st_size <= 1_000_000 for p in parts)
    run = subprocess.run([script, "join", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert big.read_bytes() == payload and not list(tmp_path.glob("*.part*"))
    # Split again, damage one part: the join names the damage and leaves the parts.
    subprocess.run([script, "split", str(tmp_path), "--part-mb", "1"], check=True,
                   capture_output=True)
    part = tmp_path / (big.name + ".part001")
    part.write_bytes(b"x" + part.read_bytes()[1:])
    run = subprocess.run([script, "join", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1 and "damaged" in run.stderr, run.stderr
    assert not big.exists() and part.exists()
