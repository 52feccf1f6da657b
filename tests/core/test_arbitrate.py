"""Capacity arbitration (core/arbitrate.py): table-driven cases of the one decision -- preempt whole gangs or burst,
costed in one currency -- and of the give-back (burst nodes first, then resume, with hysteresis)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import (
    CapacityState,
    EvictPod,
    MetricKind,
    Mode,
    ResumeWorkload,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import TrainingRules
from forecast.types import Forecast

NOW = 100_000.0
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=0, min_nodes=0, max_nodes=4)


def node(name: str, gpus: int = 8, ready: bool = True, pool: str | None = "onprem") -> NodeInfo:
    return NodeInfo(name, gpus, "A100", pool, ready)


def replica(index: int, node_name: str | None) -> PodInfo:
    return PodInfo("inference", f"chat-{index}", node_name, 1, 1000, "Running" if node_name else "Pending",
                   node_name is not None, "Deployment", "chat", created_at=NOW - 3600)


def gang_pods(name: str, node_names: list[str], gpus: int = 8, checkpoint_age: float = 1800.0,
              started_ago: float = 7200.0, priority: int = 100) -> list[PodInfo]:
    return [
        PodInfo("ml", f"{name}-{i}", n, gpus, priority, "Running", True, "Job", name, gang=f"job/ml/{name}",
                created_at=NOW - started_ago, last_checkpoint_at=NOW - checkpoint_age)
        for i, n in enumerate(node_names)
    ]


def job(name: str, pods: int = 1, suspended: bool = False, by_us: float | None = None) -> WorkloadInfo:
    return WorkloadInfo("Job", "ml", name, f"job/ml/{name}", suspended, 100, (8,) * pods, None, by_us)


def decide(current: int, desired: int, mode: Mode = Mode.ACTIVE) -> ScaleDecision:
    return ScaleDecision(CHAT.key, current, desired, Reason.METRIC_ABOVE_TARGET, "", mode is Mode.RECOMMEND_ONLY)


def run(snapshot: ClusterSnapshot, desired: int, config: CapacityConfig, state: CapacityState | None = None,
        now: float = NOW, policy: ServicePolicy = CHAT, demand: float | None = None):
    """``demand``: a flat forecast of that many requests/s (1 per replica; median and P99 alike), usable."""
    bound = sum(1 for p in snapshot.pods if p.owner_name == "chat" and p.node)
    forecasts = {}
    if demand is not None:
        policy = replace(policy, metric=MetricKind.REQUEST_RATE, target=1.0)
        flat = Forecast(start=now, step_s=60.0, quantiles={0.5: (demand,) * 60, 0.99: (demand,) * 60}, model="flat")
        forecasts[policy.key] = (flat, 0.99, 90.0)
    arb = ArbitrationInput(now, snapshot, {policy.key: policy}, [decide(bound, desired, policy.mode)], forecasts)
    return arbitrate(arb, state or CapacityState(), config)


# Two on-prem nodes: chat holds 4 GPUs of n1, two 1-pod training jobs hold n2 (8) and 4 of n1... kept simple below.
def full_cluster(checkpoint_ages: tuple[float, float] = (1800.0, 60.0)) -> ClusterSnapshot:
    pods = [replica(i, "n1") for i in range(8)]
    pods += gang_pods("old-ckpt", ["n2"], checkpoint_age=checkpoint_ages[0])
    pods += gang_pods("new-ckpt", ["n3"], checkpoint_age=checkpoint_ages[1])
    return ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")),
                           workloads=(job("old-ckpt"), job("new-ckpt")))


@pytest.mark.parametrize(
    ("case", "snapshot", "desired", "config", "expected"),
    [
        ("free GPUs cover it: nothing to do",
         replace(full_cluster(), pods=tuple(replica(i, "n1") for i in range(4))), 8, CapacityConfig(), []),
        ("no burst pool: suspend the gang that loses least work (just checkpointed)",
         full_cluster(), 12, CapacityConfig(), [("suspend", "new-ckpt")]),
        ("the other gang when it is the one that just checkpointed",
         full_cluster((30.0, 3000.0)), 12, CapacityConfig(), [("suspend", "old-ckpt")]),
        ("a long shortfall with a cheap pool: burst instead of preempting",
         full_cluster(), 12,
         CapacityConfig(pools=(replace(POOL, price_per_gpu_hour=0.5),), assumed_shortfall_s=8 * 3600,
                        training_gpu_hour_value=5.0, slo_risk_per_gpu_hour=1.0),
         [("burst", "burst", 1)]),
        ("a short shortfall: boot + billing not worth it, preempt",
         full_cluster(), 12,
         CapacityConfig(pools=(replace(POOL, price_per_gpu_hour=0.01),), assumed_shortfall_s=120.0),
         [("suspend", "new-ckpt")]),
        # past the node's boot (300 s) but not boot + billing (360 s): worth it only because nothing else can cover it
        ("preemption off: burst even for a short shortfall (no preemptible capacity left)",
         full_cluster(), 12, CapacityConfig(pools=(POOL,), assumed_shortfall_s=330.0, preempt=False),
         [("burst", "burst", 1)]),
        # over before a node boots: a node would serve none of it (review 40)
        ("preemption off: no node for a shortfall over before it boots",
         full_cluster(), 12, CapacityConfig(pools=(POOL,), assumed_shortfall_s=120.0, preempt=False), []),
        ("training at the inference priority is not preemptible: burst",
         replace(full_cluster(), pods=tuple(replace(p, priority=1000) for p in full_cluster().pods)), 12,
         CapacityConfig(pools=(POOL,)), [("burst", "burst", 1)]),
        ("a gang inside its minimum runtime is not taken",
         replace(full_cluster(), pods=tuple(
             replace(p, created_at=NOW - 60) if p.gang == "job/ml/new-ckpt" else p for p in full_cluster().pods)),
         12, CapacityConfig(), [("suspend", "old-ckpt")]),
        ("need beyond every gang and no pool: nothing (and the report says why)",
         full_cluster(), 40, CapacityConfig(), []),
    ],
)
def test_one_decision(case: str, snapshot: ClusterSnapshot, desired: int, config: CapacityConfig,
                      expected: list[tuple]) -> None:
    actions, report, _ = run(snapshot, desired, config)
    got: list[tuple] = []
    for action in actions:
        if isinstance(action, SuspendWorkload):
            got.append(("suspend", action.name))
            assert action.reason is Reason.PREEMPT_FOR_INFERENCE and "GPU-h since checkpoint" in action.detail
        elif isinstance(action, ScaleNodePool):
            got.append(("burst", action.pool, action.nodes - action.previous_nodes))
            assert action.reason is Reason.BURST_SCALE_UP
        else:
            got.append((type(action).__name__,))
    assert got == expected, case
    if desired > 8 and expected:
        chosen = [o for o in report.options if o.chosen]
        assert len(chosen) == 1 and chosen[0].cost is not None
        assert {o.kind for o in report.options} == {"preempt", "burst"}


def test_gang_without_suspendable_workload_is_evicted_pod_by_pod() -> None:
    pods = [replica(i, "n1") for i in range(8)] + gang_pods("w", ["n2", "n3"], checkpoint_age=10)
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")))
    actions, _, _ = run(snapshot, 9, CapacityConfig())
    assert [(type(a), a.name) for a in actions] == [(EvictPod, "w-0"), (EvictPod, "w-1")]
    assert all(isinstance(a, EvictPod) and a.gang == "job/ml/w" for a in actions)


def test_booting_burst_node_covers_the_shortfall() -> None:
    snapshot = replace(full_cluster(), nodes=(*full_cluster().nodes, node("b0", ready=False, pool="burst")))
    actions, report, _ = run(snapshot, 12, CapacityConfig(pools=(POOL,)))
    assert actions == [] and report.shortfalls == ()


def test_recommend_only_service_is_not_arbitrated() -> None:
    policy = replace(CHAT, mode=Mode.RECOMMEND_ONLY)
    actions, _, _ = run(full_cluster(), 12, CapacityConfig(), policy=policy)
    assert actions == []


def _burst_snapshot(used_on_burst: int) -> ClusterSnapshot:
    pods = [replica(i, "n1") for i in range(4)] + [replica(10 + i, "b0") for i in range(used_on_burst)]
    return ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("b0", pool="burst")))


def test_burst_node_given_back_after_the_cooldown_only() -> None:
    config = CapacityConfig(pools=(POOL,), burst_idle_cooldown_s=600.0)
    state = CapacityState()
    shrink = []
    for minute in range(12):
        now = NOW + 60 * minute
        actions, _, state = run(replace(_burst_snapshot(2), time=now), 6, config, state, now=now)
        shrink += [(minute, a.nodes) for a in actions if isinstance(a, ScaleNodePool)]
    assert shrink == [(10, 0)]


def test_burst_node_kept_while_its_pods_do_not_fit_elsewhere() -> None:
    config = CapacityConfig(pools=(POOL,), burst_idle_cooldown_s=0.0)
    pods = [replica(i, "n1") for i in range(8)] + [replica(10, "b0")]
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("b0", pool="burst")))
    actions, report, _ = run(snapshot, 9, config)
    assert actions == [] and any("no node spare" in n for n in report.notes)


def _suspended_snapshot(now: float, burst_nodes: int = 0) -> ClusterSnapshot:
    nodes = [node("n1"), node("n2")] + [node(f"b{i}", pool="burst") for i in range(burst_nodes)]
    pods = [replica(i, "n1") for i in range(4)]
    return ClusterSnapshot(now, pods=tuple(pods), nodes=tuple(nodes),
                           workloads=(job("paused", suspended=True, by_us=NOW - 900),))


def test_resume_waits_for_the_quiet_period_then_resumes_once() -> None:
    config = CapacityConfig(resume_after_s=300.0)
    state = CapacityState()
    resumed = []
    for minute in range(8):
        now = NOW + 60 * minute
        actions, _, state = run(_suspended_snapshot(now), 4, config, state, now=now)
        resumed += [(minute, a.name) for a in actions if isinstance(a, ResumeWorkload)]
    # a cluster would show the Job unsuspended after the first resume; the snapshot here does not change, so the
    # decision repeats each tick (idempotent): what matters is that none comes before the quiet period
    assert resumed[0] == (5, "paused") and all(m >= 5 for m, _ in resumed)


def test_resume_waits_while_burst_nodes_are_up() -> None:
    config = CapacityConfig(pools=(replace(POOL, nodes=1),), resume_after_s=0.0, burst_idle_cooldown_s=3600.0)
    actions, report, _ = run(_suspended_snapshot(NOW, burst_nodes=1), 4, config, CapacityState(free_since=NOW - 999))
    assert not any(isinstance(a, ResumeWorkload) for a in actions)
    assert any("burst nodes are given back first" in n for n in report.notes)


def test_resume_refused_when_the_gang_does_not_fit() -> None:
    snapshot = replace(_suspended_snapshot(NOW), workloads=(job("paused", pods=3, suspended=True, by_us=NOW - 900),))
    actions, report, _ = run(snapshot, 4, CapacityConfig(resume_after_s=0.0), CapacityState(free_since=NOW - 999))
    assert actions == [] and any("do not fit" in n for n in report.notes)


def test_workloads_suspended_by_somebody_else_are_not_resumed() -> None:
    snapshot = replace(_suspended_snapshot(NOW), workloads=(job("theirs", suspended=True, by_us=None),))
    actions, _, _ = run(snapshot, 4, CapacityConfig(resume_after_s=0.0), CapacityState(free_since=NOW - 999))
    assert actions == []


def test_shortfall_resets_the_quiet_period() -> None:
    _, _, state = run(full_cluster(), 12, CapacityConfig(), CapacityState(free_since=NOW - 5000))
    assert state.free_since is None and state.short_since == NOW


def test_rules_protect_non_preemptible_label() -> None:
    pods = [replica(i, "n1") for i in range(8)]
    pods += [replace(p, labels={"gpuautoscaler.dev/preemptible": "false"}) for p in gang_pods("keep", ["n2"])]
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2")), workloads=(job("keep"),))
    actions, report, _ = run(snapshot, 9, CapacityConfig(training=TrainingRules()))
    assert actions == []
    assert any(c.why_not and "preemptible=false" in c.why_not for c in report.candidates)


def test_a_service_pinned_to_a_gpu_type_takes_gpus_of_that_type_only() -> None:
    """The H100 service's replicas cannot use A100 GPUs: the (more expensive) H100 gang is the victim, and a pool of
    the wrong type is no option."""
    from autoscaler.core.cluster import DeploymentInfo

    nodes = (NodeInfo("a1", 8, "A100", "onprem", True), NodeInfo("h1", 8, "H100", "onprem", True),
             NodeInfo("h2", 8, "H100", "onprem", True))
    pods = [replica(i, "h1") for i in range(8)]
    pods += gang_pods("cheap-a100", ["a1"], checkpoint_age=10.0)
    pods += gang_pods("dear-h100", ["h2"], checkpoint_age=3000.0)
    snapshot = ClusterSnapshot(NOW, deployments=(DeploymentInfo("inference", "chat", 8, 8, gpu_product="H100"),),
                               pods=tuple(pods), nodes=nodes, workloads=(job("cheap-a100"), job("dear-h100")))
    actions, report, _ = run(snapshot, 10, CapacityConfig(pools=(POOL,), assumed_shortfall_s=60.0))
    assert [(type(a), a.name) for a in actions] == [(SuspendWorkload, "dear-h100")]
    burst = [o for o in report.options if o.kind == "burst"]
    assert burst and burst[0].cost is None and "GPU type A100 is not H100" in burst[0].detail


# A busy burst node: 5 of its 8 GPUs hold chat replicas, so the half-used rule keeps it; the cluster's own nodes are
# full (n1 of chat, n2 of one training gang). Emptying it means stopping that gang.
def _busy_burst(checkpoint_age: float = 1800.0, extra: tuple[PodInfo, ...] = ()) -> ClusterSnapshot:
    pods = [replica(i, "n1") for i in range(8)] + [replica(10 + i, "b0") for i in range(5)]
    pods += gang_pods("queued-in", ["n2"], checkpoint_age=checkpoint_age)
    return ClusterSnapshot(NOW, pods=(*pods, *extra), nodes=(node("n1"), node("n2"), node("b0", pool="burst")),
                           workloads=(job("queued-in"),))


BUSY_POOL = replace(POOL, nodes=1)


def _give_back_over(snapshot: ClusterSnapshot, config: CapacityConfig, minutes: int,
                    demand: float = 8.0) -> list[tuple[int, object]]:
    state = CapacityState()
    out: list[tuple[int, object]] = []
    for minute in range(minutes):
        now = NOW + 60 * minute
        actions, _, state = run(replace(snapshot, time=now), 13, config, state, now=now, demand=demand)
        out += [(minute, a) for a in actions]
    return out


@pytest.mark.parametrize(
    ("case", "checkpoint_age", "horizon_s", "price", "emptied"),
    [
        # at minute 10 (the cooldown over): keep 8 GPUs x 4 $ x 0.5 h = 16 $; empty = the gang's 8 GPUs x 0.5 h x 2 $
        # (8 $) + its work since the checkpoint, 8 GPUs x 825 s = 1.83 GPU-h x 2 $ (3.67 $) + 5 cold starts of 90 s
        # x 20 $/GPU-h (2.5 $) = 14.17 $
        ("training on-prem is cheaper than the burst node", 225.0, 1800.0, 4.0, True),
        # checkpointed 600 s earlier: 8 GPUs x 1,500 s = 3.33 GPU-h lost, 6.67 $: 17.17 $ > 16 $
        ("the gang would lose too much work", 900.0, 1800.0, 4.0, False),
        # a cheap burst node (1 $/GPU-h: 4 $ over the horizon) is kept
        ("the burst node is cheap", 225.0, 1800.0, 1.0, False),
        ("consolidation off", 225.0, 0.0, 4.0, False),
    ],
)
def test_busy_burst_node_emptied_when_stopping_training_costs_less(
    case: str, checkpoint_age: float, horizon_s: float, price: float, emptied: bool
) -> None:
    pool = replace(BUSY_POOL, price_per_gpu_hour=price)
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=600.0, consolidate_horizon_s=horizon_s)
    snapshot = _busy_burst(checkpoint_age=checkpoint_age)
    got = _give_back_over(snapshot, config, 12)
    if not emptied:
        assert got == [], case
        return
    # nothing before the cooldown; then, in one tick, the gang suspended and the node given back
    assert [m for m, _ in got] == [10, 10], case
    suspend, shrink = got[0][1], got[1][1]
    assert isinstance(suspend, SuspendWorkload) and suspend.name == "queued-in"
    assert suspend.reason is Reason.PREEMPT_FOR_INFERENCE and suspend.service == CHAT.key
    assert isinstance(shrink, ScaleNodePool) and (shrink.nodes, shrink.previous_nodes) == (0, 1)
    assert shrink.reason is Reason.BURST_SCALE_DOWN and shrink.remove_node == "b0"
    assert "empty b0" in shrink.detail and "stopping job/ml/queued-in" in shrink.detail


def test_busy_burst_node_whose_replicas_fit_elsewhere_goes_without_stopping_anything() -> None:
    # 5 replicas on the burst node (over half used), 6 GPUs free on n2: no training to stop, only cold starts
    pods = [replica(i, "n1") for i in range(8)] + [replica(10 + i, "b0") for i in range(5)]
    pods += gang_pods("small", ["n2"], gpus=2)
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("b0", pool="burst")))
    got = _give_back_over(snapshot, CapacityConfig(pools=(BUSY_POOL,), burst_idle_cooldown_s=600.0), 12)
    assert [(m, type(a).__name__) for m, a in got] == [(10, "ScaleNodePool")]
    assert "stopping nothing" in got[0][1].detail and got[0][1].remove_node == "b0"


def test_burst_node_with_a_pod_we_do_not_manage_is_not_emptied() -> None:
    stray = PodInfo("other", "batch-0", "b0", 1, 1000, "Running", True, "Deployment", "batch", created_at=NOW)
    config = CapacityConfig(pools=(BUSY_POOL,), burst_idle_cooldown_s=0.0)
    actions, report, _ = run(_busy_burst(extra=(stray,)), 13, config, demand=8.0)
    assert actions == []
    assert any("not a managed replica" in note for note in report.notes), report.notes


def test_busy_burst_node_kept_when_no_lower_priority_gang_makes_room() -> None:
    # the gang on n2 (priority 500, preemptible by the rules) outranks this chat service (300): nothing may be
    # stopped for it, the node stays and the note says why
    pods = [replica(i, "n1") for i in range(8)] + [replica(10 + i, "b0") for i in range(5)]
    pods += gang_pods("important", ["n2"], priority=500)
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("b0", pool="burst")),
                               workloads=(job("important"),))
    config = CapacityConfig(pools=(BUSY_POOL,), burst_idle_cooldown_s=0.0)
    actions, report, _ = run(snapshot, 13, config, policy=replace(CHAT, priority=300), demand=8.0)
    assert actions == []
    assert any("would not make room" in note for note in report.notes), report.notes


@pytest.mark.parametrize(
    ("demand", "emptied", "why"),
    [
        (8.0, True, ""),  # the 8 replicas on n1 carry the median demand while the 5 moved ones cold-start
        (8.5, False, "would keep 8 replica(s) elsewhere, its median forecast needs 9: not now"),
        (None, False, "has no usable forecast to tell whether it can spare 5 replica(s)"),
    ],
)
def test_consolidation_waits_until_the_service_can_spare_the_moved_replicas(
    demand: float | None, emptied: bool, why: str
) -> None:
    config = CapacityConfig(pools=(BUSY_POOL,), burst_idle_cooldown_s=0.0)
    actions, report, _ = run(_busy_burst(checkpoint_age=225.0), 13, config, demand=demand)
    assert any(isinstance(a, ScaleNodePool) for a in actions) is emptied
    if why:
        assert any(why in note for note in report.notes), report.notes


# ---- serving replicas are never preempted as training -------------------------------------------------------------
#
# inference/search's GPUScalingPolicy is invalid this tick (a typo): it is not among the policies, yet its replicas
# (priority 0, running for hours) must not become victims for chat's shortfall. Only training -- bare pods, Jobs --
# or replicas explicitly labelled preemptible are taken.
OPT_IN = {"gpuautoscaler.dev/preemptible": "true"}


def holders(owner_kind: str | None, owner_name: str | None, labels: dict[str, str] | None = None,
            ready_ago: float = 7000.0) -> list[PodInfo]:
    """16 one-GPU pods of priority 0 filling n2 and n3, all of one owner."""
    return [
        PodInfo("inference", f"search-7d9f8b6c5-{i:05d}", node_name, 1, 0, "Running", True, owner_kind, owner_name,
                created_at=NOW - 7200, ready_at=NOW - ready_ago, labels=labels or {})
        for i, node_name in enumerate(["n2"] * 8 + ["n3"] * 8)
    ]


def held_cluster(pods: list[PodInfo]) -> ClusterSnapshot:
    return ClusterSnapshot(NOW, pods=(*[replica(i, "n1") for i in range(8)], *pods),
                           nodes=(node("n1"), node("n2"), node("n3")))


@pytest.mark.parametrize(
    ("case", "pods", "evicted"),
    [
        ("Deployment whose policy is invalid", holders("Deployment", "search"), 0),
        ("its unresolved ReplicaSet", holders("ReplicaSet", "search-7d9f8b6c5"), 0),
        ("a StatefulSet (no policy)", holders("StatefulSet", "search"), 0),
        ("a Deployment labelled preemptible=false too", holders("Deployment", "search", {
            "gpuautoscaler.dev/preemptible": "false"}), 0),
        ("bare training pods: still victims", holders(None, None), 4),
        ("pods of a Job: still victims", holders("Job", "bulk"), 4),
        ("a Deployment that opted in", holders("Deployment", "batch", OPT_IN), 4),
    ],
)
def test_serving_replicas_without_a_valid_policy_are_never_preempted(
    case: str, pods: list[PodInfo], evicted: int
) -> None:
    actions, report, _ = run(held_cluster(pods), 12, CapacityConfig())
    assert all(isinstance(a, EvictPod) for a in actions), case
    assert len(actions) == evicted, case
    assert all(a.reason is Reason.PREEMPT_FOR_INFERENCE and a.service == CHAT.key for a in actions)
    if evicted:
        return
    preempt = [o for o in report.options if o.kind == "preempt"]
    assert len(preempt) == 1 and not preempt[0].chosen and "frees enough" in preempt[0].detail, case
    assert report.candidates and all(c.why_not for c in report.candidates), case


def test_serving_replicas_without_a_valid_policy_leave_burst_as_the_only_option() -> None:
    """No preemptible capacity left: the shortfall bursts, even a short one (past the node's boot, not boot +
    billing), instead of evicting search."""
    config = CapacityConfig(pools=(POOL,), assumed_shortfall_s=330.0)
    actions, report, _ = run(held_cluster(holders("Deployment", "search")), 12, config)
    assert [(type(a).__name__, getattr(a, "pool", None)) for a in actions] == [("ScaleNodePool", "burst")]
    assert not any(isinstance(a, EvictPod) for a in actions)
    assert [o.kind for o in report.options if o.chosen] == ["burst"]


@pytest.mark.parametrize(("owner_kind", "owner_name", "labels", "emptied"), [
    ("Deployment", "search", {}, False),  # replicas of a service whose policy is invalid
    ("StatefulSet", "search", {}, False),
    (None, None, {}, True),  # bare training pods: stopped as before
    ("Deployment", "batch", OPT_IN, True),
])
def test_a_busy_burst_node_is_not_emptied_by_stopping_serving_replicas(
    owner_kind: str | None, owner_name: str | None, labels: dict[str, str], emptied: bool
) -> None:
    """Consolidation stops lower-priority work on the cluster's own nodes to empty a burst node: never serving
    replicas. n2's 8 pods became ready 700 s before the run (past the minimum runtime, little work lost): as
    training, five of them are cheaper to stop than keeping the node (at minute 10, 5 x 1,300 GPU-s lost and 5 GPUs
    for 0.5 h at 2 $ plus 5 cold starts: 11.1 $ < 16 $)."""
    n2 = [
        PodInfo("inference", f"search-7d9f8b6c5-{i:05d}", "n2", 1, 0, "Running", True, owner_kind, owner_name,
                created_at=NOW - 7200, ready_at=NOW - 700, labels=labels)
        for i in range(8)
    ]
    pods = [replica(i, "n1") for i in range(8)] + [replica(10 + i, "b0") for i in range(5)] + n2
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("b0", pool="burst")))
    config = CapacityConfig(pools=(BUSY_POOL,), burst_idle_cooldown_s=600.0, consolidate_horizon_s=1800.0)
    got = _give_back_over(snapshot, config, 12)
    evictions = [a for _, a in got if isinstance(a, EvictPod)]
    if emptied:
        assert [m for m, _ in got] == [10] * 6 and len(evictions) == 5 and isinstance(got[-1][1], ScaleNodePool)
    else:
        assert got == []
