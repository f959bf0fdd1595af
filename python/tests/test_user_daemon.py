"""This user's own daemon as a Loader starts it (issue 43 item 4): flags asked in
STOKER_DAEMON_ARGS that the running daemon was not started with are warned about, and
`stoker stop` stops it."""

import subprocess

import pytest

import stoker
from stoker._daemon import answers, bundled


@pytest.fixture
def user_daemon(tmp_path, monkeypatch):
    """This user's socket under a temp XDG_RUNTIME_DIR; the daemon a test starts there is
    stopped after it with `stoker stop`, which must succeed."""
    if not bundled("stokerd").exists():
        pytest.skip("SKIPPED: the package has no stokerd")
    monkeypatch.delenv("STOKER_SOCKET", raising=False)
    monkeypatch.setenv("STOKER_PRIVATE_DAEMON", "1")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("STOKER_IDLE_EXIT", "60")
    sock = tmp_path / "stoker" / "stoker.sock"
    yield sock
    if answers(sock):
        p = subprocess.run([bundled("stoker"), "stop", "--socket", str(sock)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "stopped stokerd" in p.stderr, p.stderr
        assert not answers(sock)


def test_differing_stoker_daemon_args_warn_naming_both(dataset, user_daemon, monkeypatch,
                                                        capfd):
    """They were ignored without a word while the daemon ran (it idles 10 minutes)."""
    def attach():
        with stoker.Loader(dataset, batch_size=4, crop=8) as ld:
            assert len(ld) > 0

    monkeypatch.setenv("STOKER_DAEMON_ARGS", "--threads 1")
    attach()
    assert answers(user_daemon)
    assert "STOKER_DAEMON_ARGS" not in capfd.readouterr().err
    monkeypatch.setenv("STOKER_DAEMON_ARGS", "--threads 2")
    attach()
    err = capfd.readouterr().err
    warned = [line for line in err.splitlines() if "STOKER_DAEMON_ARGS" in line]
    assert len(warned) == 1, err
    assert "--threads 2" in warned[0] and "--threads 1" in warned[0], warned[0]
    assert "stoker stop" in warned[0] and str(user_daemon) in warned[0], warned[0]
    monkeypatch.setenv("STOKER_DAEMON_ARGS", "--threads 1")
    attach()
    assert "STOKER_DAEMON_ARGS" not in capfd.readouterr().err, "the same flags: no warning"
