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
