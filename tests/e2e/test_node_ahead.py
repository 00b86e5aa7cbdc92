"""node_ahead.py: which session fixtures' work starts with the session, and how the fixtures
get its results. Checked on stand-in items and steps; no cluster starts."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from node_ahead import Ahead, wanted

HERE = Path(__file__).parent


@dataclass
class Item:
    fixturenames: list[str]
    path: Path = HERE / "test_stand_in.py"


def test_the_steps_a_session_needs_come_from_its_e2e_tests_fixtures() -> None:
    trains, node_only = Item(["kube", "train_image"]), Item(["kube", "real_node"])
    elsewhere = Item(["train_image"], HERE.parent / "test_x.py")
    assert wanted([Item(["kube"]), trains], HERE) == ("real_node", "train_image")
    assert wanted([node_only, Item(["kube"])], HERE) == ("real_node",)
    assert wanted([Item(["kube"]), elsewhere], HERE) == ()
    assert wanted([], HERE) == ()


def test_the_steps_run_in_order_before_anyone_asks_and_give_their_results() -> None:
    order: list[str] = []
    both_done = threading.Event()

    def node() -> str:
        order.append(threading.current_thread().name)
        return "node up"

    def images() -> tuple[list[str], list[str]]:
        order.append("images")
        both_done.set()
        return ["loaded"], ["ghcr.io/megdet/megdet:x"]

    ahead = Ahead({"real_node": node, "train_image": images})
    assert both_done.wait(10), "the steps did not run until asked"
    assert order == ["e2e-node-ahead", "images"]
    assert "train_image" in ahead and "other" not in ahead
    assert ahead.result("train_image") == (["loaded"], ["ghcr.io/megdet/megdet:x"])
    assert ahead.result("real_node") == "node up"
    ahead.join()


def test_a_failed_step_fails_its_fixture_and_the_steps_after_it_with_its_error() -> None:
    ran: list[str] = []

    def node() -> None:
        raise RuntimeError("the machine's real node belongs to another session")

    ahead = Ahead({"real_node": node, "train_image": lambda: ran.append("images")})
    for name in ("real_node", "train_image"):
        with pytest.raises(RuntimeError, match="belongs to another session"):
            ahead.result(name)
    ahead.join()
    assert ran == []
