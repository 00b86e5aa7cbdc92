"""One render per spec generation: the run chart renders a run again only
when its inputs changed; a reused render is an independent copy; a deleted run's render goes."""

from __future__ import annotations

import pytest

from megdet.controller.problems import InvalidRunError
from megdet.controller.render import ChartRenderer, plain

SPEC = {"gpus": 8, "target": "pytorchjob"}


@pytest.fixture(scope="module")
def renderer() -> ChartRenderer:
    return ChartRenderer(memo_size=3)


def test_same_inputs_reuse_the_render_as_a_copy(renderer: ChartRenderer) -> None:
    first = renderer.render("memo-a", "ns", SPEC)
    renders = renderer.renders
    first.objects[0]["metadata"]["ownerReferences"] = [{"uid": "x"}]  # as kopf.adopt does
    again = renderer.render("memo-a", "ns", dict(SPEC))
    assert renderer.renders == renders and renderer.reused >= 1
    assert "ownerReferences" not in again.objects[0]["metadata"]
    fresh = ChartRenderer(memo_size=0).render("memo-a", "ns", SPEC)
    assert plain(again.objects) == plain(fresh.objects)
    assert again.values == fresh.values and again.plan == fresh.plan
    again.values["gpus"] = 999  # the kept copy is not the caller's
    assert renderer.render("memo-a", "ns", SPEC).values["gpus"] == 8


def test_changed_inputs_render_again(renderer: ChartRenderer) -> None:
    renderer.render("memo-b", "ns", SPEC)
    renders = renderer.renders
    changed = renderer.render("memo-b", "ns", {**SPEC, "gpus": 16})
    assert renderer.renders == renders + 1 and changed.plan.world_size == 16
    renderer.render("memo-b", "other-ns", {**SPEC, "gpus": 16})  # another run
    assert renderer.renders == renders + 2


def test_forget_and_the_bound(renderer: ChartRenderer) -> None:
    renderer.render("memo-c", "ns", SPEC)
    assert ("ns", "memo-c") in renderer.memo_keys()
    renderer.forget("ns", "memo-c")
    assert ("ns", "memo-c") not in renderer.memo_keys()
    for i in range(5):
        renderer.render(f"memo-d{i}", "ns", SPEC)
    assert renderer.memo_keys() == [("ns", "memo-d2"), ("ns", "memo-d3"), ("ns", "memo-d4")]


def test_a_refused_spec_is_not_kept(renderer: ChartRenderer) -> None:
    for _ in range(2):
        with pytest.raises(InvalidRunError):
            renderer.render("memo-e", "ns", {"gpus": 12})
    assert ("ns", "memo-e") not in renderer.memo_keys()
