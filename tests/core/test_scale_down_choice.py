"""Which replicas a scale-down removes (``core.scale_down_choice``, ``capacity.choose_scale_down_replicas``).

Three 8-GPU nodes; the service ``ml/chat`` (priority 100, one GPU a replica) runs 4 replicas on n0 (4 GPUs free), 2
on n1 beside a 4-GPU trainer (2 free) and 6 on n2 (2 free); an 8-GPU training pod (priority 0) waits. The
ReplicaSet's own order takes the doubled-up n2 first (a hole for the trainer after 6 deletions); the chosen order
takes n0 first (a hole after 4). The marks go right before the scale-down; the hold predicts with the same order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import (
    CHOSEN_DELETION_COST,
    DELETION_COST_BY_US,
    ClusterSnapshot,
    NodeInfo,
    PodInfo,
    WaitingGpuWork,
    deployment_pods,
    hole_for_waiting_work,
    node_room,
    replica_removal_order,
    waiting_gpu_work,
)
from autoscaler.core.model import (
    Action,
    ControllerState,
    Observation,
    PodMetrics,
    RateKind,
    RatePolicy,
    ScaleDeployment,
    ScalingRules,
    ServiceObservation,
    ServicePolicy,
    SetPodDeletionCost,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.scale_down_choice import choosing, mark_scale_downs
from autoscaler.core.tick import TickConfig, TickInput, decide_tick

NOW = 100_000.0
KEY = "ml/chat"
LAYOUT = {"n0": 4, "n1": 2, "n2": 6}  # node -> chat replicas


def _replicas(**overrides: PodInfo) -> list[PodInfo]:
    pods = []
    for node, count in LAYOUT.items():
        for i in range(count):
            name = f"chat-{node}-{i}"
            pod = PodInfo(
                "ml", name, node, 1, 100, "Running", True, owner_kind="Deployment", owner_name="chat",
                created_at=NOW - 5000 + len(pods), ready_at=NOW - 4000 + len(pods), uid=f"uid-{name}",
            )  # fmt: skip
            pods.append(overrides.get(name, pod))
    return pods


TRAINER = PodInfo("train", "t-0", "n1", 4, 0, "Running", True, owner_kind="Job", owner_name="t", gang="job/train/t")
WAITING = PodInfo("train", "big-0", None, 8, 0, "Pending", False, owner_kind="Job", owner_name="big")


def _snapshot(replicas: list[PodInfo], *, waiting: bool = True) -> ClusterSnapshot:
    nodes = tuple(NodeInfo(n, 8, "A100", None, True) for n in LAYOUT)
    pods = (*replicas, TRAINER, *((WAITING,) if waiting else ()))
    return ClusterSnapshot(NOW, pods=pods, nodes=nodes)


POLICY = ServicePolicy(
    "ml", "chat", min_replicas=1, max_replicas=20, priority=100,
    scale_down=ScalingRules(0.0, (RatePolicy(RateKind.PERCENT, 100, 15.0),)),
)  # fmt: skip


def _ours(pod: PodInfo, cost: int = CHOSEN_DELETION_COST) -> PodInfo:
    return replace(pod, deletion_cost=cost, deletion_cost_by=DELETION_COST_BY_US)


def _marks(actions: tuple[Action, ...]) -> list[tuple[str, int | None]]:
    return [(a.name, a.cost) for a in actions if isinstance(a, SetPodDeletionCost)]


def _plan(replicas: list[PodInfo], scale: ScaleDeployment, *, waiting: bool = True) -> tuple[Action, ...]:
    snapshot = _snapshot(replicas, waiting=waiting)
    pods = deployment_pods(snapshot)
    chosen = choosing({KEY: POLICY}, pods, waiting_gpu_work(snapshot))
    return mark_scale_downs((scale,), pods, chosen, node_room(snapshot, chosen).free)


DOWN_2 = ScaleDeployment("ml", "chat", 10, 12, Reason.METRIC_BELOW_TARGET, "")
BASE = {p.name: p for p in _replicas()}
N0 = sorted(name for name in BASE if name.startswith("chat-n0"))
N2 = sorted(name for name in BASE if name.startswith("chat-n2"))

CASES = [
    # (id, replicas overridden, the scale, work waiting, the marks expected in order)
    # the two n0 replicas the ReplicaSet ranks first there (latest ready first), marked; nothing else
    ("marks the roomiest node", {}, DOWN_2, True, [("chat-n0-3", -1), ("chat-n0-2", -1)]),
    # marks of ours left on n2 by an earlier tick: removed, the n0 ones set
    (
        "clears our stale marks",
        {N2[0]: _ours(BASE[N2[0]])},
        DOWN_2,
        True,
        [("chat-n0-3", -1), ("chat-n0-2", -1), (N2[0], None)],
    ),
    # already marked so: not written again
    ("keeps a mark already there", {"chat-n0-3": _ours(BASE["chat-n0-3"])}, DOWN_2, True, [("chat-n0-2", -1)]),
    # somebody else's cost on one replica (even 0 written by hand): the Deployment is not touched
    ("skips a person's cost", {N2[0]: replace(BASE[N2[0]], deletion_cost=5, deletion_cost_by="")}, DOWN_2, True, []),
    ("skips a person's zero", {N2[0]: replace(BASE[N2[0]], deletion_cost_by="")}, DOWN_2, True, []),
    # nothing waits: no marks ...
    ("no waiting work", {}, DOWN_2, False, []),
    # ... and ours left from earlier removed, so that the ReplicaSet deletes in its own order
    ("no waiting work clears ours", {N2[0]: _ours(BASE[N2[0]])}, DOWN_2, False, [(N2[0], None)]),
    # a scale-up removes nothing
    ("scale-up", {}, ScaleDeployment("ml", "chat", 14, 12, Reason.METRIC_ABOVE_TARGET, ""), True, []),
]


@pytest.mark.parametrize(
    ("overrides", "scale", "waiting", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_chooser(
    overrides: dict[str, PodInfo], scale: ScaleDeployment, waiting: bool, expected: list[tuple[str, int | None]]
) -> None:
    replicas = [overrides.get(p.name, p) for p in _replicas()]
    actions = _plan(replicas, scale, waiting=waiting)
    assert _marks(actions) == expected
    assert actions[-1] is scale  # the marks go before the scale, which is never dropped
    for action in actions[:-1]:
        assert isinstance(action, SetPodDeletionCost)
        assert action.reason is Reason.SCALE_DOWN_CHOICE and action.detail and action.deployment == "chat"
        assert action.uid == f"uid-{action.name}"  # the pod the plan was made from


def test_work_of_a_higher_priority_is_no_reason_to_choose() -> None:
    high = {KEY: replace(POLICY, priority=-5)}  # the waiting trainer (0) is above the service
    snapshot = _snapshot(_replicas())
    assert choosing(high, deployment_pods(snapshot), waiting_gpu_work(snapshot)) == frozenset()
    assert choosing({KEY: POLICY}, deployment_pods(snapshot), waiting_gpu_work(snapshot)) == {KEY}


def test_the_hold_sees_the_holes_the_chosen_deletions_open() -> None:
    snapshot = _snapshot(_replicas())
    waiting = [WaitingGpuWork(0, 8)]
    # the ReplicaSet's own order: n2's six replicas go first, then n2 (2 free) has 8
    assert hole_for_waiting_work(node_room(snapshot), KEY, waiting) == (6, 8)
    # the chosen order: n0's four (4 free) go first
    chosen = node_room(snapshot, {KEY})
    assert hole_for_waiting_work(chosen, KEY, waiting) == (4, 8)
    # one order for both: the pods the chooser marks are the hold's first ones
    order = [p.node for p in replica_removal_order(deployment_pods(snapshot)[KEY], chosen.free)]
    assert [node for node, _ in chosen.removal_order[KEY]] == order
    marked = _marks(_plan(_replicas(), ScaleDeployment("ml", "chat", 8, 12, Reason.METRIC_BELOW_TARGET, "")))
    assert {name for name, _ in marked} == set(N0)


def test_our_own_marks_do_not_steer_the_choice_a_persons_do() -> None:
    """The chooser sets its marks again from the order: one of ours counts as no cost; a person's ranks as the
    ReplicaSet ranks it."""
    ours = [_ours(p) if p.name == N2[0] else p for p in _replicas()]
    free = node_room(_snapshot(ours), {KEY}).free
    assert replica_removal_order(ours, free)[0].node == "n0"
    assert replica_removal_order(ours)[0].name == N2[0]  # the ReplicaSet itself honours our mark


def _tick(capacity: CapacityConfig, replicas: list[PodInfo]) -> tuple[Action, ...]:
    # 12 replicas at 10 % utilisation for a 70 % target: 2 wanted
    obs = ServiceObservation(KEY, 12, 12, pods=PodMetrics(12, 120.0))
    tick = TickInput(NOW, Observation(NOW, {KEY: obs}), _snapshot(replicas), {KEY: POLICY})
    plan, _ = decide_tick(tick, ControllerState(), TickConfig(capacity=capacity))
    return plan.actions


def test_the_tick_marks_before_its_scale_down_only_when_on() -> None:
    off = _tick(CapacityConfig(preempt=False, burst=False), _replicas())
    scale = [a for a in off if isinstance(a, ScaleDeployment)]
    assert len(scale) == 1 and scale[0].replicas < 12
    assert _marks(off) == []  # off (the default): no action but the scale, even with our marks left on pods
    assert _marks(_tick(CapacityConfig(preempt=False, burst=False), [_ours(p) for p in _replicas()])) == []
    on = _tick(CapacityConfig(preempt=False, burst=False, choose_scale_down_replicas=True), _replicas())
    removed = 12 - scale[0].replicas
    assert [type(a) for a in on] == [SetPodDeletionCost] * removed + [ScaleDeployment]
    order = replica_removal_order(_replicas(), node_room(_snapshot(_replicas()), {KEY}).free)
    assert [name for name, _ in _marks(on)] == [p.name for p in order[:removed]]
