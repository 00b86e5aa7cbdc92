"""bench/go_build.py's options: bad ones are refused by name before anything is built."""

from __future__ import annotations

import pytest

from bench import go_build
from cluster import build


def test_the_default_set_is_what_the_builds_use() -> None:
    assert go_build.SETS["default"] == build.COMPILE_FLAGS
    assert go_build.SETS["no-dwarf"] != go_build.SETS["default"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["etcd", "--repeats", "0"], "--repeats: 0 is not a number of builds >= 1"),
        (["no-such-component"], "invalid choice: 'no-such-component'"),
    ],
)
def test_bad_options_are_named(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        go_build.main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_a_set_gocache_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setenv("GOCACHE", "/tmp/somewhere")
    with pytest.raises(SystemExit):
        go_build.main(["etcd"])
    assert "GOCACHE is set" in capsys.readouterr().err
