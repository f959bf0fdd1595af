"""What a script is told about its data (issue 43 item 3), against a real stokerd: a typo'd
path fails when the Loader is made, and replaced samples are counted and said on stderr."""

import numpy as np
import pytest

import stoker


def test_a_typod_path_fails_at_construction_naming_it(tmp_path):
    """It failed only at the first batch (or len()), from the daemon; no daemon is asked now."""
    missing = tmp_path / "imagenet" / "trian"
    for given in (str(missing), missing):
        with pytest.raises(stoker.DatasetError) as e:
            stoker.Loader(given, batch_size=4, crop=8, socket=tmp_path / "none.sock",
                          autostart=False)
        assert str(e.value) == f"not found: {missing}", str(e.value)


def test_a_relative_typo_is_named_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(stoker.DatasetError) as e:
        stoker.Loader("./data/trian", batch_size=4, crop=8, socket=tmp_path / "none.sock",
                      autostart=False)
    assert str(e.value) == f"not found: {tmp_path}/data/trian", str(e.value)


@pytest.fixture
def untidy(tmp_path):
    """An ImageFolder of 8 good JPEGs, a corrupt one, and two files no decoder takes."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path / "untidy"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (24, 20), (40 * i, 9, 200)).save(root / c / f"{i}.jpg")
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 and then nothing a decoder takes")
    (root / "b" / "anim.gif").write_bytes(b"GIF89a...")
    (root / "b" / "raw.heic").write_bytes(b"....ftypheic....")
    return root


def test_skipped_files_and_replaced_samples_are_told_to_the_script(untidy, daemon, capfd):
    """Skipped files and replaced samples showed only in the daemon's log."""
    with stoker.Loader(untidy, batch_size=3, crop=8, socket=daemon, job="untidy",
                       epochs=1) as ld:
        info = ld.info
        assert info["dataset_len"] == 9
        assert info["skipped"] == {"count": 2, "first": ["b/anim.gif", "b/raw.heic"]}
        statuses = []
        for images, labels in ld:
            statuses += np.from_dlpack(images.batch.status).tolist()
        assert sum(1 for s in statuses if s != 0) == 1, statuses
        stats = ld.stats()
        assert stats["bad_samples"] == 1, stats
    err = capfd.readouterr().err
    skipped = [line for line in err.splitlines() if "files skipped" in line]
    assert len(skipped) == 1 and "b/anim.gif, b/raw.heic" in skipped[0], err
    assert str(untidy) in skipped[0], err
    replaced = [line for line in err.splitlines() if "replaced by others" in line]
    assert len(replaced) == 1, err
    assert "1 sample" in replaced[0] and "bad_samples" in replaced[0], err


def test_the_replaced_samples_are_named_to_the_script(untidy, daemon, capfd):
    """The line said only how many samples were replaced ("the daemon's log names each file"):
    the script is now told which files, and `stats()` lists them."""
    with stoker.Loader(untidy, batch_size=3, crop=8, socket=daemon, job="untidy-names",
                       epochs=2) as ld:
        for _ in ld:
            pass
        stats = ld.stats()
        assert stats["bad_samples"] == 1, stats
        assert stats["bad_sample_names"] == ["a/broken.jpg"], stats
        for _ in ld:  # the second epoch meets the file again: counted, named once
            pass
        stats = ld.stats()
        assert stats["bad_samples"] == 2, stats
        assert stats["bad_sample_names"] == ["a/broken.jpg"], stats
    err = capfd.readouterr().err
    replaced = [line for line in err.splitlines() if "replaced by others" in line]
    assert len(replaced) == 1, err
    assert ": a/broken.jpg" in replaced[0], replaced[0]
