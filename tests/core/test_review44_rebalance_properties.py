"""Review 44: property tests of the rebalance planner (``core/rebalance.py``, issue 15) on random small clusters.

The clusters are drawn as valid ``ClusterSnapshot``s: a few nodes of one or two GPU types (on-prem and burst pools,
now and then NotReady, tainted for maintenance, labelled with a zone or annotated as kept), Deployments whose replicas
sit on nodes that admit them (some pending, starting, being deleted, annotated do-not-disrupt or opted in to moves),
training gangs (some allowed to move, checkpointed at various ages, of owners that do or do not restart them),
DaemonSet, static, bare and StatefulSet pods, waiting pods, workloads this controller suspended, and
PodDisruptionBudgets over one Deployment, several, a gang, a team of gangs or a whole namespace.

Every rule is checked against an oracle written here from the module's docstring, independently of the planner's
own code: what may move, the budgets over a whole pass, the bounds over a multi-pass run, the worth of every move,
where a move may land, and that the plan does not depend on the order the snapshot lists things in.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.core.cluster import (
    CHECKPOINT_CLOCK_SKEW_S,
    ClusterSnapshot,
    DeploymentInfo,
    LabelTest,
    NodeInfo,
    PodDisruptionBudgetInfo,
    PodInfo,
    Taint,
    Toleration,
    WorkloadInfo,
    pod_schedulable_on,
    selector_matching_every_pod,
)
from autoscaler.core.model import EvictPod
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import (
    HOUR_S,
    REBALANCE_LABEL,
    RebalanceConfig,
    RebalancePlan,
    RebalanceState,
    plan_rebalance,
    record_pass,
)

NOW = 1_800_000_000.0
BURST = "burst"
ALLOWED = {REBALANCE_LABEL: "allowed"}
MAINTENANCE = Taint("maintenance", None, "NoSchedule")
TOLERATES_MAINTENANCE = Toleration("maintenance", "Exists")
NODE_BOUND = frozenset({"DaemonSet", "Node"})
NOT_RESTARTED_ELSEWHERE = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "ReplicationController"})

PROPERTIES = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# ---- random clusters -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    snapshot: ClusterSnapshot
    config: RebalanceConfig
    state: RebalanceState = field(default_factory=RebalanceState)
    protected: frozenset[str] = frozenset()
    managed: frozenset[str] | None = None
    leaving: frozenset[str] = frozenset()
    resumable: frozenset[str] | None = None
    now: float = NOW

    def plan(
        self, snapshot: ClusterSnapshot | None = None, state: RebalanceState | None = None, now: float | None = None
    ) -> tuple[RebalancePlan, RebalanceState]:
        return plan_rebalance(
            self.snapshot if snapshot is None else snapshot,
            self.now if now is None else now,
            self.config,
            self.state if state is None else state,
            protected=self.protected,
            managed=self.managed,
            leaving=self.leaving,
            resumable=self.resumable,
        )


TYPE_SETS = st.sampled_from((("A100",), ("A100",), ("A100", "H100")))
NODE_GPUS = st.sampled_from((4, 8, 8))
POOLS = st.sampled_from(("onprem", "onprem", BURST))
RARE = st.sampled_from((False,) * 9 + (True,))
SELDOM = st.sampled_from((False,) * 24 + (True,))
SOMETIMES = st.sampled_from((False, False, False, True))
ZONES = st.sampled_from(("a", "b"))
REPLICA_GPUS = st.sampled_from((1, 1, 2, 4))
GANG_GPUS = st.sampled_from((1, 2, 4, 8))
PENDING_GPUS = st.sampled_from((2, 4, 6, 8))
CHECKPOINT_AGES = st.sampled_from((None, 30.0, 300.0, 590.0, 900.0, 5000.0, -60.0))
GANG_OWNERS = st.sampled_from(("Job", "Job", "Job", "PyTorchJob", "StatefulSet", None))
PRIORITIES = st.sampled_from((0, 100, 100, 500, 2000))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    """2-6 nodes; 1-4 Deployments of 1-4 replicas; 0-3 gangs of 1-3 pods; a few pods of other owners; 0-2 waiting
    pods and a suspended workload; 0-3 budgets; a random config, move history and caller's sets. Half the worlds are
    drawn *fragmented* (one or two GPU types of 8-GPU nodes, small replicas that may move, a large waiting pod or
    gang, room in the budgets): most plans of the others move nothing, every rule having its say."""
    fragmented = draw(st.booleans())
    rare = SELDOM if fragmented else RARE
    types = draw(TYPE_SETS)
    nodes: list[NodeInfo] = []
    for i in range(draw(st.integers(2, 6))):
        nodes.append(
            NodeInfo(
                f"n{i}",
                8 if fragmented else draw(NODE_GPUS),
                draw(st.sampled_from(types)),
                draw(POOLS),
                not draw(rare),
                labels={"zone": draw(ZONES)},
                taints=(MAINTENANCE,) if draw(rare) else (),
                do_not_disrupt=draw(RARE),
            )
        )
    room = {n.name: n.allocatable_gpus for n in nodes}
    by_name = {n.name: n for n in nodes}
    pods: list[PodInfo] = []

    def where(gpus: int, product: str | None, probe: PodInfo | None) -> str | None:
        fits = [
            n
            for n, left in room.items()
            if left >= gpus
            and (product is None or by_name[n].gpu_product == product)
            and (probe is None or pod_schedulable_on(probe, by_name[n]))
        ]
        if not fits:
            return None
        return draw(st.sampled_from(sorted(fits)))

    def bind(pod: PodInfo, node_name: str | None, ready: bool = True, terminating: bool = False) -> PodInfo:
        if node_name is None:
            return replace(pod, node=None, phase="Pending", ready=False, terminating=False)
        room[node_name] -= pod.gpus
        return replace(
            pod,
            node=node_name,
            phase="Running",
            ready=ready and not terminating,  # the reader: a pod being deleted is never ready
            terminating=terminating,
            deletion_at=NOW + 30.0 if terminating else None,
        )

    # Deployments ------------------------------------------------------------------------------------------------
    deployments = []
    for d in range(draw(st.integers(1, 4))):
        name = f"d{d}"
        spec = draw(st.sampled_from((2, 2, 3, 4) if fragmented else (1, 2, 2, 3, 3, 4)))
        gpus = draw(st.sampled_from((1, 1, 2)) if fragmented else REPLICA_GPUS)
        product = draw(st.sampled_from((None, *types)))
        selector = {"zone": draw(ZONES)} if draw(rare) else {}
        tolerations = (TOLERATES_MAINTENANCE,) if draw(SOMETIMES) else ()
        tier = draw(st.sampled_from(("serve", "batch")))
        opt_in = draw(st.sampled_from(("none", "all", "some", "some")))
        count = spec + draw(st.sampled_from((0,) * 10 + (1, -1)))
        for i in range(max(0, count)):
            labels = {"app": name, "tier": tier}
            if opt_in == "all" or (opt_in == "some" and draw(st.booleans())):
                labels = {**labels, **ALLOWED}
            template = PodInfo(
                "inf",
                f"{name}-{i}",
                None,
                gpus,
                1000,
                "Pending",
                False,
                "Deployment",
                name,
                labels=labels,
                gpu_product=product,
                node_selector=selector,
                tolerations=tolerations,
                do_not_disrupt=draw(rare),
                uid=f"uid-{name}-{i}",
            )
            pods.append(bind(template, where(gpus, product, template), not draw(SELDOM), draw(SELDOM)))
        mine = [p for p in pods if p.owner_name == name and p.owner_kind == "Deployment"]
        ready = sum(1 for p in mine if p.ready)
        deployments.append(
            DeploymentInfo(
                "inf",
                name,
                spec,
                min(spec, ready),
                {"app": name},
                product,
                node_selector=selector,
                tolerations=tolerations,
                gpus_per_pod=gpus,
            )
        )

    # training gangs ---------------------------------------------------------------------------------------------
    gang_ids = []
    for g in range(draw(st.integers(0, 3))):
        name = f"g{g}"
        gang = f"job/ml/{name}"
        gang_ids.append(gang)
        size = draw(st.integers(1, 3))
        gpus = draw(GANG_GPUS)
        product = draw(st.sampled_from((None, *types)))
        owner = draw(st.sampled_from(("Job", "PyTorchJob")) if fragmented else GANG_OWNERS)
        allowed = draw(st.sampled_from((True, True, False)))
        age = draw(st.sampled_from((30.0, 300.0, 900.0)) if fragmented else CHECKPOINT_AGES)
        priority = draw(PRIORITIES)
        team = draw(st.sampled_from(("vision", "speech")))
        members = []
        for i in range(size):
            labels = {"job-name": name, "team": team}
            if allowed or draw(RARE):
                labels = {**labels, **ALLOWED}
            members.append(
                PodInfo(
                    "ml",
                    f"{name}-w{i}",
                    None,
                    gpus,
                    priority,
                    "Pending",
                    False,
                    owner,
                    name if owner else None,
                    gang=gang,
                    last_checkpoint_at=None if age is None or draw(rare) else NOW - age,
                    labels=labels,
                    gpu_product=product,
                    tolerations=(),
                    do_not_disrupt=draw(rare),
                    uid=f"uid-{name}-{i}",
                )
            )
        spots = []
        for member in members:
            spot = where(gpus, product, member)
            spots.append(spot)
            if spot is not None:
                room[spot] -= gpus
        for spot in spots:
            if spot is not None:
                room[spot] += gpus
        if None in spots or draw(RARE):
            spots = [None] * size  # waiting, whole
        pods += [bind(m, s, not draw(SELDOM)) for m, s in zip(members, spots, strict=True)]

    # pods that are part of their node, and pods no controller recreates elsewhere --------------------------------
    for k in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(("DaemonSet", "Node", "StatefulSet", None, None)))
        probe = PodInfo(
            "inf",
            f"other{k}",
            None,
            1,
            1000,
            "Pending",
            False,
            kind,
            f"o{k}" if kind else None,
            labels={"tier": "serve", "app": f"o{k}"},
            tolerations=(),
        )
        spot = where(1, None, probe)
        if spot is not None:
            pods.append(bind(probe, spot))

    if fragmented:  # training that may not move fills each node but for a GPU or three: the free GPUs scattered
        for name in sorted(room):
            take = room[name] - draw(st.sampled_from((2, 1, 2, 3)))
            if take > 0:
                pods.append(
                    bind(
                        PodInfo(
                            "ml",
                            f"fill-{name}",
                            None,
                            take,
                            100,
                            "Pending",
                            False,
                            "Job",
                            f"fill-{name}",
                            gang=f"job/ml/fill-{name}",
                            tolerations=(),
                        ),
                        name,
                    )
                )

    # waiting pods --------------------------------------------------------------------------------------------------
    for k in range(draw(st.sampled_from((1, 1, 2)) if fragmented else st.integers(0, 2))):
        kind = draw(st.sampled_from((None, None, "Job", "DaemonSet", "StatefulSet")))
        waiting = PodInfo(
            "ml",
            f"wait{k}",
            None,
            draw(st.sampled_from((4, 2, 4, 6, 8)) if fragmented else PENDING_GPUS),
            draw(PRIORITIES),
            "Pending",
            False,
            kind,
            f"w{k}" if kind else None,
            labels={"team": "vision"},
            gpu_product=draw(st.sampled_from((None, *types))),
            node_selector={"zone": draw(ZONES)} if draw(SOMETIMES) else {},
            tolerations=(),
        )
        if fragmented and kind == "Job" and draw(st.booleans()):  # a waiting gang of two
            pods += [replace(waiting, name=f"wait{k}-{i}", gang=f"job/ml/w{k}") for i in range(2)]
        else:
            pods.append(waiting)
    workloads = []
    suspended = []
    for k in range(draw(st.integers(0, 1))):
        shape = draw(st.sampled_from(((8,), (4, 4), (2, 2), (6,))))
        ours = draw(st.sampled_from((True, True, False)))
        workloads.append(
            WorkloadInfo(
                "Job",
                "ml",
                f"s{k}",
                f"job/ml/s{k}",
                True,
                draw(PRIORITIES),
                shape,
                draw(st.sampled_from((None, *types))),
                NOW - 600.0 if ours else None,
            )
        )
        suspended.append(f"Job/ml/s{k}")

    # budgets --------------------------------------------------------------------------------------------------------
    pdbs = []
    for k in range(draw(st.integers(0, 3))):
        which = draw(st.sampled_from(("app", "app", "tier", "team", "job", "namespace", "in")))
        namespace = "ml" if which in ("team", "job") else "inf"
        selector: dict[str, str | LabelTest]
        if which == "app":
            selector = {"app": f"d{draw(st.integers(0, 3))}"}
        elif which == "tier":
            selector = {"tier": draw(st.sampled_from(("serve", "batch")))}
        elif which == "team":
            selector = {"team": draw(st.sampled_from(("vision", "speech")))}
        elif which == "job":
            selector = {"job-name": f"g{draw(st.integers(0, 2))}"}
        elif which == "namespace":
            selector = selector_matching_every_pod()
        else:
            selector = {"app": LabelTest((("In", frozenset({"d0", "d1"})),))}
        pdbs.append(PodDisruptionBudgetInfo(namespace, f"pdb{k}", selector, draw(st.integers(0, 3))))

    config = RebalanceConfig(
        max_moves_per_pass=draw(st.sampled_from((2, 3, 4)) if fragmented else st.sampled_from((0, 1, 2, 4))),
        max_moves_per_hour=draw(st.sampled_from((3, 4, 8)) if fragmented else st.sampled_from((0, 1, 2, 8))),
        min_gain_per_move=draw(st.sampled_from((0.0, 0.5, 1.0, 2.0, 2.0, 4.0, 8.0))),
        burst_pools=frozenset({BURST}),
        burst_empty_below=draw(st.sampled_from((0.5, 0.75))),
        training_excluded_pools=draw(st.sampled_from((frozenset(), frozenset({BURST})))),
        spare_replicas_only=False,
    )
    prior = tuple(
        sorted(
            NOW - draw(st.sampled_from((100.0, 1800.0, 3599.0, 3600.0, 5000.0)))
            for _ in range(draw(st.sampled_from((0, 0, 0, 1, 3))))
        )
    )
    owners = [f"deployment/inf/{d.name}" for d in deployments] + gang_ids
    protected = frozenset(o for o in owners if draw(rare))
    managed = None
    if draw(st.booleans()):
        managed = frozenset(f"inf/{d.name}" for d in deployments if draw(st.sampled_from((True, True, False))))
    leaving = frozenset(n.name for n in nodes if n.pool == BURST and draw(rare))
    resumable = None if draw(st.booleans()) else frozenset(s for s in suspended if draw(st.booleans()))
    snapshot = ClusterSnapshot(
        NOW, tuple(deployments), tuple(pods), tuple(nodes), pdbs=tuple(pdbs), workloads=tuple(workloads)
    )
    return World(
        snapshot,
        config,
        RebalanceState(move_times=prior),
        protected,
        managed,
        leaving,
        resumable,
    )


@st.composite
def crowded_worlds(draw: st.DrawFn) -> World:
    """Worlds drawn for moves: 3-6 nodes of 8 GPUs (one or two types, one pool of them burst, now and then one kept
    or tainted), 2-5 Deployments of 2-4 ready 1-2 GPU replicas spread over the nodes, training that may not move
    filling each node but for 0-3 GPUs, 0-2 small gangs allowed to move and checkpointed, 1-3 waiting pods or gangs of
    4-8 GPUs, 1-3 budgets (a Deployment's, a tier of several, the namespace's, a team of gangs), room in the bounds."""
    types = draw(TYPE_SETS)
    nodes = [
        NodeInfo(
            f"n{i}",
            8,
            draw(st.sampled_from(types)),
            draw(st.sampled_from(("onprem", "onprem", "onprem", BURST))),
            True,
            labels={"zone": draw(ZONES)},
            taints=(MAINTENANCE,) if draw(SELDOM) else (),
            do_not_disrupt=draw(RARE),
        )
        for i in range(draw(st.integers(3, 6)))
    ]
    room = {n.name: n.allocatable_gpus for n in nodes}
    by_name = {n.name: n for n in nodes}
    pods: list[PodInfo] = []
    deployments = []
    for d in range(draw(st.integers(2, 5))):
        name = f"d{d}"
        spec = draw(st.integers(2, 4))
        gpus = draw(st.sampled_from((1, 1, 2)))
        product = draw(st.sampled_from((None, None, *types)))
        tolerations = (TOLERATES_MAINTENANCE,) if draw(SOMETIMES) else ()
        tier = draw(st.sampled_from(("serve", "batch")))
        opt_in = draw(st.sampled_from(("all", "all", "some", "none")))
        used: set[str] = set()
        for i in range(spec):
            labels = {"app": name, "tier": tier}
            if opt_in == "all" or (opt_in == "some" and draw(st.booleans())):
                labels = {**labels, **ALLOWED}
            pod = PodInfo(
                "inf",
                f"{name}-{i}",
                None,
                gpus,
                1000,
                "Running",
                True,
                "Deployment",
                name,
                labels=labels,
                gpu_product=product,
                tolerations=tolerations,
                do_not_disrupt=draw(SELDOM),
                uid=f"uid-{name}-{i}",
            )
            fits = sorted(
                n
                for n, left in room.items()
                if left >= gpus
                and (product is None or by_name[n].gpu_product == product)
                and pod_schedulable_on(pod, by_name[n])
            )
            spread = [n for n in fits if n not in used] or fits  # the scheduler spreads a Deployment's replicas
            if not spread:
                pods.append(replace(pod, phase="Pending", ready=False))
                continue
            home = draw(st.sampled_from(spread))
            used.add(home)
            room[home] -= gpus
            pods.append(replace(pod, node=home))
        mine = [p for p in pods if p.owner_name == name]
        deployments.append(
            DeploymentInfo(
                "inf",
                name,
                spec,
                sum(1 for p in mine if p.ready),
                {"app": name},
                product,
                tolerations=tolerations,
                gpus_per_pod=gpus,
            )
        )
    gang_ids = []
    for g in range(draw(st.integers(0, 2))):
        name = f"g{g}"
        gang_ids.append(f"job/ml/{name}")
        gpus = draw(st.sampled_from((1, 2)))
        team = draw(st.sampled_from(("vision", "speech")))
        for i in range(draw(st.integers(1, 2))):
            fits = sorted(n for n, left in room.items() if left >= gpus)
            if not fits:
                break
            home = draw(st.sampled_from(fits))
            room[home] -= gpus
            pods.append(
                PodInfo(
                    "ml",
                    f"{name}-w{i}",
                    home,
                    gpus,
                    100,
                    "Running",
                    True,
                    "Job",
                    name,
                    gang=f"job/ml/{name}",
                    last_checkpoint_at=NOW - draw(st.sampled_from((60.0, 60.0, 900.0))),
                    labels={"job-name": name, "team": team, **ALLOWED},
                    tolerations=(),
                    do_not_disrupt=draw(SELDOM),
                    uid=f"uid-{name}-{i}",
                )
            )
    for name in sorted(room):  # training that may not move fills each node but for a few GPUs
        take = room[name] - draw(st.sampled_from((1, 2, 0, 3)))
        if take > 0:
            room[name] -= take
            pods.append(
                PodInfo(
                    "ml",
                    f"fill-{name}",
                    name,
                    take,
                    100,
                    "Running",
                    True,
                    "Job",
                    f"fill-{name}",
                    gang=f"job/ml/fill-{name}",
                    tolerations=(),
                )
            )
    for k in range(draw(st.integers(1, 3))):
        gpus = draw(st.sampled_from((4, 4, 6, 8, 3)))
        product = draw(st.sampled_from((None, *types)))
        priority = draw(PRIORITIES)
        if draw(st.booleans()):
            pods.append(
                PodInfo(
                    "ml",
                    f"wait{k}",
                    None,
                    gpus,
                    priority,
                    "Pending",
                    False,
                    None,
                    None,
                    labels={"team": "vision"},
                    gpu_product=product,
                    tolerations=(),
                )
            )
        else:
            pods += [
                PodInfo(
                    "ml",
                    f"wait{k}-{i}",
                    None,
                    gpus,
                    priority,
                    "Pending",
                    False,
                    "Job",
                    f"wait{k}",
                    gang=f"job/ml/wait{k}",
                    gpu_product=product,
                    tolerations=(),
                )
                for i in range(2)
            ]
    pdbs = []
    for k in range(draw(st.integers(1, 3))):
        which = draw(st.sampled_from(("tier", "tier", "app", "namespace", "team")))
        namespace = "ml" if which == "team" else "inf"
        selector: dict[str, str | LabelTest]
        if which == "tier":
            selector = {"tier": draw(st.sampled_from(("serve", "batch")))}
        elif which == "app":
            selector = {"app": f"d{draw(st.integers(0, 4))}"}
        elif which == "namespace":
            selector = selector_matching_every_pod()
        else:
            selector = {"team": draw(st.sampled_from(("vision", "speech")))}
        pdbs.append(PodDisruptionBudgetInfo(namespace, f"pdb{k}", selector, draw(st.integers(0, 3))))
    config = RebalanceConfig(
        max_moves_per_pass=draw(st.integers(2, 6)),
        max_moves_per_hour=draw(st.integers(2, 12)),
        min_gain_per_move=draw(st.sampled_from((0.0, 1.0, 2.0, 4.0))),
        burst_pools=frozenset({BURST}),
        training_excluded_pools=draw(st.sampled_from((frozenset(), frozenset({BURST})))),
        spare_replicas_only=False,
    )
    managed = None
    if draw(st.booleans()):
        managed = frozenset(f"inf/{d.name}" for d in deployments if draw(st.booleans()))
    snapshot = ClusterSnapshot(NOW, tuple(deployments), tuple(pods), tuple(nodes), pdbs=tuple(pdbs))
    return World(snapshot, config, managed=managed)


WORLDS = st.one_of(worlds(), crowded_worlds())


# ---- the oracle ----------------------------------------------------------------------------------------------------


def live(pod: PodInfo) -> bool:
    return pod.gpus > 0 and pod.phase not in ("Succeeded", "Failed")


def ready_nodes(world: World) -> dict[str, NodeInfo]:
    return {n.name: n for n in world.snapshot.nodes if n.ready and n.name not in world.leaving}


def budgets_of(world: World, pod: PodInfo) -> list[PodDisruptionBudgetInfo]:
    return [pdb for pdb in world.snapshot.pdbs if pdb.selects(pod)]


def dep_pods(world: World, name: str) -> list[PodInfo]:
    return [p for p in world.snapshot.pods if live(p) and p.owner_kind == "Deployment" and p.owner_name == name]


def gang_pods(world: World, gang: str) -> list[PodInfo]:
    return [p for p in world.snapshot.pods if live(p) and p.gang == gang and p.owner_kind != "Deployment"]


def why_not_movable(world: World, pod: PodInfo) -> str | None:
    """Why the rules forbid moving ``pod`` (as part of its unit), or None."""
    nodes = ready_nodes(world)
    if pod.node not in nodes:
        return "not on a ready node"
    if not pod.ready or pod.terminating:
        return "not ready, or being deleted"
    if pod.do_not_disrupt:
        return "annotated do-not-disrupt"
    if pod.owner_kind == "Deployment":
        dep = next((d for d in world.snapshot.deployments if d.name == pod.owner_name), None)
        mine = dep_pods(world, pod.owner_name or "")
        if dep is None or dep.spec_replicas < 2 or dep.ready_replicas < dep.spec_replicas:
            return "its Deployment has no replica to spare"
        if len(mine) < 2 or len(mine) > dep.spec_replicas or any(not p.ready for p in mine):
            return "its Deployment is starting or scaling"
        if len(budgets_of(world, pod)) > 1:
            return "under two budgets: the Eviction API refuses it"
        owner = f"deployment/inf/{pod.owner_name}"
        if owner in world.protected:
            return "protected"
        if (
            world.managed is not None
            and f"inf/{pod.owner_name}" not in world.managed
            and not all(p.labels.get(REBALANCE_LABEL) == "allowed" for p in mine)
        ):
            return "no valid policy and not opted in on every pod"
        return None
    if pod.gang is None:
        return "a bare pod"
    members = gang_pods(world, pod.gang)
    if pod.gang in world.protected:
        return "protected"
    if any(p.labels.get(REBALANCE_LABEL) != "allowed" for p in members):
        return "a gang not allowed to move"
    if any(p.owner_kind is None or p.owner_kind in NOT_RESTARTED_ELSEWHERE | NODE_BOUND for p in members):
        return "a gang no training controller restarts"
    if any(p.do_not_disrupt for p in members):
        return "a gang with a pod annotated do-not-disrupt"
    if any(len(budgets_of(world, p)) > 1 for p in members):
        return "a gang pod under two budgets"
    if any(p.node not in nodes or not p.ready or p.terminating for p in members):
        return "a gang not all running on ready nodes"
    checkpoints = [
        p.last_checkpoint_at
        for p in members
        if p.last_checkpoint_at is not None and p.last_checkpoint_at <= world.now + CHECKPOINT_CLOCK_SKEW_S
    ]
    if not checkpoints or world.now - max(checkpoints) > world.config.checkpoint_max_age_s:
        return "not checkpointed recently"
    return None


def unit_type(world: World, pod: PodInfo) -> str | None:
    if pod.owner_kind == "Deployment":
        dep = next(d for d in world.snapshot.deployments if d.name == pod.owner_name)
        return pod.gpu_product or dep.gpu_product
    members = gang_pods(world, pod.gang or "")
    types = {w.gang: w.gpu_product for w in world.snapshot.workloads}
    return next((p.gpu_product for p in members if p.gpu_product), None) or types.get(pod.gang or "")


def soon_free(world: World) -> dict[str, int]:
    """Free GPUs per ready node once the pods being deleted are gone (what the planner plans with)."""
    nodes = ready_nodes(world)
    free = {name: n.allocatable_gpus for name, n in nodes.items()}
    for p in world.snapshot.pods:
        if p.node in free and not p.terminating and p.phase not in ("Succeeded", "Failed"):
            free[p.node] -= p.gpus
    return free


def may_host(world: World, node: NodeInfo, gpu_type: str | None, training: bool, pods: Sequence[PodInfo]) -> bool:
    if gpu_type is not None and node.gpu_product != gpu_type:
        return False
    if training and node.pool in world.config.training_excluded_pools:
        return False
    return all(pod_schedulable_on(p, node) for p in pods)


def fits(free: Mapping[str, int], sizes: Sequence[int], ok: Sequence[str]) -> bool:
    """Whether every pod of ``sizes`` fits in the ``free`` GPUs of the nodes ``ok`` (exhaustive, small)."""
    sizes = sorted(sizes, reverse=True)
    left = {n: free.get(n, 0) for n in ok}

    def go(i: int) -> bool:
        if i == len(sizes):
            return True
        for n in sorted(left):
            if left[n] >= sizes[i]:
                left[n] -= sizes[i]
                if go(i + 1):
                    return True
                left[n] += sizes[i]
        return False

    return go(0)


def moved_pods(world: World, plan: RebalancePlan) -> list[PodInfo]:
    by_key = {(p.namespace, p.name): p for p in world.snapshot.pods}
    return [by_key[(a.namespace, a.name)] for a in plan.actions]


# ---- the properties ------------------------------------------------------------------------------------------------


@PROPERTIES
@given(WORLDS)
def test_only_restartable_pods_move_within_every_budget(world: World) -> None:
    """Every eviction is of a pod the rules let move (its whole unit with it: a Deployment's one replica, a gang
    whole), and all the evictions of the pass together keep every PodDisruptionBudget within what it allows."""
    plan, _ = world.plan()
    moved = moved_pods(world, plan)
    assert len({(p.namespace, p.name) for p in moved}) == len(moved)
    for pod, action in zip(moved, plan.actions, strict=True):
        assert isinstance(action, EvictPod) and action.reason is Reason.REBALANCE and action.detail
        assert action.uid == pod.uid
        assert pod.owner_kind not in NODE_BOUND and pod.owner_kind != "StatefulSet"
        why = why_not_movable(world, pod)
        assert why is None, (pod.name, why)
        if pod.owner_kind == "Deployment":
            assert action.gang is None
        else:
            assert action.gang == pod.gang
    # one replica per Deployment, every pod of a moved gang
    per_dep = defaultdict(int)
    for pod in moved:
        if pod.owner_kind == "Deployment":
            per_dep[pod.owner_name] += 1
    assert all(n == 1 for n in per_dep.values()), per_dep
    names = {(p.namespace, p.name) for p in moved}
    for gang in {p.gang for p in moved if p.owner_kind != "Deployment"}:
        assert {(p.namespace, p.name) for p in gang_pods(world, gang or "")} <= names, gang
    for pdb in world.snapshot.pdbs:
        assert sum(1 for p in moved if pdb.selects(p)) <= pdb.disruptions_allowed, pdb.name


@PROPERTIES
@given(WORLDS)
def test_nothing_moves_off_a_kept_node(world: World) -> None:
    """A node annotated not to be disrupted by an autoscaler (``NodeInfo.do_not_disrupt``) keeps its pods."""
    plan, _ = world.plan()
    kept = {n.name for n in world.snapshot.nodes if n.do_not_disrupt}
    for pod in moved_pods(world, plan):
        assert pod.node not in kept, pod.name


@PROPERTIES
@given(WORLDS)
def test_the_bounds_of_one_pass(world: World) -> None:
    plan, state = world.plan()
    recent = [t for t in world.state.move_times if world.now - t < HOUR_S]
    assert len(plan.actions) <= world.config.max_moves_per_pass
    assert len(plan.actions) <= max(0, world.config.max_moves_per_hour - len(recent))
    assert sum(len(m.pods) for m in plan.moves) == len(plan.actions)
    assert state.move_times == (*recent, *(world.now,) * len(plan.actions))
    assert state.last_pass_at == world.now


@PROPERTIES
@given(WORLDS)
def test_every_move_has_a_reason_and_is_worth_it(world: World) -> None:
    """Every move names its target and why, with the target's gain; the gain per pod moved for a target clears
    ``min_gain_per_move``; a target's gain is its GPUs (a waiting pod or gang, a suspended workload) or the burst
    node's."""
    plan, _ = world.plan()
    pods_for: dict[str, int] = defaultdict(int)
    gain_of: dict[str, int] = {}
    nodes = {n.name: n for n in world.snapshot.nodes}
    for move in plan.moves:
        assert move.target and move.detail and move.gain_gpus > 0
        assert move.target in move.detail or move.target.removeprefix("burst node ") in move.detail
        pods_for[move.target] += len(move.pods)
        assert gain_of.setdefault(move.target, move.gain_gpus) == move.gain_gpus
        if move.target.startswith("burst node "):
            assert move.gain_gpus == nodes[move.target.removeprefix("burst node ")].allocatable_gpus
    for target, count in pods_for.items():
        assert gain_of[target] / count >= world.config.min_gain_per_move, (target, gain_of[target], count)


@PROPERTIES
@given(WORLDS)
def test_moves_land_only_where_they_may_and_fit(world: World) -> None:
    """A move lands on ready nodes (not one leaving) of its GPU type, that its pods' nodeSelector and tolerations
    admit, never training on a pool it may not use, never where it is now; all the moves together fit in the free
    GPUs (those of pods being deleted counted free, as the planner does); the targets they serve fit afterwards; a
    burst node emptied keeps only its DaemonSet and static pods and those being deleted."""
    plan, _ = world.plan()
    nodes = ready_nodes(world)
    by_key = {(p.namespace, p.name): p for p in world.snapshot.pods}
    free = soon_free(world)
    for move in plan.moves:
        pods = [by_key[k] for k in move.pods]
        training = move.gang is not None
        gpu_type = unit_type(world, pods[0])
        assert sum(move.destinations.values()) == sum(p.gpus for p in pods)
        assert dict(move.gpus_by_node) == dict(_by_node(pods))
        for dest in move.destinations:
            assert dest in nodes, (move.owner, dest)
            assert may_host(world, nodes[dest], gpu_type, training, pods), (move.owner, dest)
            if not training:
                assert dest != pods[0].node, (move.owner, dest)
        for p in pods:
            free[p.node or ""] += p.gpus
        for dest, gpus in move.destinations.items():
            free[dest] -= gpus
    assert all(left >= 0 for left in free.values()), free
    moved = {k for m in plan.moves for k in m.pods}
    for target in dict.fromkeys(m.target for m in plan.moves):
        if target.startswith("burst node "):
            name = target.removeprefix("burst node ")
            staying = [
                p
                for p in world.snapshot.pods
                if p.node == name
                and live(p)
                and not p.terminating
                and p.owner_kind not in NODE_BOUND
                and (p.namespace, p.name) not in moved
            ]
            assert staying == [], (name, staying)
            assert not nodes[name].do_not_disrupt
        else:
            sizes, gpu_type, training, pods = _target_shape(world, target)
            ok = [n for n, info in nodes.items() if may_host(world, info, gpu_type, training, pods)]
            assert fits(free, sizes, ok), (target, free)


def _by_node(pods: Sequence[PodInfo]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for p in pods:
        out[p.node or ""] += p.gpus
    return out


def _target_shape(world: World, target: str) -> tuple[list[int], str | None, bool, list[PodInfo]]:
    """A move target's pod sizes, GPU type, whether training rules hold it, and its pods (none if suspended)."""
    kind, _, rest = target.partition(" ")
    if kind == "pod":
        ns, name = rest.split("/", 1)
        pod = next(p for p in world.snapshot.pods if (p.namespace, p.name) == (ns, name))
        gpu_type = pod.gpu_product
        if pod.owner_kind == "Deployment":
            dep = next((d for d in world.snapshot.deployments if d.name == pod.owner_name), None)
            gpu_type = pod.gpu_product or (dep.gpu_product if dep else None)
        return [pod.gpus], gpu_type, pod.owner_kind not in NOT_RESTARTED_ELSEWHERE, [pod]
    if kind == "gang":
        pods = sorted(
            (p for p in world.snapshot.pods if p.gang == rest and p.node is None and live(p)),
            key=lambda p: (p.namespace, p.name),
        )
        types = {w.gang: w.gpu_product for w in world.snapshot.workloads}
        gpu_type = next((p.gpu_product for p in pods if p.gpu_product), None) or types.get(rest)
        training = not all(p.owner_kind in NOT_RESTARTED_ELSEWHERE for p in pods)
        return [p.gpus for p in pods], gpu_type, training, pods
    workload = next(w for w in world.snapshot.workloads if target == f"{w.kind} {w.namespace}/{w.name} (suspended)")
    assert workload.suspended_by_us_at is not None  # only ours are moved for
    assert world.resumable is None or f"{workload.kind}/{workload.namespace}/{workload.name}" in world.resumable
    return list(workload.pod_gpus), workload.gpu_product, True, []


@PROPERTIES
@given(WORLDS, st.randoms(use_true_random=False))
def test_the_same_input_gives_the_same_plan_whatever_its_order(world: World, rng: random.Random) -> None:
    """Planned twice, or from the same snapshot listed in another order (pods, nodes, budgets, Deployments,
    workloads, and the caller's sets), the plan and the state are the same."""
    first, state = world.plan()
    again, state_again = world.plan()
    assert (again, state_again) == (first, state)

    def shuffled(items: Sequence) -> tuple:
        out = list(items)
        rng.shuffle(out)
        return tuple(out)

    snap = world.snapshot
    other = replace(
        snap,
        pods=shuffled(snap.pods),
        nodes=shuffled(snap.nodes),
        pdbs=shuffled(snap.pdbs),
        deployments=shuffled(snap.deployments),
        workloads=shuffled(snap.workloads),
    )
    reordered = replace(
        world,
        snapshot=other,
        protected=frozenset(shuffled(sorted(world.protected))),
        leaving=frozenset(shuffled(sorted(world.leaving))),
        state=replace(world.state, move_times=world.state.move_times),
    )
    plan, new_state = reordered.plan()
    assert plan.moves == first.moves
    assert plan.actions == first.actions
    assert (plan.stranded_gpus, plan.stranded_after) == (first.stranded_gpus, first.stranded_after)
    assert new_state == state
    # the one note that names budgets in the snapshot's order (core.victims.unevictable_under_budgets) aside
    assert sorted(map(_budgets_sorted, plan.notes)) == sorted(map(_budgets_sorted, first.notes))


def _budgets_sorted(note: str) -> str:
    return re.sub(r"PodDisruptionBudgets \(([^)]*)\)", lambda m: ", ".join(sorted(m.group(1).split(", "))), note)


# ---- a multi-pass run: the bounds hold over time --------------------------------------------------------------------


def _apply(snapshot: ClusterSnapshot, plan: RebalancePlan, made: set[tuple[str, str]], now: float) -> ClusterSnapshot:
    """The made moves land where the plan expects (a replacement ready at once); then waiting pods that fit are bound
    (first fit, where they may run)."""
    dest: dict[tuple[str, str], str] = {}
    for move in plan.moves:
        slots = [n for n, g in sorted(move.destinations.items()) for _ in range(g)]
        by_key = {(p.namespace, p.name): p for p in snapshot.pods}
        for key in move.pods:
            gpus = by_key[key].gpus
            node, slots = slots[0], slots[gpus:]
            if key in made:
                dest[key] = node
    nodes = {n.name: n for n in snapshot.nodes}
    pods = [replace(p, node=dest[(p.namespace, p.name)]) if (p.namespace, p.name) in dest else p for p in snapshot.pods]
    free = {n.name: n.allocatable_gpus for n in snapshot.nodes if n.ready}
    for p in pods:
        if p.node in free and live(p):
            free[p.node] -= p.gpus
    out = []
    for p in pods:
        if p.node is None and p.phase == "Pending" and p.owner_kind != "DaemonSet":
            home = next(
                (
                    n
                    for n in sorted(free)
                    if free[n] >= p.gpus
                    and (p.gpu_product is None or nodes[n].gpu_product == p.gpu_product)
                    and pod_schedulable_on(p, nodes[n])
                ),
                None,
            )
            if home is not None:
                free[home] -= p.gpus
                p = replace(p, node=home, phase="Running", ready=True)
        out.append(p)
    return replace(snapshot, time=now, pods=tuple(out))


STEPS = st.lists(
    st.tuples(
        st.sampled_from((1.0, 60.0, 299.0, 300.0, 600.0, 1200.0, 3600.0)), st.sampled_from(("all", "none", "half"))
    ),
    min_size=4,
    max_size=16,
)


@PROPERTIES
@given(WORLDS, STEPS, st.sampled_from((60.0, 300.0, 900.0)))
def test_the_bounds_hold_over_a_multi_pass_run(world: World, steps: list[tuple[float, str]], interval: float) -> None:
    """The planner's state fed forward pass after pass, time advancing, its evictions made (all, none or some:
    ``record_pass``) and a new gang arriving now and then: no pass within ``interval_s`` of the last, no pass moves more
    than ``max_moves_per_pass``, no hour (the prior evictions included) holds more than ``max_moves_per_hour``, and a
    target still waiting after a pass of moves made for it is not moved for again before its retry wait (doubling)."""
    config = replace(world.config, interval_s=interval)
    world = replace(world, config=config)
    snapshot, state, now = world.snapshot, world.state, world.now
    made_times = [t for t in state.move_times]
    last_ran: float | None = None
    passes_for: dict[str, list[float]] = defaultdict(list)
    for step, (dt, made) in enumerate(steps):
        plan, planned = world.plan(snapshot=replace(snapshot, time=now), state=state, now=now)
        if plan.ran:
            assert last_ran is None or now - last_ran >= config.interval_s
            last_ran = now
        else:
            assert plan.actions == () and planned == state
        assert len(plan.actions) <= config.max_moves_per_pass
        keys = [(a.namespace, a.name) for a in plan.actions]
        applied = set(keys if made == "all" else keys[::2] if made == "half" else [])
        state = record_pass(state, planned, plan, now, applied) if plan.ran else planned
        made_times += [now] * sum(1 for k in keys if k in applied)
        for target in dict.fromkeys(m.target for m in plan.moves):
            before = passes_for[target]
            if before:  # none of the simulated targets waits again once placed: it was waiting all along
                waited = config.retry_wait_s(min(len(before), config.attempts_remembered()))
                assert now - before[-1] >= waited, (target, before, now)
            if any(k in applied for m in plan.moves if m.target == target for k in m.pods):
                before.append(now)
        snapshot = _apply(snapshot, plan, applied, now)
        if step % 3 == 2:  # a new 8-GPU gang waits
            snapshot = replace(
                snapshot,
                pods=(
                    *snapshot.pods,
                    PodInfo(
                        "ml",
                        f"new{step}",
                        None,
                        8,
                        100,
                        "Pending",
                        False,
                        "Job",
                        f"new{step}",
                        gang=f"job/ml/new{step}",
                        tolerations=(),
                    ),
                ),
            )
        now += dt
    for t in made_times:
        in_hour = sum(1 for u in made_times if t - HOUR_S < u <= t)
        assert in_hour <= max(config.max_moves_per_hour, sum(1 for u in world.state.move_times if t - HOUR_S < u <= t))
