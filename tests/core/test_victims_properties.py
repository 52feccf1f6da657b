"""Property tests of the victim search (issue 12) on random clusters built as ``ClusterSnapshot``s.

Every rule is checked against an oracle written here, independently of ``autoscaler.core.victims``: which pods form a
gang, which gangs may be taken, how many GPUs are free node by node and how many replicas that leaves room for.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodDisruptionBudgetInfo, PodInfo
from autoscaler.core.victims import (
    GangCandidate,
    GpuNeed,
    TrainingRules,
    VictimChoice,
    choose_victims,
    free_gpus_by_node,
    gangs_from_snapshot,
    need_met,
    victim_set_cost,
)

NOW = 1_800_000_000.0
GPU_TYPES = ("A100", "H100")
NAMESPACES = ("ml", "research")
TEAMS = ("vision", "speech")
PRIORITIES = (0, 100, 500, 2000)
LABEL = "gpuautoscaler.dev/preemptible"
PROTECTED = "serve/llm"  # the managed inference Deployment: its pods are never candidates

PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- random clusters -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    snapshot: ClusterSnapshot
    rules: TrainingRules
    need: GpuNeed

    @property
    def node_types(self) -> dict[str, str | None]:
        return {n.name: n.gpu_product for n in self.snapshot.nodes}

    def candidates(self) -> list[GangCandidate]:
        return gangs_from_snapshot(self.snapshot, NOW, self.rules)

    def choose(self, max_search_nodes: int = 20_000) -> tuple[list[GangCandidate], VictimChoice]:
        candidates = self.candidates()
        free = free_gpus_by_node(self.snapshot)
        return candidates, choose_victims(self.need, free, candidates, self.node_types, max_search_nodes)


# Built once: a strategy made inside the draw is validated anew every time. Repeated values weigh the draws.
NODE_COUNTS = st.sampled_from((1, 2, 3, 4, 5, 6))
NODE_SIZES = st.sampled_from((2, 3, 4, 4, 6, 8, 8))
TYPES = st.sampled_from(GPU_TYPES)
NEED_TYPES = st.sampled_from((None, *GPU_TYPES))
POD_GPUS = st.sampled_from((1, 1, 2, 2, 2, 3, 4, 4, 5, 6, 7, 8))
PHASES = st.sampled_from(("Running", "Running", "Running", "Running", "Succeeded"))
LABELLED_FALSE = st.sampled_from((False,) * 15 + (True,))
AGES = st.sampled_from((None, 60.0, 900.0, 3600.0, 3600.0, 7200.0, 7200.0))  # None: no creation time (started now)
CHECKPOINTS = st.one_of(st.none(), st.integers(0, 7200))  # seconds ago
GANG_COUNTS = st.sampled_from((1, 2, 3, 4, 5, 6, 7, 8))
GANG_SIZES = st.sampled_from((1, 2, 3, 4))
GANG_PRIORITIES = st.sampled_from((*PRIORITIES, 0, 100))  # mostly preemptible
SOLO_COUNTS = st.sampled_from((0, 1, 2, 3, 4, 5, 6, 7, 8))
ONE_OF_PRIORITIES = st.sampled_from(PRIORITIES)
ONE_OF_NAMESPACES = st.sampled_from(NAMESPACES)
ONE_OF_TEAMS = st.sampled_from(TEAMS)
UP_TO_2 = st.integers(0, 2)
ALLOWED = st.integers(0, 4)
BARS = st.sampled_from((1000, 600))
MIN_RUNTIMES = st.sampled_from((0.0, 600.0, 1800.0))
REPLICAS = st.sampled_from((1, 1, 2, 2, 3, 4))
PER_REPLICA = st.sampled_from((1, 1, 2, 2, 3, 4, 4))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    """1-6 ready nodes; 1-8 gangs "job/<ns>/j<k>" of 1-4 pods and 0-8 pods on their own, each placed on a node where
    it fits (on the roomiest node with what is left when none fits, dropped when the cluster is full); a few pods of
    the protected inference Deployment; 0-2 PDBs selecting a job or a team; a need of 1-4 replicas x 1-4 GPUs."""
    nodes = tuple(NodeInfo(f"n{i}", draw(NODE_SIZES), draw(TYPES), None, True) for i in range(draw(NODE_COUNTS)))
    room = {n.name: n.allocatable_gpus for n in nodes}
    pods: list[PodInfo] = []

    def place(gpus: int) -> tuple[str, int] | None:
        fitting = [n for n, left in room.items() if left >= gpus]
        if not fitting:
            roomiest = max(room, key=lambda n: room[n])
            return None if room[roomiest] == 0 else (roomiest, room[roomiest])
        return fitting[draw(st.integers(0, len(fitting) - 1))], gpus

    def pod(namespace: str, name: str, gang: str | None, priority: int, labels: dict[str, str], **kw: object) -> None:
        spot = place(draw(POD_GPUS))
        if spot is None:
            return
        node_name, gpus = spot
        phase = draw(PHASES)
        if phase == "Running":  # a finished pod holds no GPUs
            room[node_name] -= gpus
        if draw(LABELLED_FALSE):
            labels = {**labels, LABEL: "false"}
        age, checkpoint = draw(AGES), draw(CHECKPOINTS)
        fields: dict[str, object] = {
            "namespace": namespace,
            "name": name,
            "node": node_name,
            "gpus": gpus,
            "priority": priority,
            "phase": phase,
            "ready": phase == "Running",
            "gang": gang,
            "created_at": None if age is None else NOW - age,
            "last_checkpoint_at": None if checkpoint is None else NOW - checkpoint,
            "labels": labels,
        }
        fields.update(kw)
        pods.append(PodInfo(**fields))  # type: ignore[arg-type]

    gang_names: list[tuple[str, str]] = []
    for j in range(draw(GANG_COUNTS)):
        namespace, team, priority = draw(ONE_OF_NAMESPACES), draw(ONE_OF_TEAMS), draw(GANG_PRIORITIES)
        gang_names.append((namespace, f"j{j}"))
        for i in range(draw(GANG_SIZES)):
            pod(namespace, f"j{j}-w{i}", f"job/{namespace}/j{j}", priority, {"job-name": f"j{j}", "team": team})
    for k in range(draw(SOLO_COUNTS)):
        pod(draw(ONE_OF_NAMESPACES), f"solo{k}", None, draw(ONE_OF_PRIORITIES), {"team": draw(ONE_OF_TEAMS)})
    for k in range(draw(UP_TO_2)):  # inference pods of the protected Deployment: cheap, old, but never taken
        pod("serve", f"llm-{k}", None, 0, {"app": "llm"}, owner_kind="Deployment", owner_name="llm", created_at=0.0)

    pdbs = []
    for k in range(draw(UP_TO_2)):
        if bool(gang_names) and draw(st.booleans()):
            namespace, job = gang_names[draw(st.integers(0, len(gang_names) - 1))]
            selector = {"job-name": job}
        else:
            namespace, selector = draw(ONE_OF_NAMESPACES), {"team": draw(ONE_OF_TEAMS)}
        pdbs.append(PodDisruptionBudgetInfo(namespace, f"pdb{k}", selector, draw(ALLOWED)))

    rules = TrainingRules(draw(BARS), min_runtime_s=draw(MIN_RUNTIMES), protected=frozenset({PROTECTED}))
    need = GpuNeed(draw(REPLICAS), draw(PER_REPLICA), draw(NEED_TYPES))
    return World(ClusterSnapshot(time=NOW, pods=tuple(pods), nodes=nodes, pdbs=tuple(pdbs)), rules, need)


# ---- the oracle ----------------------------------------------------------------------------------------------


def live(pod: PodInfo) -> bool:
    return pod.node is not None and pod.phase not in ("Succeeded", "Failed")


def gang_members(world: World) -> dict[str, list[PodInfo]]:
    """Gang id -> its live GPU pods (a pod without a gang is a gang of its own), the protected inference aside."""
    out: dict[str, list[PodInfo]] = defaultdict(list)
    for p in world.snapshot.pods:
        if not live(p) or p.gpus <= 0:
            continue
        if p.owner_kind == "Deployment" and f"{p.namespace}/{p.owner_name}" in world.rules.protected:
            continue
        out[p.gang or f"pod/{p.namespace}/{p.name}"].append(p)
    return dict(out)


def pdb_covered(pdb: PodDisruptionBudgetInfo, pods: Iterable[PodInfo]) -> int:
    return sum(
        1 for p in pods if p.namespace == pdb.namespace and all(p.labels.get(k) == v for k, v in pdb.selector.items())
    )


def may_take(world: World, pods: Sequence[PodInfo]) -> bool:
    """The rules: preemptible (every pod's priority below the bar, no pod labelled false), past its minimum
    runtime, no pod under more than one PodDisruptionBudget, and no budget it would exceed on its own."""
    rules = world.rules
    if max(p.priority for p in pods) >= rules.preemptible_below_priority:
        return False
    if any(p.labels.get(rules.non_preemptible_label) == "false" for p in pods):
        return False
    created = [p.created_at for p in pods if p.created_at is not None]
    started = min(created) if created else NOW
    if NOW - started < rules.min_runtime_s:
        return False
    budgets = [pdb for pdb in world.snapshot.pdbs if pdb.selector]
    if any(sum(pdb_covered(pdb, [p]) for pdb in budgets) > 1 for p in pods):
        return False  # the Eviction API refuses a pod that more than one budget selects
    return all(pdb_covered(pdb, pods) <= pdb.disruptions_allowed for pdb in budgets)


def eligible_gangs(world: World) -> set[str]:
    return {gang for gang, pods in gang_members(world).items() if may_take(world, pods)}


def free_after(world: World, victims: Iterable[str]) -> dict[str, int]:
    """Free GPUs per ready node once the live pods of the ``victims`` gangs are gone."""
    members = gang_members(world)
    gone = {(p.namespace, p.name) for gang in victims for p in members[gang]}
    free = {n.name: n.allocatable_gpus for n in world.snapshot.nodes if n.ready}
    for p in world.snapshot.pods:
        if live(p) and (p.namespace, p.name) not in gone and p.node in free:
            free[p.node] -= p.gpus
    return {n: max(0, g) for n, g in free.items()}


def room_for(world: World, free: Mapping[str, int]) -> int:
    """Replicas that fit: sum over the nodes of the right type of floor(free / gpus_per_replica)."""
    types = world.node_types
    want = world.need.gpu_type
    return sum(g // world.need.gpus_per_replica for n, g in free.items() if want is None or types[n] == want)


def met_without(world: World, victims: Iterable[str]) -> bool:
    return room_for(world, free_after(world, victims)) >= world.need.replicas


def possible_within_pdbs(world: World) -> bool:
    """Some set of eligible gangs, within every PodDisruptionBudget together, makes room (every subset tried)."""
    members = gang_members(world)
    gangs = sorted(eligible_gangs(world))
    budgets = [pdb for pdb in world.snapshot.pdbs if pdb.selector]
    for size in range(len(gangs) + 1):
        for subset in itertools.combinations(gangs, size):
            pods = [p for g in subset for p in members[g]]
            if all(pdb_covered(pdb, pods) <= pdb.disruptions_allowed for pdb in budgets) and met_without(world, subset):
                return True
    return False


SEARCH_BUDGETS = st.sampled_from((1, 3, 20_000))  # a search cut short must keep rules 1-4 too


# ---- the properties ------------------------------------------------------------------------------------------


@PROPERTIES
@given(worlds(), SEARCH_BUDGETS)
def test_a_gang_is_never_split(world: World, budget: int) -> None:
    """A victim is a whole gang: all its live GPU pods in the snapshot, holding the GPUs it is credited with, and
    none of another gang's."""
    _, choice = world.choose(budget)
    members = gang_members(world)
    assert len({v.gang for v in choice.victims}) == len(choice.victims)
    seen: set[tuple[str, str]] = set()
    for v in choice.victims:
        expected = {(p.namespace, p.name) for p in members[v.gang]}
        assert set(v.pods) == expected, v.gang
        assert len(v.pods) == len(expected)
        assert not seen & expected
        seen |= expected
        by_node: dict[str, int] = defaultdict(int)
        for p in members[v.gang]:
            by_node[p.node or ""] += p.gpus
        assert dict(v.gpus_by_node) == dict(by_node)


@PROPERTIES
@given(worlds(), SEARCH_BUDGETS)
def test_what_may_not_be_taken_is_never_taken(world: World, budget: int) -> None:
    """Never a non-preemptible gang (priority at or above the bar, or labelled false), never one inside its minimum
    runtime, never one with more pods under a PDB than it allows; never the protected inference. The candidates say
    why_not exactly for the gangs the rules forbid."""
    candidates, choice = world.choose(budget)
    eligible = eligible_gangs(world)
    assert {c.gang for c in candidates} == set(gang_members(world))
    assert {c.gang for c in candidates if c.why_not is None} == eligible
    assert {c.gang for c in choice.ineligible} == set(gang_members(world)) - eligible
    pods_by_name = {(p.namespace, p.name): p for p in world.snapshot.pods}
    for v in choice.victims:
        assert v.gang in eligible, v.gang
        pods = [pods_by_name[key] for key in v.pods]
        assert v.priority < world.rules.preemptible_below_priority
        assert all(p.labels.get(LABEL) != "false" for p in pods)
        started = min((p.created_at for p in pods if p.created_at is not None), default=NOW)
        assert NOW - started >= world.rules.min_runtime_s
        assert all(p.owner_name != "llm" for p in pods)
        for pdb in world.snapshot.pdbs:
            if pdb.selector:
                assert pdb_covered(pdb, pods) <= pdb.disruptions_allowed, (v.gang, pdb)


@PROPERTIES
@given(worlds(), SEARCH_BUDGETS)
def test_met_means_met_and_unmet_means_impossible(world: World, budget: int) -> None:
    """``met``: once the victims are gone there is room for every replica. Not ``met``: no victims, and no set of
    eligible gangs that stays within every PodDisruptionBudget *together* makes room (brute force) -- unless the
    search was cut short (``exact`` False), which may miss the one set that would."""
    _, choice = world.choose(budget)
    possible = possible_within_pdbs(world)
    if choice.met:
        assert met_without(world, (v.gang for v in choice.victims))
        assert possible
    else:
        assert choice.victims == ()
        assert not possible or not choice.exact
    if choice.exact:
        assert choice.met == possible
    # the public need_met agrees with the oracle on the victims' result
    freed = free_after(world, (v.gang for v in choice.victims))
    assert need_met(freed, world.need, world.node_types) == (room_for(world, freed) >= world.need.replicas)


@PROPERTIES
@given(worlds(), SEARCH_BUDGETS)
def test_the_set_is_minimal(world: World, budget: int) -> None:
    """No victim can be spared: without any one of them the need is not met."""
    _, choice = world.choose(budget)
    gangs = [v.gang for v in choice.victims]
    for spared in gangs:
        assert not met_without(world, [g for g in gangs if g != spared]), spared


def useful_priorities(world: World, candidates: Sequence[GangCandidate]) -> list[int]:
    """As choose_victims ranks tiers: the priorities of the eligible gangs holding GPUs on a node of the right type,
    from the highest down."""
    types = world.node_types
    want = world.need.gpu_type
    useful = [
        c for c in candidates if c.why_not is None and any(want is None or types.get(n) == want for n in c.gpus_by_node)
    ]
    return sorted({c.priority for c in useful}, reverse=True)


@settings(PROPERTIES, max_examples=500)  # the search beats its greedy start in few random worlds: more of them
@given(worlds())
def test_the_set_is_the_cheapest(world: World) -> None:
    """Exact search on a small cluster: no set of eligible gangs that meets the need within every PDB costs less
    (brute force over every subset), the cost being victim_set_cost over the useful gangs' priority tiers."""
    candidates, choice = world.choose()
    eligible = [c for c in candidates if c.why_not is None]
    if not choice.met or len(eligible) > 10:
        return
    assert choice.exact  # at most 2**11 - 1 search nodes, far below the budget
    priorities = useful_priorities(world, candidates)
    chosen = victim_set_cost(choice.victims, priorities)
    pods_by_name = {(p.namespace, p.name): p for p in world.snapshot.pods}

    def within_pdbs(subset: tuple[GangCandidate, ...]) -> bool:
        evicted = [pods_by_name[key] for c in subset for key in c.pods]
        return all(
            pdb_covered(pdb, evicted) <= pdb.disruptions_allowed for pdb in world.snapshot.pdbs if pdb.selector
        )

    feasible = [
        subset
        for r in range(len(eligible) + 1)
        for subset in itertools.combinations(eligible, r)
        if met_without(world, (c.gang for c in subset)) and within_pdbs(subset)
    ]
    cheaper = [[c.gang for c in s] for s in feasible if victim_set_cost(s, priorities) < chosen]
    assert not cheaper, ([v.gang for v in choice.victims], cheaper)


@PROPERTIES
@given(worlds(), SEARCH_BUDGETS, st.randoms(use_true_random=False))
def test_same_input_same_victims(world: World, budget: int, rng: random.Random) -> None:
    """The same input gives the same victims; so does the same input listed in another order."""
    candidates, first = world.choose(budget)
    free = free_gpus_by_node(world.snapshot)
    again = choose_victims(world.need, free, candidates, world.node_types, budget)
    assert again == first
    shuffled = list(candidates)
    rng.shuffle(shuffled)
    reordered = choose_victims(world.need, dict(reversed(free.items())), shuffled, world.node_types, budget)
    assert [v.gang for v in reordered.victims] == [v.gang for v in first.victims]
    assert (reordered.met, reordered.exact) == (first.met, first.exact)


# ---- a PodDisruptionBudget is a budget for the whole set ------------------------------------------------------


def _two_gangs_one_pdb() -> World:
    """Two 1-pod gangs of team vision, each alone within ``pdb0`` (1 disruption allowed); the need (2 replicas x 4
    GPUs) takes both, i.e. 2 disruptions."""
    pods = tuple(
        PodInfo(
            "ml",
            f"j{j}-w0",
            f"n{j}",
            4,
            0,
            "Running",
            True,
            gang=f"job/ml/j{j}",
            created_at=NOW - 7200,
            labels={"job-name": f"j{j}", "team": "vision"},
        )
        for j in range(2)
    )
    nodes = tuple(NodeInfo(f"n{j}", 4, "A100", None, True) for j in range(2))
    pdb = PodDisruptionBudgetInfo("ml", "pdb0", {"team": "vision"}, 1)
    snapshot = ClusterSnapshot(time=NOW, pods=pods, nodes=nodes, pdbs=(pdb,))
    return World(snapshot, TrainingRules(protected=frozenset({PROTECTED})), GpuNeed(2, 4, None))


@PROPERTIES
@example(_two_gangs_one_pdb())
@given(worlds())
def test_the_victims_together_stay_within_every_pdb(world: World) -> None:
    """All the victims together evict no more pods under a PDB than its disruptions_allowed."""
    _, choice = world.choose()
    pods_by_name = {(p.namespace, p.name): p for p in world.snapshot.pods}
    evicted = [pods_by_name[key] for v in choice.victims for key in v.pods]
    for pdb in world.snapshot.pdbs:
        if pdb.selector:
            assert pdb_covered(pdb, evicted) <= pdb.disruptions_allowed, pdb


# ---- GPUs on a node that is not ready are not free GPUs ------------------------------------------------------


@st.composite
def worlds_with_a_node_down(draw: st.DrawFn) -> World:
    """A random world where some nodes went NotReady with their pods still bound there."""
    world = draw(worlds())
    down = draw(st.sets(st.sampled_from([n.name for n in world.snapshot.nodes]), min_size=1))
    nodes = tuple(dataclasses.replace(n, ready=n.name not in down) for n in world.snapshot.nodes)
    return dataclasses.replace(world, snapshot=dataclasses.replace(world.snapshot, nodes=nodes))


def _cheap_gang_on_a_node_down() -> World:
    """Gang a (8 GPUs, checkpointed 10 s ago) is on NotReady n0, gang b (8 GPUs, never checkpointed) on ready n1;
    1 replica x 8 GPUs is needed. Stopping a frees nothing schedulable."""
    nodes = (NodeInfo("n0", 8, "H100", None, False), NodeInfo("n1", 8, "H100", None, True))
    pods = (
        PodInfo("ml", "a", "n0", 8, 0, "Running", True, created_at=NOW - 7200, last_checkpoint_at=NOW - 10),
        PodInfo("ml", "b", "n1", 8, 0, "Running", True, created_at=NOW - 7200),
    )
    snapshot = ClusterSnapshot(time=NOW, pods=pods, nodes=nodes)
    return World(snapshot, TrainingRules(protected=frozenset({PROTECTED})), GpuNeed(1, 8, None))


@PROPERTIES
@example(_cheap_gang_on_a_node_down())
@given(worlds_with_a_node_down())
def test_gpus_on_a_node_down_are_not_freed(world: World) -> None:
    """``met`` holds on the ready nodes: evicting a pod of a NotReady node makes no room for a replica."""
    _, choice = world.choose()
    if choice.met:
        assert met_without(world, (v.gang for v in choice.victims))
