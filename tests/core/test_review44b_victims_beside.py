"""Review 44b: the victim search with CPU and memory beside the GPUs (``GpuNeed.cpu_milli``/``memory_bytes``,
``GangCandidate.beside_by_node``, ``choose_victims(..., beside=)``), on the random clusters of
``test_victims_properties`` given CPU and memory.

* Where CPU and memory never bind, the choice is the one made by GPUs alone (no more preemptions, no other ones).
* Where they do, the oracle written here (replicas on a node = the least of what its GPUs, CPU and memory hold once
  the victims' pods are gone) says: ``met`` is met, an exact ``not met`` is impossible, the set is minimal and, on
  small instances, the cheapest (brute force over every subset).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.core.cluster import PodInfo
from autoscaler.core.victims import (
    GangCandidate,
    GpuNeed,
    VictimChoice,
    choose_victims,
    free_gpus_by_node,
    gangs_from_snapshot,
    victim_set_cost,
)
from tests.core.test_victims_properties import (
    NOW,
    World,
    gang_members,
    live,
    pdb_covered,
    useful_priorities,
    worlds,
)

PROPS = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
GI = 1 << 30

POD_CPU = st.sampled_from((0, 500, 1000, 2000, 4000, 8000))
POD_MEMORY = st.sampled_from((0, GI, 4 * GI, 16 * GI))
NODE_CPU = st.sampled_from((2000, 4000, 8000, 16000, 32000))
NODE_MEMORY = st.sampled_from((8 * GI, 32 * GI, 64 * GI))
NEED_CPU = st.sampled_from((0, 1000, 2000, 4000, 8000))
NEED_MEMORY = st.sampled_from((0, 0, 4 * GI, 16 * GI))
KNOWN = st.sampled_from((True, True, True, False))  # a node whose allocatable lacks CPU or memory: not known


@dataclass(frozen=True)
class BesideWorld:
    world: World
    beside: dict[str, tuple[int, int]]  # known nodes: allocatable less every live pod's (and others') requests

    def choose(self, budget: int = 20_000, beside: bool = True) -> tuple[list[GangCandidate], VictimChoice]:
        candidates = gangs_from_snapshot(self.world.snapshot, NOW, self.world.rules)
        free = free_gpus_by_node(self.world.snapshot)
        types = self.world.node_types
        return candidates, choose_victims(
            self.world.need, free, candidates, types, budget, beside=self.beside if beside else None
        )


@st.composite
def beside_worlds(draw: st.DrawFn, plentiful: bool = False) -> BesideWorld:
    """A world of ``test_victims_properties`` whose pods request CPU and memory; each node's allocatable CPU and
    memory (unknown on some) less what its live pods and some CPU-only pods request. ``plentiful``: every node holds
    ten times what every replica needed and every pod on the cluster request (CPU never binds)."""
    world = draw(worlds())
    pods = tuple(
        dataclasses.replace(p, cpu_milli=draw(POD_CPU), memory_bytes=draw(POD_MEMORY)) for p in world.snapshot.pods
    )
    need = GpuNeed(
        world.need.replicas, world.need.gpus_per_replica, world.need.gpu_type, draw(NEED_CPU), draw(NEED_MEMORY)
    )
    total_cpu = sum(p.cpu_milli for p in pods) + need.cpu_milli * need.replicas
    total_memory = sum(p.memory_bytes for p in pods) + need.memory_bytes * need.replicas
    beside: dict[str, tuple[int, int]] = {}
    for n in world.snapshot.nodes:
        if not draw(KNOWN):
            continue
        if plentiful:
            cpu, memory = 10 * total_cpu + 1000, 10 * total_memory + GI
        else:
            cpu, memory = draw(NODE_CPU), draw(NODE_MEMORY)
            cpu -= draw(st.sampled_from((0, 0, 1000, 4000)))  # CPU-only pods (not in the snapshot)
        for p in pods:
            if live(p) and p.node == n.name:
                cpu, memory = cpu - p.cpu_milli, memory - p.memory_bytes
        beside[n.name] = (cpu, memory)
    snapshot = dataclasses.replace(world.snapshot, pods=pods)
    return BesideWorld(dataclasses.replace(world, snapshot=snapshot, need=need), beside)


# ---- the oracle ----------------------------------------------------------------------------------------------


def room_after(bw: BesideWorld, victims: Iterable[str]) -> int:
    """Replicas the ready nodes of the need's type hold once the ``victims`` gangs' live pods are gone."""
    world, need = bw.world, bw.world.need
    members = gang_members(world)
    gone = {(p.namespace, p.name) for gang in victims for p in members[gang]}
    free = {n.name: n.allocatable_gpus for n in world.snapshot.nodes if n.ready}
    beside = dict(bw.beside)
    for p in world.snapshot.pods:
        if not live(p):
            continue
        if (p.namespace, p.name) in gone:
            if p.node in beside:
                cpu, memory = beside[p.node]
                beside[p.node] = (cpu + p.cpu_milli, memory + p.memory_bytes)
        elif p.node in free:
            free[p.node] -= p.gpus
    types = world.node_types
    total = 0
    for node, gpus in free.items():
        if need.gpu_type is not None and types[node] != need.gpu_type:
            continue
        fit = max(0, gpus) // need.gpus_per_replica
        if node in beside:
            cpu, memory = beside[node]
            if need.cpu_milli:
                fit = min(fit, max(0, cpu) // need.cpu_milli)
            if need.memory_bytes:
                fit = min(fit, max(0, memory) // need.memory_bytes)
        total += fit
    return total


def met_without(bw: BesideWorld, victims: Iterable[str]) -> bool:
    return room_after(bw, victims) >= bw.world.need.replicas


def feasible_sets(bw: BesideWorld, eligible: list[GangCandidate]) -> list[tuple[GangCandidate, ...]]:
    pods_by_name = {(p.namespace, p.name): p for p in bw.world.snapshot.pods}

    def within_pdbs(subset: tuple[GangCandidate, ...]) -> bool:
        evicted = [pods_by_name[key] for c in subset for key in c.pods]
        return all(
            pdb_covered(pdb, evicted) <= pdb.disruptions_allowed for pdb in bw.world.snapshot.pdbs if pdb.selector
        )

    return [
        subset
        for r in range(len(eligible) + 1)
        for subset in itertools.combinations(eligible, r)
        if met_without(bw, (c.gang for c in subset)) and within_pdbs(subset)
    ]


# ---- the properties ------------------------------------------------------------------------------------------


@PROPS
@given(beside_worlds(plentiful=True), st.sampled_from((1, 3, 20_000)))
def test_where_cpu_never_binds_the_choice_is_the_gpus_alone(bw: BesideWorld, budget: int) -> None:
    _, with_beside = bw.choose(budget)
    _, without = bw.choose(budget, beside=False)
    assert [v.gang for v in with_beside.victims] == [v.gang for v in without.victims]
    assert (with_beside.met, with_beside.exact) == (without.met, without.exact)


@PROPS
@given(beside_worlds(), st.sampled_from((1, 3, 20_000)))
def test_met_is_met_and_the_set_is_minimal(bw: BesideWorld, budget: int) -> None:
    _, choice = bw.choose(budget)
    gangs = [v.gang for v in choice.victims]
    if choice.met:
        assert met_without(bw, gangs)
    else:
        assert gangs == []
    for spared in gangs:
        assert not met_without(bw, [g for g in gangs if g != spared]), spared


@PROPS
@given(beside_worlds())
def test_exact_unmet_is_impossible_and_met_is_the_cheapest(bw: BesideWorld) -> None:
    candidates, choice = bw.choose()
    eligible = [c for c in candidates if c.why_not is None]
    if len(eligible) > 9:
        return
    feasible = feasible_sets(bw, eligible)
    assert choice.exact
    assert choice.met == bool(feasible)
    if not choice.met:
        return
    priorities = useful_priorities(bw.world, candidates)
    chosen = victim_set_cost(choice.victims, priorities)
    cheaper = [[c.gang for c in s] for s in feasible if victim_set_cost(s, priorities) < chosen]
    assert not cheaper, ([v.gang for v in choice.victims], cheaper)


def test_oracle_counts_beside() -> None:
    """The oracle itself: a node with 8 free GPUs and 1 CPU free holds no replica asking 2 CPUs."""
    from autoscaler.core.cluster import ClusterSnapshot, NodeInfo
    from autoscaler.core.victims import TrainingRules

    snapshot = ClusterSnapshot(
        time=NOW,
        nodes=(NodeInfo("n0", 8, "A100", None, True),),
        pods=(PodInfo("ml", "a", "n0", 8, 0, "Running", True, created_at=NOW - 7200, cpu_milli=500),),
    )
    bw = BesideWorld(World(snapshot, TrainingRules(), GpuNeed(1, 8, None, 2000)), {"n0": (1000, GI)})
    assert not met_without(bw, [])
    assert met_without(bw, ["pod/ml/a"]) is False  # 1000 + 500 < 2000
    bw2 = BesideWorld(bw.world, {"n0": (1500, GI)})
    assert met_without(bw2, ["pod/ml/a"])
    _, choice = bw.choose()
    assert not choice.met and choice.victims == ()
    _, choice2 = bw2.choose()
    assert choice2.met and [v.gang for v in choice2.victims] == ["pod/ml/a"]
