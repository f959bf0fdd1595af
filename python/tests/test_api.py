"""What works without a daemon: loading libstoker, typed errors, spec and environment handling."""

import ctypes
import os
import re
import sys
from pathlib import Path

import pytest

import stoker
from stoker import _lib


def test_library_loads_and_reports_its_version():
    assert Path(stoker.library_path()).is_file()
    version = stoker.__version__
    assert version == stoker.library_version()
    # git describe at build time, never a path; a checkout builds the commit into it.
    assert "/" not in version, version
    if (Path(__file__).resolve().parents[2] / ".git").exists():
        assert re.fullmatch(r"\d+\.\d+\.\d+(\+g[0-9a-f]{10}|-\d+-g[0-9a-f]{10})", version), version
    assert stoker.protocol_version() >= 2


def test_every_header_function_is_bound():
    header = (Path(__file__).resolve().parents[2] / "ipc/include/stoker.h").read_text()
    declared = {line.split("(")[0].split()[-1].lstrip("*")
                for line in header.splitlines()
                if line.startswith(("stoker_result stoker_", "const char *stoker_", "void stoker_",
                                    "uint16_t stoker_"))}
    assert declared == set(_lib._SIGNATURES), declared ^ set(_lib._SIGNATURES)


def test_struct_sizes_match_the_c_abi():
    assert ctypes.sizeof(_lib.AttachOptions) == 96
    assert ctypes.sizeof(_lib.AttachInfo) == 96  # 88 before issue 43 (skipped)
    # 80 before the soft labels (num_classes, soft_labels) were appended.
    assert ctypes.sizeof(_lib.BatchHeader) == 96
    assert ctypes.sizeof(_lib.DLTensor) == 48
    assert ctypes.sizeof(_lib.DLManagedTensorVersioned) == 80
    assert ctypes.sizeof(_lib.DLManagedTensor) == 64
    o = _lib.AttachOptions()
    _lib.call("stoker_attach_options_init", ctypes.byref(o))
    assert (o.size, o.rank, o.world_size, o.seed) == (96, 0, 1, 0)
    assert (o.offset_epoch, o.offset_consumed) == (0, 0)


def test_missing_daemon_raises_connect_error(tmp_path, monkeypatch):
    # No retrying for a daemon that is not coming (the default waits 10 s).
    monkeypatch.setenv("STOKER_CONNECT_TIMEOUT", "0")
    loader = stoker.Loader(tmp_path, batch_size=4, crop=32, socket=tmp_path / "nobody.sock")
    with pytest.raises(stoker.ConnectError) as e:
        next(iter(loader))
    assert "no stoker daemon at" in str(e.value)
    assert isinstance(e.value, stoker.StokerError) and isinstance(e.value, ConnectionError)
    assert e.value.code == -2


def test_invalid_spec_raises_spec_error_naming_the_field(tmp_path):
    # The Loader's own arguments are checked when it is made, in the user's terms.
    bad = [({"batch_size": 0}, "Loader(batch_size=...): must be a whole number from 1"),
           ({"crop": "224"}, "Loader(crop=...): must be a side in pixels"),
           ({"dtype": "float64"}, "Loader(dtype=...): must be one of u8, f16, bf16, f32"),
           ({"layout": "chw"}, "Loader(layout=...): must be one of nchw, nhwc"),
           ({"flip_prob": 2}, "Loader(flip_prob=...): must be a probability"),
           ({"scale": (1.0, 0.5)}, "Loader(scale=...): must be a (low, high) pair"),
           ({"std": (0.2, 0, 0.2)}, "Loader(std=...): must be 3 numbers (R, G, B), none"),
           ({"epochs": 0}, "Loader(epochs=...): must be a whole number from 1"),
           ({"train": False, "crop": 224, "resize": 100}, "Loader(resize=...)")]
    for kw, message in bad:
        kw = {"batch_size": 4, "crop": 32, **kw}
        with pytest.raises(stoker.SpecError) as e:
            stoker.Loader(tmp_path, socket=tmp_path / "s.sock", **kw)
        assert message in str(e.value), (kw, str(e.value))
    assert stoker.build_spec(4, 32, dtype="bfloat16")["dtype"] == "bf16"
    # A spec given whole is checked by libstoker at attach, naming the field too.
    loader = stoker.Loader(tmp_path, spec='{"batch_size": 2}', socket=tmp_path / "s.sock")
    with pytest.raises(stoker.SpecError, match="crop"):
        len(loader)


def test_rank_outside_world_size_is_an_invalid_argument(tmp_path):
    loader = stoker.Loader(tmp_path, batch_size=2, crop=8, rank=3, world_size=2, job="j",
                           socket=tmp_path / "s.sock")
    with pytest.raises(stoker.InvalidArgument, match="world_size"):
        len(loader)


def test_world_size_above_one_needs_a_job_key(monkeypatch, tmp_path):
    for var in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="job"):
        stoker.Loader(tmp_path, rank=0, world_size=2)


def test_rank_world_size_and_job_come_from_torchrun(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    loader = stoker.Loader(tmp_path, batch_size=2, crop=8)
    assert (loader.rank, loader.world_size, loader.local_rank) == (3, 4, 1)
    assert loader.job == f"torchrun-abc/{tmp_path}"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert stoker.Loader(tmp_path, name="val").job == "torchrun-10.0.0.1:29500/val"


def test_spec_follows_torchvision_defaults():
    s = stoker.build_spec(8, 224)
    assert s["crop"] == {"kind": "random_resized", "size": [224, 224], "scale": [0.08, 1.0],
                         "ratio": [0.75, 4 / 3]}
    assert s["flip_prob"] == 0.5
    e = stoker.build_spec(8, (160, 224), train=False)
    assert e["crop"] == {"kind": "center_crop", "size": [160, 224], "resize": 182}
    assert e["flip_prob"] == 0.0
    # Evaluation is in dataset order, training shuffled, unless told otherwise.
    assert s["shuffle"] is True and e["shuffle"] is False
    assert stoker.build_spec(8, 224, shuffle=False)["shuffle"] is False


def test_state_dict_round_trips_and_refuses_another_seed(tmp_path):
    a = stoker.Loader(tmp_path, seed=5)
    state = a.state_dict()
    state.update(epoch=2, step=7)
    a.load_state_dict(state)
    assert (a.state_dict()["epoch"], a.state_dict()["step"]) == (2, 7)
    with pytest.raises(ValueError, match="seed"):
        stoker.Loader(tmp_path, seed=6).load_state_dict(state)


def test_state_dict_moves_to_another_world_size_as_an_elastic_offset(tmp_path):
    a = stoker.Loader(tmp_path, seed=5, batch_size=8, job="j", rank=1, world_size=4)
    state = a.state_dict()
    state.update(epoch=2, step=7, consumed=7 * 8 * 4)
    assert a.state_dict()["version"] == 2
    # Same world size and batch size: the very same position.
    a.load_state_dict(state)
    assert (a.state_dict()["epoch"], a.state_dict()["step"]) == (2, 7)
    assert a.state_dict()["consumed"] == 224 and a.state_dict()["offset"] is None
    # Another world size: step 0 of what is left of epoch 2.
    b = stoker.Loader(tmp_path, seed=5, batch_size=8, job="j", rank=0, world_size=2)
    b.load_state_dict(state)
    s = b.state_dict()
    assert (s["epoch"], s["step"], s["consumed"]) == (2, 0, 224)
    assert s["offset"] == {"epoch": 2, "consumed": 224}
    # A version 1 state (no consumed count) only loads at its own world size.
    old = {"version": 1, "epoch": 1, "step": 3, "seed": 5, "dataset": str(tmp_path),
           "rank": 0, "world_size": 4}
    a.load_state_dict(old)
    assert (a.state_dict()["epoch"], a.state_dict()["step"]) == (1, 3)
    with pytest.raises(ValueError, match="world_size"):
        b.load_state_dict(old)


def test_a_stale_stoker_socket_is_named_as_the_cause(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CONNECT_TIMEOUT", "0")
    stale = tmp_path / "gone.sock"
    monkeypatch.setenv("STOKER_SOCKET", str(stale))
    loader = stoker.Loader(tmp_path, batch_size=4, crop=32)
    with pytest.raises(stoker.ConnectError) as e:
        next(iter(loader))
    assert f"no stoker daemon at {stale} (named by $STOKER_SOCKET" in str(e.value)


def test_the_bench_peer_scripts_ship_with_the_package(monkeypatch):
    # `stoker bench --compare` runs them (issue 24 item 11): the installed package carries
    # them, and its `stoker` command points the bench at them and at this Python.
    peers = Path(stoker.__file__).resolve().parent / "peers"
    for script in ("torch_loader.py", "dali_cpu.py", "s3_loader.py", "README.md"):
        assert (peers / script).is_file(), f"{script} is not in {peers}"
    from stoker import _cli
    seen = {}
    monkeypatch.setattr(_cli, "_exec", lambda name: seen.update(
        name=name, peers=os.environ.get("STOKER_PEERS"),
        python=os.environ.get("STOKER_PEER_PYTHON")))
    saved = {k: os.environ.pop(k, None) for k in ("STOKER_PEERS", "STOKER_PEER_PYTHON")}
    try:
        _cli.stoker()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    # The same folder and Python, however they are reached (a venv may sit behind a symlink).
    assert seen["name"] == "stoker", seen
    assert Path(seen["peers"]).resolve() == peers, seen
    assert Path(seen["python"]).resolve() == Path(sys.executable).resolve(), seen


def test_torch_and_numpy_dtypes_are_taken_beside_the_names():
    """Issue 43 item 8: `dtype=torch.bfloat16` was refused ("must be one of u8, f16, ...")."""
    import numpy as np

    from stoker._spec import build_spec

    torch = pytest.importorskip("torch", reason="SKIPPED: torch is not installed")
    for given, want in [(torch.bfloat16, "bf16"), (torch.float16, "f16"), (torch.half, "f16"),
                        (torch.float32, "f32"), (torch.uint8, "u8"), (np.float16, "f16"),
                        (np.dtype("uint8"), "u8"), (np.float32, "f32"), ("bfloat16", "bf16")]:
        assert build_spec(4, 8, dtype=given)["dtype"] == want, given
    with pytest.raises(stoker.SpecError, match="dtype"):
        build_spec(4, 8, dtype=torch.int64)
