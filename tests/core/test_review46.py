"""Review 46: the give-back while shortfalls are only waited out (a9d0bd4) and the waiting work that starts on the
GPUs free now (``core.cluster.waiting_for_room``, 006c7f8).

Findings first (each a failing test before its fix, or a strict xfail where it is left), then the behaviour checked
and found right, pinned.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import (
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodInfo,
    Taint,
    WorkloadInfo,
    waiting_for_room,
    waiting_gpu_work,
)
from autoscaler.core.model import CapacityState, ControllerState, ScaleDecision, ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.core.tick import ForecastReadConfig, TickConfig, _SnapshotFacts, decide_tick
from forecast.types import Forecast
from tests.core.test_arbitrate import NOW, full_cluster, replica
from tests.core.test_arbitrate_wait_out import RATE_CHAT, RISK_10, flat
from tests.core.test_review39_predictive import A100, CHAT, CHAT_NO_WINDOW, SPREAD, _desired, _earned, _tick
from tests.core.test_review45 import H100, SEARCH, chosen

# ---- arbitration: two services, both waited out ------------------------------------------------------------------

BOTH = replace(RISK_10, slo_risk_per_gpu_hour=1.0, pools=(H100,), burst_idle_cooldown_s=600.0)


def _chat_and_search(  # type: ignore[no-untyped-def]
    search_reason: Reason = Reason.FORECAST_FLOOR, search_forecast: bool = True, config: CapacityConfig = BOTH
):
    """chat (A100, priority 1000) full on n1 and search (A100, 500) full on n4, each one replica short at its P99
    (cheaper to wait out: 1 GPU-hour at 1 against a stopped gang), two 8-GPU gangs on n2 and n3, and an idle H100
    burst node b0 neither can use. Fifteen ticks a minute apart: the minutes a node is given back, the last report
    and state."""
    base = full_cluster()
    search = [
        PodInfo("inference", f"search-{i}", "n4", 1, 500, "Running", True, "Deployment", "search", created_at=NOW)
        for i in range(8)
    ]
    snapshot = replace(
        base,
        pods=(*base.pods, *search),
        nodes=(*base.nodes, NodeInfo("n4", 8, "A100", "onprem", True), NodeInfo("b0", 8, "H100", "h100", True)),
        deployments=(
            DeploymentInfo("inference", "chat", 9, 8, gpu_product="A100"),
            DeploymentInfo("inference", "search", 9, 8, gpu_product="A100"),
        ),
    )
    state = CapacityState()
    given_back: list[int] = []
    for minute in range(15):
        now = NOW + 60.0 * minute
        forecasts = {RATE_CHAT.key: (flat(9.0, now), 0.99, 90.0)}
        if search_forecast:
            forecasts[SEARCH.key] = (flat(9.0, now), 0.99, 90.0)
        decisions = [
            ScaleDecision(RATE_CHAT.key, 8, 9, Reason.FORECAST_FLOOR, ""),
            ScaleDecision(SEARCH.key, 8, 9, search_reason, ""),
        ]
        arb = ArbitrationInput(
            now, replace(snapshot, time=now), {RATE_CHAT.key: RATE_CHAT, SEARCH.key: SEARCH}, decisions, forecasts
        )
        actions, report, state = arbitrate(arb, state, config)
        given_back += [minute for a in actions if isinstance(a, ScaleNodePool) and a.nodes < a.previous_nodes]
    return given_back, report, state


def test_two_waited_out_services_of_one_gpu_type_still_give_back_a_pool_neither_can_use() -> None:
    """Fixed (was a strict xfail).

    WRONG: search's shortfall is cheaper to wait out too, but what it would free chat's Pending pod takes first, so
    its wait is recorded as "behind chat" (``_Blocker.waited_out`` False: a wait by choice *and* behind another
    service). ``waited_out_only`` asks every waiting service to be a ``waited_out`` blocker, so two services of one
    GPU type waiting out their P99 together held every give-back, as before a9d0bd4: the idle H100 node (48/h) that
    neither can use stayed for as long as both forecasts stayed above capacity. RIGHT: a service whose own shortfall
    is cheaper to wait out waits by choice whoever stands before it; both waits are choices, and the H100 node goes
    after its 600 s as with chat alone (``test_review45``)."""
    given_back, report, state = _chat_and_search()
    assert "waited out" in chosen(report, RATE_CHAT.key).detail
    assert "inference/chat (priority 1000)" in chosen(report, SEARCH.key).detail  # behind chat, as before
    assert state.free_since is None and state.short_since is None
    assert given_back == [10], report.notes


def test_a_waited_out_service_beside_one_that_confirms_holds_every_give_back() -> None:
    """Checked: search's shortfall without a forecast is not confirmed for the whole quarter hour (a constraint, not a
    choice): nothing is given back while it confirms, the H100 node included -- its timer never starts."""
    confirming = replace(BOTH, shortfall_confirm_s=3600.0)
    given_back, report, state = _chat_and_search(Reason.METRIC_ABOVE_TARGET, False, confirming)
    assert "waited out" in chosen(report, RATE_CHAT.key).detail
    wait = chosen(report, SEARCH.key)
    assert wait.kind == "wait" and wait.cost == 0.0  # not priced: not a wait-out
    assert given_back == [] and state.burst_unneeded_since == {}


# ---- the contended hold: work that starts on the GPUs free now ---------------------------------------------------

# 32 req/s in the first minute, 16 until minute 20, then 88 (28 replicas at 3.2) to the end: chat runs 20 (SPREAD:
# n1 and n2 full, n3 with 4 free), the floor asks for 10 within the cold start, the window's edge for 28.
_RISE = [32.0] + [16.0] * 19 + [88.0] * 10
RISE = Forecast(start=0.0, step_s=60.0, quantiles={0.5: _RISE, 0.99: _RISE}, model="rise")
N4 = NodeInfo("n4", 8, "A100", None, True)
TRAINER = PodInfo("ml", "trainer", None, 8, 100, "Pending", False, "Job", "trainer", cpu_milli=16_000, tolerations=())


def _contended(pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...]) -> int:
    """chat's replicas after a tick with ``pods`` beside SPREAD on ``nodes``: 13 when the contended hold keeps the
    8-GPU hole on n1 closed, 10 (the cold start's floor) when it does not."""
    snapshot = ClusterSnapshot(0.0, pods=(*SPREAD, *pods), nodes=nodes)
    tick = _tick({CHAT.key: CHAT_NO_WINDOW}, {CHAT.key: _earned(CHAT, RISE)}, {CHAT.key: (20, 16.0)}, snapshot)
    plan, _ = decide_tick(tick, ControllerState(), TickConfig(ForecastReadConfig(contended_hold_s=1800.0)))
    return _desired(plan, CHAT.key)


def test_the_reference_holds() -> None:
    """The reference: n4 full, the trainer can only take the hole a scale-down opens on n1: held at 13. With n4 free
    and the trainer fitting there, it starts on n4 and takes no hole: 10 (006c7f8's point)."""
    busy = PodInfo("ml", "busy", "n4", 8, 5000, "Running", True, "Job", "busy")
    assert _contended((TRAINER, busy), (*A100, N4)) == 13
    assert _contended((TRAINER,), (*A100, N4)) == 10


def test_work_lacking_cpu_beside_the_free_gpus_waits_for_the_hole() -> None:
    """Fixed (was a strict xfail).

    WRONG: the 8-GPU trainer (16 CPUs) fits n4's 8 free GPUs by count, but n4 has 2 CPUs left beside them
    (``NodeInfo.free_beside_gpus``): kube-scheduler leaves it Pending there. ``waiting_for_room`` counted GPUs
    only, so the trainer was taken to "wait for something else (CPU or memory)" and the hold dropped: chat 20 -> 10,
    and the hole on n1 -- GPUs *and* the CPUs chat's replicas held there -- is exactly where it starts, to be
    preempted at the rise. RIGHT: free GPUs are room only with the CPU and memory the pod requests beside them,
    where the node says (as the arbitration places replicas): the trainer waits for the hole, 13."""
    starved = replace(N4, free_beside_gpus=(2_000, 1 << 40))
    assert _contended((TRAINER,), (*A100, starved)) == 13
    snapshot = ClusterSnapshot(0.0, pods=(*SPREAD, TRAINER), nodes=(*A100, starved))
    assert [w.gpus for w in waiting_for_room(waiting_gpu_work(snapshot), snapshot)] == [8]


def test_two_trainers_and_one_free_node_one_waits_for_the_hole() -> None:
    """Fixed (was a strict xfail).

    WRONG: two 8-GPU trainers Pending and one free 8-GPU node: each judged alone fits n4, so neither counted as
    waiting for room, and the hold dropped this tick (20 -> 10). The scheduler binds one to n4; the other starts in
    the hole the scale-down opens on n1 -- the one the hold is for -- and is preempted at the rise. "Judged at the
    next tick" is too late: the scale-down is this tick's. RIGHT: the free GPUs hold what they hold once: the waiting
    work takes them in the scheduler's order (higher priority first), what does not fit then waits for room: 13."""
    second = replace(TRAINER, name="trainer-2", owner_name="trainer-2")
    assert _contended((TRAINER, second), (*A100, N4)) == 13


def test_a_higher_priority_pending_replica_takes_the_free_gpus_first() -> None:
    """Fixed (was a strict xfail).

    WRONG: a Pending 8-GPU replica of another service (priority 2000) and the trainer (100) both fit n4 alone: the
    trainer was not counted as waiting, though the scheduler binds the replica there first and the trainer then
    waits -- for the hole on n1. RIGHT: higher priority first: the trainer waits for room, the hold stands (13)."""
    replica = PodInfo("ml", "big-0", None, 8, 2000, "Pending", False, "Deployment", "big", tolerations=())
    assert _contended((replica, TRAINER), (*A100, N4)) == 13
    snapshot = ClusterSnapshot(0.0, pods=(replica, TRAINER), nodes=(N4,))
    assert [w.priority for w in waiting_for_room(waiting_gpu_work(snapshot), snapshot)] == [100]


# ---- waiting_for_room: checked and found right -------------------------------------------------------------------


def _room(pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...], workloads: tuple[WorkloadInfo, ...] = ()):  # type: ignore[no-untyped-def]
    snapshot = ClusterSnapshot(0.0, pods=pods, nodes=nodes, workloads=workloads)
    waiting = waiting_gpu_work(snapshot)
    assert waiting, "the case must have waiting work"
    return waiting_for_room(waiting, snapshot, {"burst"})


def _pending(name: str, gpus: int, **kw: object) -> PodInfo:
    return PodInfo("ml", name, None, gpus, 100, "Pending", False, "Job", name, **kw)  # type: ignore[arg-type]


def _gang(name: str, gpus: int, count: int, min_available: int | None = None) -> tuple[PodInfo, ...]:
    return tuple(
        replace(_pending(f"{name}-{i}", gpus), owner_name=name, gang=f"job/ml/{name}", gang_min_available=min_available)
        for i in range(count)
    )


FREE8 = NodeInfo("f1", 8, "A100", None, True)
# a full A100 node beside, so that work selecting A100 is not left out as fitting no node of its type
FULL = NodeInfo("full", 8, "A100", None, True)
BUSY = PodInfo("ml", "busy", "full", 8, 5000, "Running", True, "Job", "busy")


@pytest.mark.parametrize(
    ("pods", "nodes", "waits"),
    [
        pytest.param(
            _gang("g", 2, 2, min_available=4), (FREE8,), True,
            id="a gang with fewer pods than its minAvailable cannot start: it is still counted (as before 006c7f8)",
        ),
        pytest.param(
            _gang("g", 4, 2), (FREE8,), False, id="a 2 x 4 gang fits one free 8-GPU node whole",
        ),
        pytest.param(
            (_pending("p", 4),), (replace(FREE8, gpu_product=None),), False,
            id="work selecting no GPU type: an unlabelled node is room",
        ),
        pytest.param(
            (_pending("p", 4, gpu_product="A100"), BUSY), (replace(FREE8, gpu_product=None), FULL), True,
            id="work selecting A100: an unlabelled node is no room",
        ),
        pytest.param((_pending("p", 4),), (replace(FREE8, leaving=True),), True, id="a leaving node is no room"),
        pytest.param(
            (_pending("p", 4), BUSY), (replace(FREE8, ready=False), FULL), True, id="a node not ready is no room",
        ),
        pytest.param(
            (_pending("p", 4), PodInfo("ml", "old", "f1", 8, 100, "Running", True, "Job", "old", terminating=True)),
            (FREE8,), True, id="a terminating pod's GPUs are not free yet",
        ),
        pytest.param(
            (_pending("p", 4, tolerations=None),), (replace(FREE8, taints=(Taint("dedicated", "x"),)),), False,
            id="tolerations not read: anywhere its GPU type allows (as pod_schedulable_on)",
        ),
        pytest.param(
            (_pending("p", 4, tolerations=()),), (replace(FREE8, taints=(Taint("dedicated", "x"),)),), True,
            id="no toleration read: a tainted node is no room",
        ),
        pytest.param(
            (_pending("p", 4, cpu_milli=4_000),), (replace(FREE8, free_beside_gpus=(8_000, 1 << 30)),), False,
            id="CPU enough beside the free GPUs: room",
        ),
        # fixed (was a strict xfail)
        pytest.param(
            (_pending("p", 4, memory_bytes=1 << 31),), (replace(FREE8, free_beside_gpus=(8_000, 1 << 30)),), True,
            id="memory short beside the free GPUs: no room",
        ),
        # fixed (was a strict xfail)
        pytest.param(
            (*_gang("g", 4, 2), _pending("p", 1)), (FREE8,), True,
            id="a gang taking the free node whole leaves a 1-GPU pod of its priority waiting",
        ),
    ],
)  # fmt: skip
def test_waiting_for_room_edges(pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...], waits: bool) -> None:
    assert bool(_room(pods, nodes)) is waits


def test_a_gangs_pods_are_placed_once() -> None:
    """Fixed (was a strict xfail). A 4 x 2 gang's four entries (one per pending pod) take the 8 free GPUs once, not
    four times: a 2-GPU pod of lower priority then waits (judged alone it fit the same 8), and so does each of the
    gang's own entries when the gang does not fit."""
    gang = tuple(replace(p, priority=200) for p in _gang("g", 2, 4))
    left = _room((*gang, _pending("p", 2)), (FREE8,))
    assert [(w.priority, w.gpus) for w in left] == [(100, 2)]
    left = _room(_gang("g", 4, 4), (FREE8,))
    assert len(left) == 4  # 16 GPUs on one 8-GPU node: every entry of it waits


def test_the_cache_is_keyed_by_the_pools_that_are_no_room() -> None:
    """``_SnapshotFacts.waiting_for_room`` keeps one answer per set of burst pools: the same snapshot asked with and
    without the burst pool gives each its own (a burst node's free GPUs are room only when it is no burst pool --
    as with capacity arbitration off, no pool known)."""
    snapshot = ClusterSnapshot(0.0, pods=(_pending("p", 4),), nodes=(replace(FREE8, pool="burst"),))
    facts = _SnapshotFacts(snapshot)
    assert len(facts.waiting_for_room(frozenset({"burst"}))) == 1
    assert facts.waiting_for_room(frozenset()) == ()
    assert len(facts.waiting_for_room(frozenset({"burst"}))) == 1


def test_work_this_controller_suspended_takes_no_free_gpus() -> None:
    """A workload suspended by this controller waits for its resume (beyond the reserve), so it is always counted
    and takes none of the free GPUs from the work behind it: a 4-GPU pod still starts on the node's 8."""
    by_us = WorkloadInfo("Job", "ml", "w", "job/ml/w", True, 500, (8,), None, -60.0)
    left = _room((_pending("p", 4),), (FREE8,), (by_us,))
    assert [(w.gpus, w.resumed_by_us) for w in left] == [(8, True)]


def test_alike_work_fills_the_free_gpus_then_waits() -> None:
    """Three 4-GPU pods alike and 8 free GPUs: two start, the third waits (a shape that no longer fits is not
    placed again: the room only shrinks)."""
    left = _room(tuple(_pending(f"p{i}", 4) for i in range(3)), (FREE8,))
    assert [w.gpus for w in left] == [4]


def test_a_pool_with_one_node_the_waiting_replicas_may_use_is_held_whole() -> None:
    """Checked: chat's replicas take 8 GPUs and one is short, waited out. An A100 burst pool of two nodes: b0 runs a
    stray 1-GPU pod (7 free: no room for a replica), b1 is idle but tainted against chat's pods. A node bought there
    may host chat (not every registered node is barred to it), so the pool's timer stands while chat waits out its
    shortfall -- b1 is not given back, the note says why. With b0 tainted too, the pool is no room for chat at all
    and its idle node goes after the 600 s."""
    taint = Taint("dedicated", "batch")
    pool = BurstPool("a100", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=2, min_nodes=0, max_nodes=2)
    config = replace(RISK_10, slo_risk_per_gpu_hour=1.0, pools=(pool,), burst_idle_cooldown_s=600.0)
    big = replace(RATE_CHAT, gpus_per_replica=8)
    stray = PodInfo("inference", "embed-0", "b0", 1, 1000, "Running", True, "Deployment", "embed")

    def given_back(tainted: tuple[str, ...]) -> tuple[list[int], tuple[str, ...]]:
        base = full_cluster()
        burst = tuple(
            NodeInfo(n, 8, "A100", "a100", True, taints=(taint,) if n in tainted else ()) for n in ("b0", "b1")
        )
        snapshot = replace(
            base,
            pods=(replace(replica(0, "n1"), gpus=8), *(p for p in base.pods if p.owner_kind != "Deployment"), stray),
            nodes=(*base.nodes, *burst),
            deployments=(DeploymentInfo("inference", "chat", 2, 1, gpu_product="A100", gpus_per_pod=8),),
        )
        minutes: list[int] = []
        state, notes = CapacityState(), ()
        for minute in range(12):
            now = NOW + 60.0 * minute
            arb = ArbitrationInput(
                now,
                replace(snapshot, time=now),
                {big.key: big},
                [ScaleDecision(big.key, 1, 2, Reason.FORECAST_FLOOR, "")],
                {big.key: (flat(2.0, now), 0.99, 90.0)},
            )
            actions, report, state = arbitrate(arb, state, config)
            assert "waited out" in chosen(report, big.key).detail
            minutes += [minute for a in actions if isinstance(a, ScaleNodePool) and a.nodes < a.previous_nodes]
            notes = report.notes
        return minutes, notes

    minutes, notes = given_back(("b1",))
    assert minutes == [] and any("could host inference/chat" in n for n in notes), notes
    minutes, notes = given_back(("b0", "b1"))
    assert minutes == [10], notes
