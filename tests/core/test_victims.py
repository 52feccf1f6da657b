"""The victim search (issue 12): whole gangs only, the cheapest minimal set, never what may not be taken.

Property tests run it on random clusters and compare it with a brute force over every subset of the gangs.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodDisruptionBudgetInfo, PodInfo
from autoscaler.core.victims import (
    GangCandidate,
    GpuNeed,
    TrainingRules,
    choose_victims,
    free_gpus_by_node,
    gangs_from_snapshot,
    need_met,
    victim_set_cost,
)

NOW = 1_800_000_000.0
HOUR = 3600.0


def node(name: str, gpus: int = 8, product: str = "H100") -> NodeInfo:
    return NodeInfo(name, gpus, product, None, True)


def worker(gang: str, index: int, node_name: str, gpus: int, **kw: object) -> PodInfo:
    fields: dict[str, object] = {
        "namespace": "train",
        "name": f"{gang}-{index}",
        "node": node_name,
        "gpus": gpus,
        "priority": 10,
        "phase": "Running",
        "ready": True,
        "gang": f"jobset/train/{gang}",
        "created_at": NOW - 2 * HOUR,
    }
    fields.update(kw)
    return PodInfo(**fields)  # type: ignore[arg-type]


def test_whole_gangs_least_lost_work_first() -> None:
    """Two nodes full of training; 4 GPUs needed on one node. Gang a (2 pods x 4 GPUs, checkpointed 10 min ago) is
    cheaper to stop than gang b (1 pod x 8 GPUs, checkpointed 1 h ago): a goes, whole, even though 4 of its GPUs would
    have been enough."""
    snapshot = ClusterSnapshot(
        time=NOW,
        nodes=(node("n0"), node("n1")),
        pods=(
            worker("a", 0, "n0", 4, last_checkpoint_at=NOW - 600),
            worker("a", 1, "n0", 4, last_checkpoint_at=NOW - 600),
            worker("b", 0, "n1", 8, last_checkpoint_at=NOW - HOUR),
        ),
    )
    gangs = gangs_from_snapshot(snapshot, NOW, TrainingRules())
    choice = choose_victims(GpuNeed(1, 4), free_gpus_by_node(snapshot), gangs, {"n0": "H100", "n1": "H100"})
    assert choice.met and choice.exact
    assert [v.gang for v in choice.victims] == ["jobset/train/a"]
    assert choice.victims[0].pods == (("train", "a-0"), ("train", "a-1"))
    assert choice.lost_work_gpu_s == 8 * 600


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"priority": 2000}, "priority 2000 >= 1000"),
        ({"labels": {"gpuautoscaler.dev/preemptible": "false"}}, "labelled gpuautoscaler.dev/preemptible=false"),
        ({"created_at": NOW - 60}, "minimum runtime"),
        ({"labels": {"app": "guarded"}}, "PodDisruptionBudget train/guard allows 0 of its 1"),
    ],
)
def test_what_may_not_be_taken_is_never_taken(change: dict[str, object], why: str) -> None:
    pdb = PodDisruptionBudgetInfo("train", "guard", {"app": "guarded"}, 0)
    snapshot = ClusterSnapshot(time=NOW, nodes=(node("n0"),), pods=(worker("a", 0, "n0", 8, **change),), pdbs=(pdb,))
    gangs = gangs_from_snapshot(snapshot, NOW, TrainingRules())
    choice = choose_victims(GpuNeed(1, 1), free_gpus_by_node(snapshot), gangs, {"n0": "H100"})
    assert not choice.met and choice.victims == ()
    assert why in (choice.ineligible[0].why_not or "")


def test_lower_priority_goes_first_whatever_its_lost_work() -> None:
    snapshot = ClusterSnapshot(
        time=NOW,
        nodes=(node("n0"), node("n1")),
        pods=(
            worker("cheap-but-important", 0, "n0", 8, priority=500, last_checkpoint_at=NOW - 60),
            worker("costly-but-low", 0, "n1", 8, priority=100, created_at=NOW - 10 * HOUR),
        ),
    )
    gangs = gangs_from_snapshot(snapshot, NOW, TrainingRules())
    choice = choose_victims(GpuNeed(1, 8), free_gpus_by_node(snapshot), gangs, {"n0": "H100", "n1": "H100"})
    assert [v.gang for v in choice.victims] == ["jobset/train/costly-but-low"]


def test_a_4_gpu_replica_needs_4_free_gpus_on_one_node() -> None:
    """3 free GPUs on each of two nodes are 6 GPUs but no room for one 4-GPU replica."""
    assert not need_met({"n0": 3, "n1": 3}, GpuNeed(1, 4), {"n0": "H100", "n1": "H100"})
    assert need_met({"n0": 3, "n1": 4}, GpuNeed(1, 4), {"n0": "H100", "n1": "H100"})
    assert not need_met({"n0": 8}, GpuNeed(1, 4, "A100"), {"n0": "H100"})


def test_greedy_is_not_enough_the_search_finds_the_cheaper_set() -> None:
    """Need 8 GPUs on one node. Greedy by lost work takes x (4 GPUs, cheap) then y (4, cheap) = 2 units; one gang z
    of 8 GPUs losing 1.5 units is cheaper."""
    candidates = [
        GangCandidate("x", 10, {"n0": 4}, (("t", "x"),), NOW - HOUR, 1.0),
        GangCandidate("y", 10, {"n0": 4}, (("t", "y"),), NOW - HOUR, 1.0),
        GangCandidate("z", 10, {"n1": 8}, (("t", "z"),), NOW - HOUR, 1.5),
    ]
    choice = choose_victims(GpuNeed(1, 8), {"n0": 0, "n1": 0}, candidates, {"n0": "H100", "n1": "H100"})
    assert [v.gang for v in choice.victims] == ["z"] and choice.exact


# ---- properties over random clusters -------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[GpuNeed, dict[str, int], list[GangCandidate], dict[str, str | None]]:
    n_nodes = draw(st.integers(1, 4))
    node_types = {f"n{i}": draw(st.sampled_from(["H100", "A100"])) for i in range(n_nodes)}
    free = {n: draw(st.integers(0, 3)) for n in node_types}
    gangs = []
    for g in range(draw(st.integers(0, 7))):
        spread = draw(st.lists(st.sampled_from(list(node_types)), min_size=1, max_size=3, unique=True))
        gangs.append(
            GangCandidate(
                gang=f"g{g}",
                priority=draw(st.sampled_from([10, 100, 500])),
                gpus_by_node={n: draw(st.integers(1, 4)) for n in spread},
                pods=tuple(("t", f"g{g}-{i}") for i in range(len(spread))),
                started_at=NOW - draw(st.integers(0, 10)) * HOUR,
                lost_work_gpu_s=float(draw(st.integers(0, 20))),
                why_not=draw(st.sampled_from([None, None, None, "non-preemptible"])),
            )
        )
    need = GpuNeed(draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.sampled_from([None, "H100", "A100"])))
    return need, free, gangs, node_types


def _freed(free: dict[str, int], victims: tuple[GangCandidate, ...]) -> dict[str, int]:
    out = dict(free)
    for v in victims:
        for n, g in v.gpus_by_node.items():
            out[n] = out.get(n, 0) + g
    return out


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_victim_search_properties(
    world: tuple[GpuNeed, dict[str, int], list[GangCandidate], dict[str, str | None]],
) -> None:
    need, free, gangs, node_types = world
    choice = choose_victims(need, free, gangs, node_types)
    # never what may not be taken; whole gangs (a victim is a candidate, with all its GPUs)
    assert all(v.why_not is None for v in choice.victims)
    assert all(any(v is g for g in gangs) for v in choice.victims)
    assert len({v.gang for v in choice.victims}) == len(choice.victims)
    eligible = [g for g in gangs if g.why_not is None]
    feasible = [
        subset
        for r in range(len(eligible) + 1)
        for subset in itertools.combinations(eligible, r)
        if need_met(_freed(free, subset), need, node_types)
    ]
    assert choice.met == bool(feasible)
    if not choice.met:
        assert choice.victims == ()
        return
    assert need_met(_freed(free, choice.victims), need, node_types)
    # minimal: no victim can be dropped
    for v in choice.victims:
        rest = tuple(x for x in choice.victims if x is not v)
        assert not need_met(_freed(free, rest), need, node_types)
    # optimal: no cheaper feasible set (brute force over every subset)
    priorities = sorted({g.priority for g in gangs}, reverse=True)
    best = min(feasible, key=lambda s: victim_set_cost(s, priorities))
    assert choice.exact
    assert victim_set_cost(choice.victims, priorities) == victim_set_cost(best, priorities)


def test_a_search_cut_short_still_returns_a_minimal_set_that_meets_the_need() -> None:
    candidates = [
        GangCandidate(f"g{i}", 10, {f"n{i % 4}": 2}, (("t", f"g{i}"),), NOW - HOUR, float(20 - i)) for i in range(16)
    ]
    node_types: dict[str, str | None] = {f"n{i}": "H100" for i in range(4)}
    full = choose_victims(GpuNeed(3, 4), {n: 0 for n in node_types}, candidates, node_types)
    cut = choose_victims(GpuNeed(3, 4), {n: 0 for n in node_types}, candidates, node_types, max_search_nodes=3)
    assert full.exact and not cut.exact
    for choice in (full, cut):
        assert choice.met and need_met(_freed({n: 0 for n in node_types}, choice.victims), GpuNeed(3, 4), node_types)
    priorities = [10]
    assert victim_set_cost(full.victims, priorities) <= victim_set_cost(cut.victims, priorities)


# ---- serving replicas are never training ---------------------------------------------------------------------
#
# A pod on its own, old, priority 0, on a full 8-GPU node: the cheapest victim there is. Only who owns it changes.
# Deployment inf/search has no valid policy this tick (a typo in its GPUScalingPolicy): it is not in ``protected``,
# and its replicas must still never be taken.
OPT_IN = {"gpuautoscaler.dev/preemptible": "true"}


def solo(owner_kind: str | None, owner_name: str | None, labels: dict[str, str] | None = None,
         gang: str | None = None) -> PodInfo:
    return PodInfo("inf", "search-7d9f8b6c5-00000", "n0", 8, 0, "Running", True, owner_kind, owner_name, gang=gang,
                   created_at=NOW - 2 * HOUR, ready_at=NOW - 2 * HOUR + 200, labels=labels or {})


@pytest.mark.parametrize(
    ("pod", "protected", "victim", "why"),
    [
        # serving replicas, whether a valid policy names them or not: never
        (solo("Deployment", "search"), frozenset(), None, "serving replicas of Deployment inf/search"),
        (solo("Deployment", "search"), frozenset({"inf/search"}), None, None),  # managed: not even a candidate
        (solo("ReplicaSet", "search-7d9f8b6c5"), frozenset(), None, "ReplicaSet inf/search-7d9f8b6c5"),
        (solo("StatefulSet", "vllm"), frozenset(), None, "serving replicas of StatefulSet inf/vllm"),
        (solo("DaemonSet", "probe"), frozenset(), None, "serving replicas of DaemonSet inf/probe"),
        (solo("Deployment", "search", gang="label/inf/g"), frozenset(), None, "Deployment inf/search"),
        (solo("Deployment", "search", {"gpuautoscaler.dev/preemptible": "maybe"}), frozenset(), None, "opt in"),
        # training: bare pods and Jobs stay victims, a pod in no gang as "pod/<ns>/<name>"
        (solo(None, None), frozenset(), "pod/inf/search-7d9f8b6c5-00000", None),
        (solo("Job", "bulk"), frozenset(), "pod/inf/search-7d9f8b6c5-00000", None),
        (solo("Job", "bulk", gang="job/inf/bulk"), frozenset(), "job/inf/bulk", None),
        (solo("PyTorchJob", "ft", gang="pytorchjob/inf/ft"), frozenset(), "pytorchjob/inf/ft", None),
        # the explicit opt-in: every pod labelled gpuautoscaler.dev/preemptible=true
        (solo("Deployment", "batch", OPT_IN), frozenset(), "pod/inf/search-7d9f8b6c5-00000", None),
        (solo("StatefulSet", "batch", OPT_IN), frozenset(), "pod/inf/search-7d9f8b6c5-00000", None),
        # ... but never for a Deployment a valid policy scales
        (solo("Deployment", "search", OPT_IN), frozenset({"inf/search"}), None, None),
    ],
    ids=[
        "invalid-policy-deployment", "managed-deployment", "unresolved-replicaset", "statefulset", "daemonset",
        "deployment-in-a-gang", "label-not-true", "bare-pod", "job-pod", "job-gang", "pytorchjob-gang",
        "opted-in-deployment", "opted-in-statefulset", "opted-in-but-managed",
    ],
)
def test_serving_replicas_are_never_victims_unless_opted_in(
    pod: PodInfo, protected: frozenset[str], victim: str | None, why: str | None
) -> None:
    snapshot = ClusterSnapshot(time=NOW, nodes=(node("n0"),), pods=(pod,))
    gangs = gangs_from_snapshot(snapshot, NOW, TrainingRules(protected=protected))
    choice = choose_victims(GpuNeed(1, 1), free_gpus_by_node(snapshot), gangs, {"n0": "H100"})
    assert [v.gang for v in choice.victims] == ([victim] if victim else [])
    assert choice.met is (victim is not None)
    if why is not None:
        assert len(choice.ineligible) == 1 and not choice.ineligible[0].preemptible
        assert why in (choice.ineligible[0].why_not or "")
    elif victim is None:
        assert gangs == []  # a managed Deployment's replicas are not candidates at all


def test_a_gang_with_one_serving_pod_goes_whole_or_not_at_all() -> None:
    """A gang mixing a bare pod and a Deployment's replica: the replica is not opted in, so neither pod is taken
    (taking the bare pod alone would break the gang); once every pod opts in, both go together."""
    def pods(labels: dict[str, str]) -> tuple[PodInfo, ...]:
        return (
            worker("mixed", 0, "n0", 4, labels=labels),
            worker("mixed", 1, "n0", 4, owner_kind="Deployment", owner_name="helper", labels=labels),
        )

    for labels, taken in (({}, []), (OPT_IN, ["jobset/train/mixed"])):
        snapshot = ClusterSnapshot(time=NOW, nodes=(node("n0"),), pods=pods(labels))
        gangs = gangs_from_snapshot(snapshot, NOW, TrainingRules())
        choice = choose_victims(GpuNeed(1, 4), free_gpus_by_node(snapshot), gangs, {"n0": "H100"})
        assert [v.gang for v in choice.victims] == taken
        if taken:
            assert choice.victims[0].pods == (("train", "mixed-0"), ("train", "mixed-1"))


def test_serving_replicas_stay_protected_by_the_other_rules_when_opted_in() -> None:
    """The opt-in lifts only the serving rule: priority, minimum runtime and PDBs still hold."""
    young = replace(solo("Deployment", "batch", OPT_IN), created_at=NOW - 60, ready_at=NOW - 30)
    high = replace(solo("Deployment", "batch", OPT_IN), priority=5000)
    for pod, why in ((young, "minimum runtime"), (high, "priority 5000 >= 1000")):
        snapshot = ClusterSnapshot(time=NOW, nodes=(node("n0"),), pods=(pod,))
        choice = choose_victims(GpuNeed(1, 1), free_gpus_by_node(snapshot),
                                gangs_from_snapshot(snapshot, NOW, TrainingRules()), {"n0": "H100"})
        assert choice.victims == () and why in (choice.ineligible[0].why_not or "")
