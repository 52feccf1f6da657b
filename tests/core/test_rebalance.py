"""The rebalance planner (core/rebalance.py): table-driven cases of what may move and what a move is for, the bounds
over a multi-pass run, and property-based invariants on random clusters (never a PDB overrun, never a pod that is not
restartable, never more moves than the bounds, gangs whole)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core.cluster import (
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodDisruptionBudgetInfo,
    PodInfo,
    WorkloadInfo,
)
from autoscaler.core.model import EvictPod
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import (
    HOUR_S,
    REBALANCE_LABEL,
    RebalanceConfig,
    RebalanceState,
    plan_rebalance,
    stranded_gpus,
)

NOW = 1_000_000.0
CONFIG = RebalanceConfig(burst_pools=frozenset({"burst"}), training_excluded_pools=frozenset({"burst"}))


def node(name: str, gpus: int = 8, pool: str = "onprem", ready: bool = True, product: str = "A100") -> NodeInfo:
    return NodeInfo(name, gpus, product, pool, ready)


def replica(dep: str, index: int, node_name: str | None, gpus: int = 1, ready: bool = True) -> PodInfo:
    return PodInfo("inf", f"{dep}-{index}", node_name, gpus, 1000, "Running" if node_name else "Pending",
                   ready and node_name is not None, "Deployment", dep, labels={"app": dep})


def gang(name: str, nodes: list[str | None], gpus: int = 8, allowed: bool = False,
         checkpoint_age: float | None = None) -> list[PodInfo]:
    labels = {REBALANCE_LABEL: "allowed"} if allowed else {}
    checkpoint = None if checkpoint_age is None else NOW - checkpoint_age
    return [
        PodInfo("ml", f"{name}-{i}", n, gpus, 100, "Running" if n else "Pending", n is not None, "Job", name,
                gang=f"job/ml/{name}", last_checkpoint_at=checkpoint, labels=labels)
        for i, n in enumerate(nodes)
    ]


def deployments(pods: list[PodInfo]) -> tuple[DeploymentInfo, ...]:
    counts: Counter[str] = Counter(p.owner_name for p in pods if p.owner_kind == "Deployment" and p.owner_name)
    ready: Counter[str] = Counter(
        p.owner_name for p in pods if p.owner_kind == "Deployment" and p.owner_name and p.ready
    )
    return tuple(DeploymentInfo("inf", d, n, ready[d], {"app": d}) for d, n in sorted(counts.items()))


def snap(nodes: list[NodeInfo], pods: list[PodInfo], pdbs: tuple[PodDisruptionBudgetInfo, ...] = (),
         workloads: tuple[WorkloadInfo, ...] = (), deps: tuple[DeploymentInfo, ...] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot(NOW, deps if deps is not None else deployments(pods), tuple(pods), tuple(nodes),
                           pdbs=pdbs, workloads=workloads)


def evicted(plan) -> list[str]:
    return sorted(f"{a.namespace}/{a.name}" for a in plan.actions)


# A pending 8-GPU gang fits nowhere: n1 holds a 4-GPU gang and chat-0 (3 free), n2 holds chat-1 alone (7 free),
# n3 a 6-GPU gang (2 free). Moving chat-1 off n2 frees a whole node.
BASE_NODES = [node("n1"), node("n2"), node("n3")]
BASE_PODS = [
    *gang("fixed", ["n1"], gpus=4),
    replica("chat", 0, "n1"),
    replica("chat", 1, "n2"),
    *gang("big", ["n3"], gpus=6),
    *gang("wait", [None]),
]


def test_a_scattered_replica_is_moved_to_make_room_for_a_waiting_gang() -> None:
    plan, state = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW, CONFIG, RebalanceState())
    assert plan.ran
    assert evicted(plan) == ["inf/chat-1"]
    action = plan.actions[0]
    assert isinstance(action, EvictPod) and action.reason is Reason.REBALANCE and action.gang is None
    move = plan.moves[0]
    assert move.gpus_by_node == {"n2": 1}
    assert set(move.destinations) <= {"n1", "n3"} and sum(move.destinations.values()) == 1
    assert move.target == "gang job/ml/wait" and move.gain_gpus == 8
    assert "job/ml/wait" in move.detail and "expected to land on" in move.detail
    assert plan.stranded_gpus == 3 + 7 + 2 and plan.stranded_after == 0
    assert state.move_times == (NOW,) and state.last_pass_at == NOW


@pytest.mark.parametrize(
    ("case", "pods", "pdbs", "config", "why"),
    [
        ("PDB allows no disruption", BASE_PODS,
         (PodDisruptionBudgetInfo("inf", "chat", {"app": "chat"}, 0),), CONFIG, "no bounded set"),
        ("a bare pod is not recreated",
         [*gang("fixed", ["n1"], gpus=4), replica("chat", 0, "n1"), *gang("big", ["n3"], gpus=6), *gang("wait", [None]),
          PodInfo("inf", "bare", "n2", 1, 1000, "Running", True)], (), CONFIG, "no bounded set"),
        ("a StatefulSet keeps its identity",
         [*gang("fixed", ["n1"], gpus=4), replica("chat", 0, "n1"), *gang("big", ["n3"], gpus=6), *gang("wait", [None]),
          PodInfo("inf", "db-0", "n2", 1, 1000, "Running", True, "StatefulSet", "db")], (), CONFIG, "no bounded set"),
        ("its only replica",
         [*gang("fixed", ["n1"], gpus=4), *gang("big", ["n3"], gpus=6), *gang("wait", [None]),
          replica("solo", 0, "n2")],
         (), CONFIG, "no bounded set"),
        ("a replica is starting",
         [*BASE_PODS[:-2], replica("chat", 2, "n3", ready=False), *gang("wait", [None])], (), CONFIG, "no bounded set"),
        ("gain per move below the threshold", BASE_PODS, (), replace(CONFIG, min_gain_per_move=9.0), "per move <"),
        ("no move budget", BASE_PODS, (), replace(CONFIG, max_moves_per_pass=0), "budget used up"),
    ],
)
def test_what_may_not_move_stays(case, pods, pdbs, config, why) -> None:
    nodes = BASE_NODES
    plan, state = plan_rebalance(snap(nodes, pods, pdbs), NOW, config, RebalanceState())
    assert plan.actions == (), case
    assert any(why in note for note in plan.notes), (case, plan.notes)
    assert state.move_times == ()


def test_a_pdb_is_held_over_the_whole_pass() -> None:
    # Two waiting 8-GPU gangs, each needing one chat replica moved off its node; the budget allows one disruption.
    nodes = [node("n1"), node("n2"), node("n3"), node("n4")]
    pods = [replica("chat", 0, "n1"), replica("chat", 1, "n2"), *gang("big", ["n3"], gpus=6),
            *gang("other", ["n4"], gpus=5), *gang("w1", [None]), *gang("w2", [None])]
    both = replace(CONFIG, max_moves_per_pass=4)
    free_pdb = (PodDisruptionBudgetInfo("inf", "chat", {"app": "chat"}, 5),)
    plan, _ = plan_rebalance(snap(nodes, pods, free_pdb), NOW, both, RebalanceState())
    # one per Deployment per pass, even with budget to spare: the second waits for the next pass
    assert len(plan.actions) == 1
    tight = (PodDisruptionBudgetInfo("inf", "chat", {"app": "chat"}, 1),)
    pods2 = [*pods, replica("emb", 0, "n4", gpus=1), replica("emb", 1, "n3", gpus=1)]
    plan2, _ = plan_rebalance(snap(nodes, pods2, tight), NOW, both, RebalanceState())
    chat_moves = [a for a in plan2.actions if a.name.startswith("chat")]
    assert len(chat_moves) <= 1


def test_a_gang_moves_whole_only_when_allowed_and_checkpointed() -> None:
    # n1: a 2-GPU gang of two 1-GPU pods? No: one movable 2-GPU training pod on n1, n2 half used; an 8-GPU gang waits.
    nodes = [node("n1"), node("n2")]
    base = [*gang("fixed", ["n2"], gpus=4), *gang("wait", [None])]
    recent = gang("small", ["n1", "n1"], gpus=1, allowed=True, checkpoint_age=60.0)
    plan, _ = plan_rebalance(snap(nodes, [*base, *recent]), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["ml/small-0", "ml/small-1"]
    assert all(a.gang == "job/ml/small" for a in plan.actions)
    assert plan.moves[0].destinations == {"n2": 2}

    stale = gang("small", ["n1", "n1"], gpus=1, allowed=True, checkpoint_age=3600.0)
    plan, _ = plan_rebalance(snap(nodes, [*base, *stale]), NOW, CONFIG, RebalanceState())
    assert plan.actions == ()
    assert any("not checkpointed" in n for n in plan.notes)

    unlabelled = gang("small", ["n1", "n1"], gpus=1, allowed=False, checkpoint_age=60.0)
    plan, _ = plan_rebalance(snap(nodes, [*base, *unlabelled]), NOW, CONFIG, RebalanceState())
    assert plan.actions == ()


def test_training_is_not_placed_on_pools_it_may_not_use_and_gpu_types_hold() -> None:
    # The only room for chat-1 is a burst node: a move onto it keeps it alive, but it is allowed for inference.
    nodes = [node("n1"), node("n2"), node("b1", pool="burst")]
    pods = [*gang("fixed", ["n1"], gpus=8), replica("chat", 0, "b1"), replica("chat", 1, "n2"), *gang("wait", [None])]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"] and plan.moves[0].destinations == {"b1": 1}
    # a waiting gang needing H100 ignores the A100 nodes entirely
    h100 = (WorkloadInfo("Job", "ml", "wait", "job/ml/wait", False, 100, (8,), "H100"),)
    plan, _ = plan_rebalance(snap(nodes, pods, workloads=h100), NOW, CONFIG, RebalanceState())
    assert not any(m.target.startswith("gang") for m in plan.moves)
    assert any("job/ml/wait" in n and "no bounded set" in n for n in plan.notes)
    # ... which leaves the under-used burst node b1 to be emptied onto the on-prem node n2
    assert [m.target for m in plan.moves] == ["burst node b1"]


def test_a_suspended_workload_of_ours_is_a_target() -> None:
    nodes = BASE_NODES
    pods = BASE_PODS[:-1]
    ours = (WorkloadInfo("Job", "ml", "paused", "job/ml/paused", True, 100, (8,), None, NOW - 600),)
    plan, _ = plan_rebalance(snap(nodes, pods, workloads=ours), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"] and "suspended" in plan.moves[0].target
    theirs = (WorkloadInfo("Job", "ml", "paused", "job/ml/paused", True, 100, (8,), None, None),)
    plan, _ = plan_rebalance(snap(nodes, pods, workloads=theirs), NOW, CONFIG, RebalanceState())
    assert plan.actions == ()  # suspended by someone else: not ours to make room for


def test_nothing_moves_when_the_target_fits_or_nothing_waits() -> None:
    nodes = [node("n1"), node("n2")]
    pods = [replica("chat", 0, "n1"), replica("chat", 1, "n1"), *gang("wait", [None])]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert plan.actions == () and plan.notes == ()
    assert plan.stranded_gpus == 6  # n1's six free GPUs hold no 8-GPU pod; the gang fits n2 as things are
    plan, _ = plan_rebalance(snap(nodes, pods[:2]), NOW, CONFIG, RebalanceState())
    assert plan.actions == () and plan.stranded_gpus == 0


def test_protected_owners_and_not_ready_nodes_are_left_alone() -> None:
    plan, _ = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW, CONFIG, RebalanceState(),
                             protected=frozenset({"deployment/inf/chat"}))
    assert plan.actions == ()
    nodes = [node("n1"), node("n2", ready=False), node("n3")]
    plan, _ = plan_rebalance(snap(nodes, BASE_PODS), NOW, CONFIG, RebalanceState())
    assert plan.actions == ()


def test_an_underused_burst_node_is_emptied_onto_on_prem_nodes() -> None:
    nodes = [node("n1"), node("b1", pool="burst")]
    pods = [*gang("t", ["n1"], gpus=4), replica("chat", 0, "n1"), replica("chat", 1, "b1")]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    assert plan.moves[0].target == "burst node b1" and plan.moves[0].destinations == {"n1": 1}
    # on-prem full: nothing to empty it onto
    full = [*gang("t", ["n1"], gpus=7), replica("chat", 0, "n1"), replica("chat", 1, "b1")]
    plan, _ = plan_rebalance(snap(nodes, full), NOW, CONFIG, RebalanceState())
    assert plan.actions == () and any("do not fit" in n for n in plan.notes)
    # at or above the threshold the burst node is in use: left alone
    busy = [*gang("t", ["n1"], gpus=2), *[replica("chat", i, "b1") for i in range(4)], replica("chat", 9, "n1")]
    plan, _ = plan_rebalance(snap(nodes, busy), NOW, CONFIG, RebalanceState())
    assert plan.actions == ()


def test_a_pass_runs_only_every_interval() -> None:
    _, state = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW, CONFIG, RebalanceState())
    again, same = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW + CONFIG.interval_s - 1, CONFIG, state)
    assert not again.ran and again.actions == () and same == state


def test_stranded_gpus_count_free_gpus_no_waiting_shape_fits() -> None:
    assert stranded_gpus(snap(BASE_NODES, BASE_PODS), CONFIG) == 12
    one_gpu_waits = [*BASE_PODS[:-1], replica("chat", 5, None)]
    assert stranded_gpus(snap(BASE_NODES, one_gpu_waits), CONFIG) == 0


@pytest.mark.parametrize("bad", [dict(interval_s=0), dict(max_moves_per_pass=-1), dict(max_moves_per_hour=-1),
                                 dict(min_gain_per_move=-0.5)])
def test_bad_config_is_refused(bad) -> None:
    with pytest.raises(ValueError):
        RebalanceConfig(**bad)


# ---- multi-pass run: the bounds hold over time ----------------------------------------------------------------------


def _apply(snapshot: ClusterSnapshot, plan) -> ClusterSnapshot:
    """Moves land where the plan expects; then whatever waits and now fits is bound (first fit)."""
    by_pod = {}
    for move in plan.moves:
        dests = [n for n, g in sorted(move.destinations.items()) for _ in range(g)]
        for ns, name in move.pods:
            by_pod[(ns, name)] = dests
    pods = []
    for p in snapshot.pods:
        dest = by_pod.get((p.namespace, p.name))
        if dest:
            p = replace(p, node=dest.pop(0) if p.gpus == 1 else dest[0])
        pods.append(p)
    free = {n.name: n.allocatable_gpus for n in snapshot.nodes}
    for p in pods:
        if p.node:
            free[p.node] -= p.gpus
    bound = []
    for p in pods:
        if p.node is None:
            home = next((n for n, f in sorted(free.items()) if f >= p.gpus), None)
            if home is not None:
                free[home] -= p.gpus
                p = replace(p, node=home, phase="Running", ready=True)
        bound.append(p)
    return replace(snapshot, pods=tuple(bound), deployments=deployments(bound))


def test_the_bounds_hold_over_a_multi_pass_run() -> None:
    config = replace(CONFIG, max_moves_per_pass=2, max_moves_per_hour=3, interval_s=300.0, min_gain_per_move=1.0)
    nodes = [node(f"n{i}") for i in range(8)]
    pods: list[PodInfo] = []
    for i in range(8):  # two 1-GPU replicas of two services on every node: a whole node costs two moves
        pods += [replica(f"svc{i}", 0, f"n{i}"), replica(f"svc{i}", 1, f"n{(i + 1) % 8}")]
    snapshot = snap(nodes, pods)
    state = RebalanceState()
    times: list[float] = []
    for step in range(48):  # 4 hours at one pass every 5 minutes; a new 8-GPU gang arrives every pass
        now = NOW + step * 300.0
        waiting = list(snapshot.pods) + gang(f"w{step}", [None])
        snapshot = replace(snapshot, time=now, pods=tuple(waiting))
        plan, state = plan_rebalance(snapshot, now, config, state)
        assert len(plan.actions) <= config.max_moves_per_pass
        times += [now] * len(plan.actions)
        snapshot = _apply(snapshot, plan)
    assert times, "the run should have moved something"
    for t in times:
        assert sum(1 for u in times if t - HOUR_S < u <= t) <= config.max_moves_per_hour


# ---- properties on random clusters ----------------------------------------------------------------------------


@st.composite
def clusters(draw):
    n_nodes = draw(st.integers(2, 6))
    nodes = [node(f"n{i}", pool="burst" if draw(st.booleans()) and i > 0 else "onprem") for i in range(n_nodes)]
    free = {n.name: 8 for n in nodes}
    pods: list[PodInfo] = []

    def where(gpus: int) -> str | None:
        fits = [n for n, f in free.items() if f >= gpus]
        if not fits:
            return None
        chosen = draw(st.sampled_from(fits))
        free[chosen] -= gpus
        return chosen

    for d in range(draw(st.integers(1, 4))):
        for i in range(draw(st.integers(1, 4))):
            gpus = draw(st.sampled_from([1, 1, 2, 4]))
            pods.append(replica(f"d{d}", i, where(gpus), gpus=gpus, ready=draw(st.integers(0, 9)) > 0))
    for g in range(draw(st.integers(0, 3))):
        size = draw(st.integers(1, 2))
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        placed = [where(gpus) for _ in range(size)]
        if None in placed:
            placed = [None] * size
        pods += gang(f"g{g}", placed, gpus=gpus, allowed=draw(st.booleans()),
                     checkpoint_age=draw(st.sampled_from([None, 60.0, 5000.0])))
    for b in range(draw(st.integers(0, 2))):
        pods.append(PodInfo("inf", f"bare{b}", where(1), 1, 1000, "Running", True))
    pdbs = tuple(
        PodDisruptionBudgetInfo("inf", f"pdb{d}", {"app": f"d{d}"}, draw(st.integers(0, 2)))
        for d in range(draw(st.integers(0, 3)))
    )
    return snap(nodes, pods, pdbs)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.integers(0, 4), st.integers(0, 6))
def test_properties_of_any_plan(snapshot: ClusterSnapshot, per_pass: int, per_hour: int) -> None:
    config = replace(CONFIG, max_moves_per_pass=per_pass, max_moves_per_hour=per_hour, min_gain_per_move=0.5)
    prior = RebalanceState(move_times=(NOW - 100.0,))
    plan, state = plan_rebalance(snapshot, NOW, config, prior)
    by_name = {(p.namespace, p.name): p for p in snapshot.pods}
    moved = [by_name[(a.namespace, a.name)] for a in plan.actions]
    deps = {d.name: d for d in snapshot.deployments}
    # bounds
    assert len(plan.actions) <= per_pass
    assert len(plan.actions) <= max(0, per_hour - 1)
    assert len(state.move_times) == 1 + len(plan.actions)
    # only restartable pods, on ready nodes, ready
    for pod in moved:
        assert pod.node is not None and pod.ready
        if pod.owner_kind == "Deployment":
            dep = deps[pod.owner_name]
            assert dep.spec_replicas >= 2 and dep.ready_replicas == dep.spec_replicas
        else:
            assert pod.gang is not None and pod.labels.get(REBALANCE_LABEL) == "allowed"
            assert pod.last_checkpoint_at is not None and NOW - pod.last_checkpoint_at <= config.checkpoint_max_age_s
    # gangs whole
    gangs_moved = {p.gang for p in moved if p.gang}
    for g in gangs_moved:
        members = {p.name for p in snapshot.pods if p.gang == g}
        assert members <= {p.name for p in moved}
    # one replica per Deployment per pass
    per_dep = Counter(p.owner_name for p in moved if p.owner_kind == "Deployment")
    assert all(n == 1 for n in per_dep.values())
    # PodDisruptionBudgets hold over the whole pass
    covered: dict[str, int] = defaultdict(int)
    for pdb in snapshot.pdbs:
        covered[pdb.name] = sum(
            1
            for p in moved
            if p.namespace == pdb.namespace and all(p.labels.get(k) == v for k, v in pdb.selector.items())
        )
        assert covered[pdb.name] <= pdb.disruptions_allowed
    # every move says why and where
    for move in plan.moves:
        assert move.detail and move.target and sum(move.destinations.values()) == sum(
            by_name[pod].gpus for pod in move.pods
        )


def test_a_waiting_pods_own_gpu_type_is_honoured_and_idle_gpus_of_other_types_are_not_stranded() -> None:
    nodes = [node("n1"), node("n2"), node("h1", product="H100")]
    chat = [replica("chat", 0, "n1"), replica("chat", 1, "n2")]
    untyped = PodInfo("ml", "big", None, 8, 100, "Pending", False)
    plan, _ = plan_rebalance(snap(nodes, [*chat, untyped]), NOW, CONFIG, RebalanceState())
    assert plan.actions == ()  # any type will do: it fits on the empty H100 node as things are
    typed = replace(untyped, gpu_product="A100")
    plan, _ = plan_rebalance(snap(nodes, [*chat, typed]), NOW, CONFIG, RebalanceState())
    assert len(plan.actions) == 1 and plan.moves[0].target == "pod ml/big"
    assert plan.stranded_gpus == 14  # the H100 node's 8 idle GPUs are not fragmentation: nothing waiting may use them


def test_only_made_moves_spend_the_bound_and_make_their_target_wait() -> None:
    from autoscaler.core.rebalance import record_pass

    plan, planned = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW, CONFIG, RebalanceState())
    assert planned.moved_for == (("gang job/ml/wait", NOW),)
    refused = record_pass(RebalanceState(), planned, plan, NOW, applied=set())
    assert refused.move_times == () and refused.moved_for == ()
    made = record_pass(RebalanceState(), planned, plan, NOW, applied={("inf", "chat-1")})
    assert made.move_times == (NOW,) and made.moved_for == (("gang job/ml/wait", NOW),)
    # the gang still waits (the replica was put back): no move for it before retry_after_s
    again, _ = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW + 600, CONFIG, made)
    assert again.actions == () and any("still waiting" in n for n in again.notes)
    later, _ = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW + CONFIG.retry_after_s, CONFIG, made)
    assert len(later.actions) == 1


def test_protected_owners_cover_growing_guarded_maxed_and_unsure_services() -> None:
    from autoscaler.core.model import ScaleDecision
    from autoscaler.core.rebalance import protected_owners

    decisions = [
        ScaleDecision("inf/up", 2, 3, Reason.METRIC_ABOVE_TARGET, ""),
        ScaleDecision("inf/slo", 3, 3, Reason.SLO_BREACH, ""),
        ScaleDecision("inf/max", 8, 8, Reason.AT_MAX_REPLICAS, ""),
        ScaleDecision("inf/calm", 3, 3, Reason.WITHIN_TOLERANCE, ""),
        ScaleDecision("inf/down", 4, 3, Reason.METRIC_BELOW_TARGET, ""),
    ]
    assert protected_owners(decisions, ["inf/stale"]) == frozenset(
        f"deployment/inf/{n}" for n in ("up", "slo", "max", "stale")
    )


# ---- only the replicas of services with a valid policy move -------------------------------------------------------
#
# BASE: moving chat-1 off n2 makes room for the waiting gang. A move is an eviction: when chat has no valid policy
# this tick (a typo in its GPUScalingPolicy, or none at all), its replicas stay where they are.
def _decision(key: str, desired: int = 2):
    from autoscaler.core.model import ScaleDecision

    reason = Reason.METRIC_ABOVE_TARGET if desired > 2 else Reason.WITHIN_TOLERANCE
    return ScaleDecision(key, 2, desired, reason, "")


@pytest.mark.parametrize(
    ("case", "decisions", "managed", "moved"),
    [
        # decisions: the tick's (one per valid policy), handed on as protected_owners and managed_services, as the
        # controller does; None: neither passed
        ("no word on policies from the caller: as before", None, None, ["inf/chat-1"]),
        ("chat's policy is valid", [_decision("inf/chat")], None, ["inf/chat-1"]),
        ("chat's policy is invalid: only search has a decision", [_decision("inf/search")], None, []),
        ("no valid policy at all", [], None, []),
        ("explicit managed: chat", None, {"inf/chat"}, ["inf/chat-1"]),
        ("explicit managed: not chat", None, set(), []),
        ("valid but growing: protected as before", [_decision("inf/chat", desired=3)], None, []),
    ],
)
def test_only_replicas_of_services_with_a_valid_policy_move(
    case: str, decisions: list | None, managed: set[str] | None, moved: list[str]
) -> None:
    from autoscaler.core.rebalance import managed_services, protected_owners

    protected = frozenset() if decisions is None else protected_owners(decisions)
    if decisions is not None:
        managed = managed_services(decisions)
    plan, _ = plan_rebalance(snap(BASE_NODES, BASE_PODS), NOW, CONFIG, RebalanceState(), protected=protected,
                             managed=managed)
    assert evicted(plan) == moved, case


def test_a_burst_node_holding_an_unmanaged_replica_is_not_emptied() -> None:
    nodes = [node("n1"), node("b1", pool="burst")]
    pods = [*gang("t", ["n1"], gpus=4), replica("chat", 0, "n1"), replica("chat", 1, "b1")]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState(), managed={"inf/other"})
    assert plan.actions == () and any("may not move" in n for n in plan.notes)
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState(), managed={"inf/chat"})
    assert evicted(plan) == ["inf/chat-1"]


def test_managed_services_are_the_services_the_tick_decided_for() -> None:
    from autoscaler.core.rebalance import managed_services, protected_owners

    decisions = [_decision("inf/calm"), _decision("inf/up", desired=3)]
    assert managed_services(decisions) == frozenset({"inf/calm", "inf/up"})
    assert protected_owners(decisions, ["inf/stale"]) == frozenset({"deployment/inf/stale", "deployment/inf/up"})


@pytest.mark.parametrize(
    ("labelled", "moved"),
    [
        ((True, True), ["inf/chat-1"]),  # every replica opted in: moved without a policy
        ((True, False), []),  # not every pod: not opted in
        ((False, False), []),
    ],
)
def test_a_deployment_without_a_policy_moves_only_when_its_pods_opt_in(
    labelled: tuple[bool, bool], moved: list[str]
) -> None:
    from dataclasses import replace as copy_with

    pods = [
        copy_with(p, labels={**p.labels, REBALANCE_LABEL: "allowed"})
        if p.owner_name == "chat" and labelled[int(p.name.rsplit("-", 1)[1])]
        else p
        for p in BASE_PODS
    ]
    plan, _ = plan_rebalance(snap(BASE_NODES, pods), NOW, CONFIG, RebalanceState(), managed=set())
    assert evicted(plan) == moved
