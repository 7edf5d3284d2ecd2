"""The health rule for the local stack's child processes, on a fake clock: a pure function of
what the watch last heard (``judge``), and the watch's reports over a sequence of rounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from modelless.pools import health
from modelless.pools.health import HealthPolicy, ProbeRecord, ProcessWatch, Verdict, judge

POLICY = HealthPolicy(period_s=0.25, suspect_after_s=1.0, replace_after_s=4.0, inference_deadline_s=60.0)


@pytest.mark.parametrize(
    ("silent_s", "oldest_s", "alive", "verdict"),
    [
        (0.0, 0.0, True, Verdict.HEALTHY),
        (0.99, 0.0, True, Verdict.HEALTHY),
        (1.0, 0.0, True, Verdict.SUSPECT),  # silent: out of selection
        (3.99, 0.0, True, Verdict.SUSPECT),
        (4.0, 0.0, True, Verdict.HUNG),  # silent for long: replaced
        (0.0, 59.0, True, Verdict.HEALTHY),  # a long request, within the inference deadline
        (0.0, 61.0, True, Verdict.HUNG),  # answers probes, but a run is wedged
        (0.0, 0.0, False, Verdict.DEAD),  # exit beats everything
        (10.0, 100.0, False, Verdict.DEAD),
    ],
)
def test_judge(silent_s: float, oldest_s: float, alive: bool, verdict: Verdict) -> None:
    now = 1000.0
    assert judge(ProbeRecord(now - silent_s, oldest_s), alive, now, POLICY) is verdict


@dataclass
class FakeChild:
    name: str
    address: str
    up: bool = True

    def alive(self) -> bool:
        return self.up


@dataclass
class Scene:
    """A fake clock, children whose probes answer (an age) or not (None), and what was reported."""

    now: float = 0.0
    answers: dict[str, float | None] = field(default_factory=dict)
    verdicts: list[tuple[float, str, Verdict]] = field(default_factory=list)
    recovered: list[tuple[float, str]] = field(default_factory=list)


@pytest.fixture
def scene(monkeypatch: pytest.MonkeyPatch) -> Scene:
    scene = Scene()
    monkeypatch.setattr(health, "probe", lambda address, timeout_s: scene.answers.get(address))
    return scene


def watch_over(scene: Scene, children: dict[str, Any]) -> ProcessWatch:
    return ProcessWatch(
        lambda: children,
        lambda name, verdict: scene.verdicts.append((scene.now, name, verdict)),
        lambda name: scene.recovered.append((scene.now, name)),
        POLICY,
        clock=lambda: scene.now,
    )


def rounds(scene: Scene, watch: ProcessWatch, until: float) -> None:
    while scene.now < until:
        watch.check()
        scene.now = round(scene.now + POLICY.period_s, 6)


def test_a_silent_child_is_held_out_every_round_then_replaced_once(scene: Scene) -> None:
    a, b = FakeChild("a", "http://a:1"), FakeChild("b", "http://b:1")
    scene.answers = {"http://a:1": 0.0, "http://b:1": 0.0}
    watch = watch_over(scene, {"a": a, "b": b})
    rounds(scene, watch, 1.0)
    assert scene.verdicts == []

    scene.answers["http://a:1"] = None  # a stops answering (SIGSTOP) at t=1.0
    rounds(scene, watch, 8.0)
    for_a = [(t, v) for t, name, v in scene.verdicts if name == "a"]
    suspect = [t for t, v in for_a if v is Verdict.SUSPECT]
    hung = [t for t, v in for_a if v is Verdict.HUNG]
    # It last answered at t=0.75: out of selection from 1.75 s (within the 2 s bound of its
    # silence), renewed every round while silent, replaced once at 4.75 s, then forgotten.
    assert suspect[0] == 1.75 and suspect == sorted(suspect) and len(suspect) == 12
    assert hung == [4.75]
    assert all(name == "a" for _, name, _ in scene.verdicts), "a healthy child was reported"


def test_a_suspect_that_answers_again_is_taken_back(scene: Scene) -> None:
    child = FakeChild("a", "http://a:1")
    scene.answers = {"http://a:1": None}
    watch = watch_over(scene, {"a": child})
    rounds(scene, watch, 1.5)  # silent since t=0: suspect from 1.0
    assert [v for _, _, v in scene.verdicts] == [Verdict.SUSPECT, Verdict.SUSPECT]
    scene.answers["http://a:1"] = 0.0
    rounds(scene, watch, 3.0)
    assert scene.recovered == [(1.5, "a")]
    assert len(scene.verdicts) == 2, "reported again after it recovered"


def test_a_dead_child_is_reported_at_once_and_a_wedged_run_as_hung(scene: Scene) -> None:
    dead, wedged = FakeChild("dead", "http://d:1"), FakeChild("wedged", "http://w:1")
    scene.answers = {"http://d:1": 0.0, "http://w:1": 5.0}
    watch = watch_over(scene, {"dead": dead, "wedged": wedged})
    rounds(scene, watch, 0.5)
    dead.up = False
    scene.answers["http://w:1"] = POLICY.inference_deadline_s + 1
    rounds(scene, watch, 2.0)
    assert scene.verdicts == [(0.5, "dead", Verdict.DEAD), (0.5, "wedged", Verdict.HUNG)]


def test_a_replaced_child_of_the_same_name_is_watched_afresh(scene: Scene) -> None:
    """A child that left and came back under the same name (a new process) starts with a clean
    record: it is not judged on its predecessor's silence."""
    children: dict[str, Any] = {"a": FakeChild("a", "http://a:1")}
    scene.answers = {"http://a:1": None}
    watch = watch_over(scene, children)
    rounds(scene, watch, 0.75)
    children["a"] = FakeChild("a", "http://a:2")
    scene.answers["http://a:2"] = None
    rounds(scene, watch, 1.5)
    assert scene.verdicts == [], "the new process was judged on the old one's silence"
