"""conftest.py's ends of session fixtures: one ended after the last test that uses it (the
controller pod, shared by the real-training module and the shared run, gives the host
controller back before the modules after them), the others after the last test of the modules
that use the cluster. Checked on stand-in items; no cluster starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import conftest
import pytest

HERE = Path(conftest.__file__).parent


@dataclass
class Session:
    items: list = field(default_factory=list)


@dataclass
class Item:
    name: str
    fixturenames: list[str]
    session: Session
    path: Path = HERE / "test_stand_in.py"


def test_a_fixture_ends_after_its_last_test_and_the_rest_after_the_last_cluster_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conftest, "_ENDS", [])  # not the session's own
    session = Session()
    uses, also, after, reads, no_cluster, elsewhere = (
        Item("uses", ["kube", "controller_pod"], session),
        Item("also", ["kube", "story", "controller_pod"], session),
        Item("after", ["kube", "controller"], session),
        Item("reads", [], session),  # checks what its module's tests before it recorded
        Item("no cluster", ["monkeypatch"], session, HERE / "test_machinery.py"),
        Item("elsewhere", ["controller_pod"], session, Path(__file__).parents[1] / "test_x.py"),
    )
    session.items = [uses, also, after, reads, no_cluster, elsewhere]
    ended: list[str] = []
    conftest._ending(lambda: ended.append("cluster"))
    pod = conftest._ending(lambda: ended.append("controller pod"), after="controller_pod")

    conftest.pytest_runtest_teardown(uses, also)
    assert ended == []
    conftest.pytest_runtest_teardown(also, after)
    assert ended == ["controller pod"]
    pod()  # the fixture's own teardown at the session's end: already done
    assert ended == ["controller pod"]
    conftest.pytest_runtest_teardown(after, reads)  # its module's last test is still to come
    assert ended == ["controller pod"]
    # The last test of a module that uses the cluster; the module after it in tests/e2e
    # starts none.
    conftest.pytest_runtest_teardown(reads, no_cluster)
    assert ended == ["controller pod", "cluster"] and conftest._ENDS == []
