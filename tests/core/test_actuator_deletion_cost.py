"""The actuator applies a scale-down's deletion-cost marks (``SetPodDeletionCost``) before the scale, through the
in-memory fake cluster: the marks are metadata (never held by the guard, no Event per pod), and a mark not written
-- an API error, a successor pod, somebody else's cost -- never stops the scale-down itself."""

from __future__ import annotations

import pytest

from autoscaler.actuator import Actuator, GuardContext, is_destructive
from autoscaler.core.cluster import CHOSEN_DELETION_COST, DELETION_COST_BY_US, PodInfo
from autoscaler.core.model import Action, ScaleDeployment, SetPodDeletionCost
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import PortError

NOW = 1000.0


def _cluster() -> FakeCluster:
    cluster = FakeCluster()
    cluster.add_deployment("ml", "chat", 3)
    for i in range(3):
        cluster.add_pod(
            PodInfo("ml", f"chat-{i}", "n0", 1, 0, "Running", True, owner_kind="Deployment", owner_name="chat",
                    uid=f"u{i}")
        )  # fmt: skip
    return cluster


def _mark(name: str, cost: int | None = CHOSEN_DELETION_COST, uid: str | None = None) -> SetPodDeletionCost:
    return SetPodDeletionCost("ml", name, uid or f"u{name[-1]}", cost, Reason.SCALE_DOWN_CHOICE, "chosen", "chat")


SCALE = ScaleDeployment("ml", "chat", 2, 3, Reason.METRIC_BELOW_TARGET, "10 % < 70 %")


def _apply(cluster: FakeCluster, actions: list[Action], *, stale: bool = False) -> list[str]:
    context = GuardContext(NOW, {}, {"ml/chat": ("scrape too old",)} if stale else {})
    return [r.result for r in Actuator(cluster).apply(actions, context)]


def test_marks_go_before_the_scale_and_are_read_back() -> None:
    cluster = _cluster()
    assert _apply(cluster, [_mark("chat-2"), _mark("chat-1", None), SCALE]) == ["applied", "unchanged", "applied"]
    assert [w.op for w in cluster.writes] == ["set_pod_deletion_cost", "set_pod_deletion_cost", "scale_deployment"]
    pod = cluster.pods["ml/chat-2"]
    assert (pod.deletion_cost, pod.deletion_cost_by) == (CHOSEN_DELETION_COST, DELETION_COST_BY_US)
    assert [e.kind for e in cluster.events] == ["Deployment"]  # the scale's Event: none per pod marked
    assert _apply(cluster, [_mark("chat-2", None)]) == ["applied"]  # cleared
    assert (cluster.pods["ml/chat-2"].deletion_cost, cluster.pods["ml/chat-2"].deletion_cost_by) == (0, None)


@pytest.mark.parametrize(
    ("setup", "mark_result"),
    [
        (lambda c: c.fail("set_pod_deletion_cost", PortError("500 Internal Server Error")), "failed"),
        (lambda c: None, "gone"),  # the pod of that name has another uid now
        (lambda c: c.add_pod(PodInfo("ml", "chat-2", "n0", 1, 0, "Running", True, owner_kind="Deployment",
                                     owner_name="chat", uid="u2", deletion_cost=7, deletion_cost_by="")),
         "skipped"),  # a person's cost appeared since the read: not touched
    ],
    ids=["api error", "successor", "a person's cost"],
)  # fmt: skip
def test_a_mark_not_written_leaves_the_scale_down_applied(setup: object, mark_result: str) -> None:
    cluster = _cluster()
    setup(cluster)  # type: ignore[operator]
    uid = "another" if mark_result == "gone" else None
    assert _apply(cluster, [_mark("chat-2", uid=uid), SCALE]) == [mark_result, "applied"]
    assert cluster.deployments["ml/chat"].spec_replicas == 2


def test_marks_are_not_held_by_the_guard_the_scale_down_is() -> None:
    assert not is_destructive(_mark("chat-2"))
    cluster = _cluster()
    # stale metrics: the scale-down is held; the marks (ordering only) go, and the next scale-down uses them
    assert _apply(cluster, [_mark("chat-2"), SCALE], stale=True) == ["applied", "held"]


def test_dry_run_writes_no_mark_and_tells_no_pod() -> None:
    cluster = _cluster()
    results = Actuator(cluster, dry_run=True).apply([_mark("chat-2"), SCALE], GuardContext(NOW, {}))
    assert [r.result for r in results] == ["dry_run", "dry_run"]
    assert cluster.writes == [] and [e.kind for e in cluster.events] == ["Deployment"]
