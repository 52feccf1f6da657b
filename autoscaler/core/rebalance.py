"""The rebalance planner (issue 15, item 3): bounded pod moves that make room for what waits, pure.

GPUs free in ones and twos across nodes cannot host an 8-GPU training pod or a 4-GPU replica, and a burst node kept
alive by one stray replica costs money all night. A *move* is an eviction whose replacement lands elsewhere (a
Deployment's ReplicaSet recreates the pod; the scheduler -- bin-packing, or this project's extender -- places it on
the fullest node that fits, the destination the plan expects). Karpenter's consolidation is the model: a move is
made only when what it gains is worth its disruption.

Rules:

- **What may move**: a ready replica of a Deployment whose every replica is ready (nothing else is starting), at
  most one per Deployment per pass, within every PodDisruptionBudget over the whole pass -- and, when the caller says
  which Deployments a valid policy scales (``managed``: the controller and the simulator pass the services the tick
  decided for, ``managed_services``), only theirs and those of Deployments whose pods carry
  ``gpuautoscaler.dev/rebalance=allowed``: a service whose GPUScalingPolicy is invalid this tick, or that has none
  and did not opt in, keeps its replicas where they are; a training gang only when
  its pods carry ``gpuautoscaler.dev/rebalance=allowed`` and its last checkpoint is recent (``checkpoint_max_age_s``:
  moving it throws that work away), and then the whole gang. Nothing on a NotReady node (nor on a node the caller
  says is leaving: ``leaving``, nor on one annotated not to be disrupted: ``NodeInfo.do_not_disrupt``), nothing not
  ready, no pod of any other owner (a bare pod is not recreated; a
  StatefulSet's identity and volumes are its own; a DaemonSet's or a static pod comes back on the same node). A
  service that is only recommended for (``recommend-only``) is not managed (``managed_services``).
- **What a move is for** (targets, in order): (1) *waiting work*: pending GPU pods (a gang counts whole: all its
  pods or nothing; not a DaemonSet's pod, which may only run on its own node) and the training this controller
  suspended, higher priority first, larger first, that do not fit in the free GPUs as they are but would after
  moving some movable pods off the nodes of their GPU type -- pods the destination nodes can hold without the target
  nodes. The GPUs of pods being deleted count as free here (a gang
  the tick preempted, in its grace period): a pod that only waits for them is not moved for. (2) *burst nodes*: a
  node of a burst pool under ``burst_empty_below`` of its GPUs in use whose pods all fit on the other nodes (the
  on-prem ones first) is emptied, so that the give-back removes an empty node instead of restarting its pods at once;
  its DaemonSet and static pods, and pods already being deleted, go with the node and need no move.
- **Worth it**: the gain of a target (GPUs made usable for the waiting pods; a burst node's GPUs) divided by the pods
  it moves must reach ``min_gain_per_move``.
- **Bounded**: at most ``max_moves_per_pass`` pods per pass and ``max_moves_per_hour`` over the last hour (the state
  keeps the times); a target whose moves do not fit in what is left is not started (half a defragmentation is only
  disruption).

The plan also reports the GPUs *stranded* by fragmentation: free GPUs on nodes where none of the waiting pods fits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from autoscaler.core.cluster import (
    SERVING_OWNER_KINDS,
    STATIC_POD_OWNER_KIND,
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodAntiAffinityTerm,
    PodInfo,
    WorkloadInfo,
    add_beside,
    anti_affinity_barred,
    checkpoint_times,
    fits_beside,
    free_gpus_per_node,
    moves_with,
    next_replica,
    pod_anti_affinity_barred,
    pod_schedulable_on,
    pods_with_own_anti_affinity,
    requests_by_node,
    selected_by,
    topology_domain,
    workload_pod,
)
from autoscaler.core.model import EvictPod, Plan, ScaleDecision
from autoscaler.core.reasons import Reason
from autoscaler.core.topology_spread import TopologySkew
from autoscaler.core.victims import pdbs_covering, unevictable_under_budgets

# "allowed" on a training gang's pods lets the rebalancer move it; on every pod of a Deployment no valid policy scales,
# lets it move that Deployment's replicas
REBALANCE_LABEL = "gpuautoscaler.dev/rebalance"
HOUR_S = 3600.0
_DEPLOYMENT = "deployment/"  # owner prefix of a Deployment's replicas: "deployment/<namespace>/<name>"
_BURST_TARGET = "burst node "  # a move's target when it empties a burst node: "burst node <node>"
# Controllers of pods that are part of their node: a DaemonSet's pod, and a static pod (the kubelet runs it from a
# file; its mirror pod's controller is the Node). Evicted, either comes back on the same node; on a node being
# emptied neither needs to move (it goes with the node).
_NODE_BOUND_KINDS = frozenset({"DaemonSet", STATIC_POD_OWNER_KIND})
_NOT_RESTARTED_ELSEWHERE = SERVING_OWNER_KINDS | _NODE_BOUND_KINDS


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """How much the rebalancer may disturb, and when a move is worth it. Times in seconds."""

    interval_s: float = 300.0  # seconds between passes
    max_moves_per_pass: int = 2  # pods moved in one pass at most
    max_moves_per_hour: int = 8  # pods moved over any hour at most
    min_gain_per_move: float = 2.0  # GPUs made usable per pod moved, at least
    checkpoint_max_age_s: float = 600.0  # a movable gang checkpointed at most this many seconds ago
    # seconds a target whose moves were made waits before it is moved for again: when the scheduler put the moved pods
    # back (or something else took the room), repeating the same moves every pass is only disruption
    retry_after_s: float = 1800.0
    # ... and each further attempt for a target still waiting doubles that wait, up to this many seconds (never below
    # retry_after_s): a scheduler that spreads (LeastAllocated) puts a moved replica back on the node just emptied
    # every time, and a fixed wait repeated the same futile moves every retry_after_s for as long as the target waited
    retry_after_max_s: float = 4 * HOUR_S
    # a Deployment's replica moves only when the latest tick recommended fewer replicas than the Deployment has: the
    # move takes one away for a cold start, and a service that needs every replica it runs has none to spare (off:
    # also then -- more GPUs gathered for training, at some latency; under a spreading scheduler much of it)
    spare_replicas_only: bool = True
    burst_pools: frozenset[str] = frozenset()  # node pools to empty (their nodes are paid by the hour)
    burst_empty_below: float = 0.5  # a burst node under this share of its GPUs in use is emptied
    # pools where training may not run (burst pools are tainted for inference); a waiting gang is not placed there
    training_excluded_pools: frozenset[str] = frozenset()
    # after this many targets moved for in a row whose room was refilled -- their target still waiting at a later pass
    # and fitting nowhere again: a spreading scorer (LeastAllocated) puts the moved replica, or the next new one,
    # back on the node just emptied --, no move is made for ``put_back_hold_s`` seconds: one probe pass per hold
    # then, until a target is placed (0: never held)
    put_back_checks: int = 3
    put_back_hold_s: float = 4 * HOUR_S
    # seconds a target moved for is watched while it still fits where the moves made room (the arbitration's resume
    # waits out its own quiet period first); fitting still then, the room was kept (not put back)
    put_back_watch_s: float = 900.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0 seconds")
        if self.max_moves_per_pass < 0 or self.max_moves_per_hour < 0:
            raise ValueError("move bounds must be >= 0")
        if self.min_gain_per_move < 0:
            raise ValueError("min_gain_per_move must be >= 0")
        if self.retry_after_s < 0:
            raise ValueError("retry_after_s must be >= 0 seconds")
        if self.retry_after_max_s < 0:
            raise ValueError("retry_after_max_s must be >= 0 seconds")
        for name in ("put_back_checks", "put_back_hold_s", "put_back_watch_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def retry_wait_s(self, attempts: int) -> float:
        """Seconds a target waits after its ``attempts``-th pass of moves (1 for the first) before it is moved for
        again: ``retry_after_s``, doubled with each further attempt, at most ``retry_after_max_s`` (never below
        ``retry_after_s``)."""
        if attempts <= 1 or self.retry_after_s <= 0:
            return self.retry_after_s
        # the exponent is bounded so that no count of attempts overflows a float
        return min(self.retry_after_s * 2.0 ** min(attempts - 1, 64), max(self.retry_after_s, self.retry_after_max_s))

    def attempts_remembered(self) -> int:
        """Passes of moves remembered per target: enough for the wait to reach ``retry_after_max_s``; older ones
        change nothing and are forgotten (the move ledger stays small while a gang waits for days)."""
        if self.retry_after_s <= 0:
            return 1  # no wait to grow
        attempts = 1
        while self.retry_wait_s(attempts) < max(self.retry_after_s, self.retry_after_max_s) and attempts < 64:
            attempts += 1
        return attempts


@dataclass(frozen=True, slots=True)
class RebalanceState:
    last_pass_at: float | None = None  # Unix seconds of the last pass
    move_times: tuple[float, ...] = ()  # Unix seconds of the moves of the last hour
    # (target, Unix seconds of a pass that moved for it): one per pass, for the targets still waiting (or gone from
    # the snapshot within their current wait), the latest RebalanceConfig.attempts_remembered() of each -- their count
    # sets how long the target waits (retry_wait_s)
    moved_for: tuple[tuple[str, float], ...] = ()
    # the targets of the moves made lately, (target, Unix seconds of the moves), watched until judged, and of the
    # latest ones judged, (Unix seconds judged, the room refilled: put back): at most
    # RebalanceConfig.put_back_checks. Kept in memory only: a new leader starts watching afresh
    watching: tuple[tuple[str, float], ...] = ()
    put_back: tuple[tuple[float, bool], ...] = ()


def put_back_hold(state: RebalanceState, now: float, config: RebalanceConfig) -> float:
    """Seconds moves are still held: the latest ``put_back_checks`` moves judged were all put back, the last of them
    less than ``put_back_hold_s`` ago (0: not held)."""
    checks = config.put_back_checks
    if checks <= 0 or len(state.put_back) < checks or not all(back for _, back in state.put_back[-checks:]):
        return 0.0
    # at most put_back_hold_s: a judgement after now (a wall clock stepped back) does not hold moves for longer
    return min(config.put_back_hold_s, max(0.0, state.put_back[-1][0] + config.put_back_hold_s - now))


@dataclass(frozen=True, slots=True)
class Move:
    """One unit moved: a replica, or a whole training gang."""

    pods: tuple[tuple[str, str], ...]  # (namespace, name)
    gpus_by_node: Mapping[str, int]  # where it is now
    destinations: Mapping[str, int]  # node -> GPUs, where the plan expects it to land
    owner: str  # "deployment/<ns>/<name>" or the gang id
    gang: str | None  # the gang id when a training gang moves (its pods go together or not at all)
    target: str  # what the move makes room for
    gain_gpus: int  # of the whole target
    detail: str


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    ran: bool  # False: not due this tick
    moves: tuple[Move, ...] = ()
    actions: tuple[EvictPod, ...] = ()
    stranded_gpus: int = 0  # free GPUs no waiting pod fits on, before the moves
    stranded_after: int = 0  # ... after them (as the plan expects them to land)
    notes: tuple[str, ...] = ()  # targets not pursued, and why


@dataclass(frozen=True, slots=True)
class _Unit:
    pods: tuple[PodInfo, ...]
    owner: str
    pdb_use: tuple[tuple[str, int, int], ...]
    gpu_type: str | None
    training: bool
    # computed once (``_unit``): the search asks it of every unit for every node it weighs
    gpus_by_node: Mapping[str, int]
    pod_gpus: tuple[int, ...]
    gpus: int


def _unit(
    pods: Sequence[PodInfo], owner: str, pdb_use: tuple[tuple[str, int, int], ...], gpu_type: str | None, training: bool
) -> _Unit:
    by_node: dict[str, int] = defaultdict(int)
    for p in pods:
        by_node[p.node or ""] += p.gpus
    pod_gpus = tuple(p.gpus for p in pods)
    return _Unit(tuple(pods), owner, pdb_use, gpu_type, training, dict(by_node), pod_gpus, sum(pod_gpus))


@dataclass(frozen=True, slots=True)
class _Target:
    name: str
    priority: int
    pod_gpus: tuple[int, ...]
    gpu_type: str | None
    training: bool  # may not use the training-excluded pools
    # the waiting pods themselves (a suspended workload's stand-ins, ``_template_pods``): their home must admit them
    # (nodeSelector, taints, pod anti-affinity)
    pods: tuple[PodInfo, ...] = ()
    suspended: str | None = None  # a workload this controller suspended: "<kind>/<namespace>/<name>"
    # a suspended workload's, from its pod template (it has no pods): the nodeSelector its home must meet, and the
    # (CPU millicores, memory bytes) each of its pods requests beside its GPUs
    node_selector: Mapping[str, str] = field(default_factory=dict)
    beside: tuple[int, int] = (0, 0)


class _Budgets:
    """``pdbs_covering`` of one pod without trying every PodDisruptionBudget of the cluster on every replica (with a
    budget per service that was minutes per pass on a large cluster): each budget is filed under its namespace and
    one ``matchLabels`` entry a pod must carry, and tried only on pods that carry it."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self._pdbs = snapshot.pdbs
        self._by_label: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        self._by_namespace: dict[str, list[int]] = defaultdict(list)  # no plain matchLabels entry: tried on every pod
        for i, pdb in enumerate(snapshot.pdbs):
            if not pdb.selector:
                continue  # selects no pod
            entry = next(((k, v) for k, v in pdb.selector.items() if isinstance(v, str)), None)
            if entry is None:
                self._by_namespace[pdb.namespace].append(i)
            else:
                self._by_label[(pdb.namespace, *entry)].append(i)

    def covering(self, pod: PodInfo) -> tuple[tuple[str, int, int], ...]:
        """(budget "namespace/name", 1, its disruptions allowed) for each budget that selects ``pod``, in the
        snapshot's order (as ``pdbs_covering`` answers for the pod alone)."""
        found = set(self._by_namespace.get(pod.namespace, ()))
        for key, value in pod.labels.items():
            found.update(self._by_label.get((pod.namespace, key, value), ()))
        out = []
        for i in sorted(found):
            pdb = self._pdbs[i]
            if pdb.selects(pod):
                out.append((f"{pdb.namespace}/{pdb.name}", 1, pdb.disruptions_allowed))
        return tuple(out)


def _pod_key(pod: PodInfo) -> tuple[str, str]:
    return pod.namespace, pod.name


def _movable_units(snapshot: ClusterSnapshot, now: float, config: RebalanceConfig) -> tuple[list[_Unit], list[str]]:
    ready_nodes = {n.name for n in snapshot.nodes if n.ready}
    # annotated not to be disrupted by an autoscaler (a person investigating it, a node kept on purpose): as the
    # Cluster Autoscaler and Karpenter, the rebalancer evicts no pod off it (it may still take pods moved onto it)
    kept = {n.name for n in snapshot.nodes if n.do_not_disrupt}
    budgets_of = _Budgets(snapshot)
    deployments = {(d.namespace, d.name): d for d in snapshot.deployments}
    types = {(w.gang): w.gpu_product for w in snapshot.workloads}
    units: list[_Unit] = []
    notes: list[str] = []
    replicas: dict[tuple[str, str], list[PodInfo]] = defaultdict(list)
    gangs: dict[str, list[PodInfo]] = defaultdict(list)
    for pod in snapshot.pods:
        if pod.gpus <= 0 or pod.phase in ("Succeeded", "Failed"):
            continue
        if pod.owner_kind == "Deployment" and pod.owner_name:
            replicas[(pod.namespace, pod.owner_name)].append(pod)
        elif pod.gang:
            gangs[pod.gang].append(pod)
    for key, pods in sorted(replicas.items()):
        dep = deployments.get(key)
        # a pod being deleted is no serving replica whatever its Ready condition says (the Kubernetes reader reads it
        # not ready; a snapshot from elsewhere may not)
        if dep is None or dep.ready_replicas < dep.spec_replicas or any(not p.ready or p.terminating for p in pods):
            continue  # a replica is starting or leaving: moving another takes the service below what it asked for
        if len(pods) < 2 or dep.spec_replicas < 2 or len(pods) > dep.spec_replicas:
            # its only replica: a move is an outage however short. Also a Deployment scaled down (spec 1, two pods
            # while the ReplicaSet deletes one): the one moved may be the one it keeps
            continue
        for pod in sorted(pods, key=lambda p: p.name):
            if pod.do_not_disrupt:
                continue  # its owner said no autoscaler evicts it (safe-to-evict "false", do-not-disrupt "true")
            if pod.node in ready_nodes and pod.node not in kept and pod.ready:
                gpu_type = pod.gpu_product or dep.gpu_product
                owner = f"deployment/{key[0]}/{key[1]}"
                budgets = budgets_of.covering(pod)
                if len(budgets) > 1:
                    continue  # unevictable_under_budgets, on the budgets at hand: the Eviction API refuses the pod
                units.append(_unit((pod,), owner, budgets, gpu_type, False))
    for gang, listed in sorted(gangs.items()):
        # one order whatever the snapshot's listing: the evictions go out in it, and a budget that refuses one
        # halfway leaves the same pods evicted whichever replica of the controller planned the move
        pods = sorted(listed, key=_pod_key)
        if not all(p.labels.get(REBALANCE_LABEL) == "allowed" for p in pods):
            continue
        odd = next((p for p in pods if p.owner_kind is None or p.owner_kind in _NOT_RESTARTED_ELSEWHERE), None)
        if odd is not None:
            # Only a training controller (a Job, a JobSet, a PyTorchJob...) starts an evicted pod again elsewhere:
            # a bare pod is not recreated, a StatefulSet's pod keeps its identity and volumes, a DaemonSet's comes
            # back on the same node, and so does a static pod (its mirror pod's controller is the Node).
            notes.append(
                f"gang {gang}: allowed to move but {odd.namespace}/{odd.name} is "
                f"{'a bare pod' if odd.owner_kind is None else f'owned by a {odd.owner_kind}'}: not moved"
            )
            continue
        guarded = next((p for p in pods if p.do_not_disrupt), None)
        if guarded is not None:
            notes.append(f"gang {gang}: {guarded.namespace}/{guarded.name} is annotated not to be disrupted: not moved")
            continue
        on_kept = next((p for p in pods if p.node in kept), None)
        if on_kept is not None:
            notes.append(
                f"gang {gang}: {on_kept.namespace}/{on_kept.name} runs on node {on_kept.node}, annotated not to be "
                "disrupted: not moved"
            )
            continue
        unevictable = unevictable_under_budgets(snapshot, pods)
        if unevictable is not None:
            notes.append(f"gang {gang}: {unevictable}")
            continue
        if not all(p.node in ready_nodes and p.ready and not p.terminating for p in pods):
            continue
        checkpoints = checkpoint_times(pods, now)
        if not checkpoints or now - max(checkpoints) > config.checkpoint_max_age_s:
            notes.append(
                f"gang {gang}: allowed to move but not checkpointed in the last {config.checkpoint_max_age_s:g}s"
            )
            continue
        gpu_type = next((p.gpu_product for p in pods if p.gpu_product), None) or types.get(gang)
        units.append(_unit(tuple(pods), gang, pdbs_covering(snapshot, pods), gpu_type, True))
    return units, notes


def _targets(snapshot: ClusterSnapshot) -> list[_Target]:
    deployments = {(d.namespace, d.name): d for d in snapshot.deployments}
    types = {w.gang: w.gpu_product for w in snapshot.workloads}
    gangs: dict[str, list[PodInfo]] = defaultdict(list)
    targets = []
    for pod in snapshot.pods:
        if pod.node is not None or pod.gpus <= 0 or pod.phase != "Pending":
            continue
        if pod.owner_kind in _NODE_BOUND_KINDS:
            continue  # a DaemonSet's pod runs on the node it was made for: room made elsewhere is of no use to it
        if pod.owner_kind == "Deployment" and pod.owner_name:
            dep = deployments.get((pod.namespace, pod.owner_name))
            gpu_type = pod.gpu_product or (dep.gpu_product if dep is not None else None)
            targets.append(
                _Target(f"pod {pod.namespace}/{pod.name}", pod.priority, (pod.gpus,), gpu_type, False, (pod,))
            )
        elif pod.gang:
            gangs[pod.gang].append(pod)
        else:
            # a serving replica (a StatefulSet's, a ReplicaSet's) goes where a Deployment's may: only the pods of a
            # training controller, or bare pods, are kept off the pools training may not use
            training = pod.owner_kind not in SERVING_OWNER_KINDS
            targets.append(
                _Target(f"pod {pod.namespace}/{pod.name}", pod.priority, (pod.gpus,), pod.gpu_product, training, (pod,))
            )
    for gang, listed in gangs.items():
        pods = sorted(listed, key=_pod_key)
        gpus = tuple(p.gpus for p in pods)
        gpu_type = next((p.gpu_product for p in pods if p.gpu_product), None) or types.get(gang)
        # a group of serving replicas (a StatefulSet's pods that Kueue admits as one workload) is no training either
        training = not all(p.owner_kind in SERVING_OWNER_KINDS for p in pods)
        targets.append(_Target(f"gang {gang}", min(p.priority for p in pods), gpus, gpu_type, training, tuple(pods)))
    for w in snapshot.workloads:
        if w.suspended and w.suspended_by_us_at is not None and w.pod_gpus:
            targets.append(
                _Target(
                    f"{w.kind} {w.namespace}/{w.name} (suspended)",
                    w.priority,
                    w.pod_gpus,
                    w.gpu_product,
                    True,
                    _template_pods(w),
                    suspended=f"{w.kind}/{w.namespace}/{w.name}",
                    node_selector=w.node_selector,
                    beside=w.pod_beside,
                )
            )
    targets.sort(key=lambda t: (-t.priority, -sum(t.pod_gpus), t.name))
    return targets


def _template_pods(workload: WorkloadInfo) -> tuple[PodInfo, ...]:
    """A suspended workload's pods, not made yet, as stand-ins (``workload_pod``: one per pod, its GPUs, the CPU and
    memory it requests, a name of its own: its workload's kind and name, as ``workload_pod``'s -- a Job and a
    PyTorchJob of one name are two workloads) when their labels or required anti-affinity were read -- what keeps them
    off a node, or apart; none otherwise (its template's nodeSelector and requests say the rest)."""
    if not workload.pod_labels and not workload.pod_anti_affinity:
        return ()
    cpu, memory = workload.pod_beside
    stand_in = workload_pod(workload)
    return tuple(
        replace(stand_in, name=f"{stand_in.name}, pod {i}", gpus=gpus, cpu_milli=cpu, memory_bytes=memory)
        for i, gpus in enumerate(workload.pod_gpus)
    )


class _Cluster:
    """The plan's working copy of free GPUs per ready node, with what each node may host."""

    def __init__(self, snapshot: ClusterSnapshot, config: RebalanceConfig) -> None:
        free = free_gpus_per_node(snapshot)
        self.nodes = {n.name: n for n in snapshot.nodes if n.ready}
        self.free = {name: free[name] for name in self.nodes}
        # ... once the pods being deleted there have gone (a gang the tick preempted, in its grace period; a replica
        # scaled down): what the pass plans with, so that a pod that only waits for them is not moved for
        staying: dict[str, int] = defaultdict(int)
        for pod in snapshot.pods:
            if pod.node in self.nodes and not pod.terminating and pod.phase not in ("Succeeded", "Failed"):
                staying[pod.node] += pod.gpus
        self.soon = {name: max(0, n.allocatable_gpus - staying[name]) for name, n in self.nodes.items()}
        # CPU and memory free beside the GPUs (``NodeInfo.free_beside_gpus``, where the node says), the requests of
        # the GPU pods being deleted given back as their GPUs are: a moved pod lands, and a waiting pod starts, only
        # where its CPU and memory fit too
        self.soon_beside = {n.name: n.free_beside_gpus for n in self.nodes.values() if n.free_beside_gpus is not None}
        leaving = (
            p for p in snapshot.pods
            if p.node in self.nodes and p.terminating and p.phase not in ("Succeeded", "Failed")
        )  # fmt: skip
        for node, amount in requests_by_node(leaving).items():
            add_beside(self.soon_beside, node, amount)
        self.config = config
        # "namespace/deployment" -> the nodes its required pod anti-affinity keeps its replicas off (a pod it selects
        # runs in their domain: the moved replica itself too, which keeps a zone-spread replica in no other node of
        # its own zone -- fewer moves, never one the scheduler refuses), and those Deployments
        self.kept_off: dict[str, set[str]] = {}
        self.with_anti_affinity = [d for d in snapshot.deployments if d.anti_affinity]
        # whether any required pod anti-affinity term exists in the cluster (none: no pod is ever kept off)
        self._terms_anywhere = bool(
            self.with_anti_affinity
            or pods_with_own_anti_affinity(snapshot.pods)
            or any(w.pod_anti_affinity for w in snapshot.workloads if w.suspended)
        )
        # every Deployment: its own terms, or another's or a pod's selecting its replicas (the symmetric check)
        self.deployments = snapshot.deployments if self._terms_anywhere else ()
        for deployment in self.deployments:
            kept = anti_affinity_barred(deployment, snapshot)
            if kept:
                self.kept_off[f"{deployment.namespace}/{deployment.name}"] = set(kept)
        # a pod of no Deployment (a training pod, a waiting one): the nodes its own required anti-affinity, or a
        # running pod's keeping it away, keeps it off (``pod_anti_affinity_barred``), by (namespace, name) when first
        # asked
        self._snapshot = snapshot
        self._pods_kept_off: dict[tuple[str, str], frozenset[str]] = {}
        # (namespace, Deployment) -> its template's terms, for its pods read without their own
        self._template_terms = {(d.namespace, d.name): d.anti_affinity for d in self.with_anti_affinity}
        # the pods expected to land this pass, each on every node of its group's: a pod of no Deployment is kept
        # off their domains where its terms select them, or theirs it
        self._landed: list[tuple[tuple[PodInfo, ...], tuple[NodeInfo, ...]]] = []
        # "namespace/deployment" -> its hard topology spread (``core.topology_spread``): a moved replica lands only
        # where the skew allows once it has left its node; the rule with that node's pod taken off, by (key, node)
        self.skews: dict[str, TopologySkew] = {}
        for deployment in snapshot.deployments:
            skew = TopologySkew.of(deployment, snapshot)
            if skew is not None:
                self.skews[f"{deployment.namespace}/{deployment.name}"] = skew
        self._leaving: dict[tuple[str, str], TopologySkew] = {}

    def _skew_for(self, pod: PodInfo) -> TopologySkew | None:
        """The topology spread a replica's new home must meet: without the replica itself where it runs now."""
        key = f"{pod.namespace}/{pod.owner_name}"
        skew = self.skews.get(key) if pod.owner_kind == "Deployment" else None
        if skew is None or pod.node is None:
            return skew
        leaving = self._leaving.get((key, pod.node))
        if leaving is None:
            leaving = self._leaving[(key, pod.node)] = skew.copy()
            leaving.remove(pod.node)
        return leaving

    def moved(self, pod: PodInfo, nodes: Iterable[str]) -> None:
        """A replica of a Deployment with a hard topology spread is planned off its node (a waiting one: from no
        node) onto ``nodes``: the counts follow it."""
        skew = self.skews.get(f"{pod.namespace}/{pod.owner_name}") if pod.owner_kind == "Deployment" else None
        if skew is None:
            return
        if pod.node is not None:
            skew.remove(pod.node)
        for node in nodes:
            skew.add(node)
        self._leaving.clear()

    def lands(self, pods: Sequence[PodInfo], nodes: Iterable[str]) -> None:
        """``pods`` are expected on ``nodes`` (a waiting target fits there, or the moves make room there; a moved pod
        lands there): a Deployment whose required pod anti-affinity selects one of them is kept off those nodes'
        domains for the rest of the pass -- a sibling waiting after a replica of a spread Deployment, a replica
        moved after a pod it keeps away from (which pod lands on which node is not told: each on every one of them,
        fewer moves, never one the scheduler refuses). Its topology spread counts a replica there (``moved``: off the
        node a moved one leaves)."""
        nodes = list(nodes)
        for pod in pods:
            self.moved(pod, nodes)
        landing = [self.nodes[n] for n in nodes if n in self.nodes]
        if not landing or not pods:
            return
        if self._terms_anywhere or any(p.anti_affinity for p in pods):
            self._terms_anywhere = True
            self._landed.append((tuple(pods), tuple(landing)))
        for deployment in self.with_anti_affinity:
            for term in deployment.anti_affinity:
                if any(term.selects(pod) for pod in pods):
                    self._keep_off(deployment, term, landing)
        # the symmetric check: a landing pod's own terms keep off the replicas they select where they were read,
        # whoever owns it (the spec it is scheduled with -- a waiting pod's, a moved one's replacement from the same
        # ReplicaSet: as ``anti_affinity_barred`` judges the running pods); a Deployment's pod read without them
        # (None), its template's (``_terms_of``)
        for terms in filter(None, map(self._terms_of, pods)):
            for deployment in self.deployments:
                replica = next_replica(deployment)
                for term in terms:
                    if term.selects(replica):
                        self._keep_off(deployment, term, landing)

    def _keep_off(self, deployment: DeploymentInfo, term: PodAntiAffinityTerm, landing: Sequence[NodeInfo]) -> None:
        """Keep the Deployment's replicas off the domains of ``term`` that the ``landing`` nodes are in."""
        taken = {topology_domain(n, term.topology_key) for n in landing} - {None}
        kept = self.kept_off.setdefault(f"{deployment.namespace}/{deployment.name}", set())
        kept.update(name for name, n in self.nodes.items() if topology_domain(n, term.topology_key) in taken)

    def allowed(
        self,
        node: str,
        gpu_type: str | None,
        training: bool,
        pods: Sequence[PodInfo] = (),
        node_selector: Mapping[str, str] | None = None,
        suspended: bool = False,
    ) -> bool:
        """Whether ``pods`` (of that GPU type; training or not) may run on ``node``: its GPU type, its pool, and
        what each pod's own nodeSelector and tolerations admit (a node tainted for maintenance is no destination
        for a pod that does not tolerate it: the pod's replacement would land elsewhere, or wait), or, for pods not
        made yet (a suspended workload's), its template's ``node_selector``. A workload this controller suspended
        (``suspended``) never goes to a burst pool, whatever ``training_excluded_pools`` says: the capacity
        arbitration resumes it only onto the cluster's own nodes, so room gathered on a burst node never resumes it."""
        info = self.nodes[node]
        if gpu_type is not None and info.gpu_product != gpu_type:
            return False
        if training and info.pool in self.config.training_excluded_pools:
            return False
        if suspended and info.pool in self.config.burst_pools:
            return False
        if node_selector and not selected_by(info, node_selector):
            return False
        if self.kept_off and any(
            pod.owner_kind == "Deployment" and node in self.kept_off.get(f"{pod.namespace}/{pod.owner_name}", ())
            for pod in pods
        ):
            return False
        if self.skews and any((skew := self._skew_for(pod)) is not None and not skew.allows(node) for pod in pods):
            return False
        if self._terms_anywhere and any(self._pod_kept_off(pod, info) for pod in pods):
            return False
        return all(pod_schedulable_on(pod, info) for pod in pods)

    def _pod_kept_off(self, pod: PodInfo, node: NodeInfo) -> bool:
        """Whether pod anti-affinity keeps ``pod`` -- of no Deployment: a Deployment's replicas are judged by
        ``kept_off`` -- off ``node``: its own required terms or a running pod's (``pod_anti_affinity_barred``), or
        those of a pod expected to land this pass (its own terms, or its Deployment's template's where not read)."""
        if pod.owner_kind == "Deployment":
            return False
        key = (pod.namespace, pod.name)
        barred = self._pods_kept_off.get(key)
        if barred is None:
            barred = self._pods_kept_off[key] = pod_anti_affinity_barred(pod, self._snapshot)
        if node.name in barred:
            return True
        for landed, landing in self._landed:
            for other in landed:
                if moves_with(pod, other):
                    continue
                terms = self._terms_between(pod, other)
                if any(_same_domain(node, n, t.topology_key) for t in terms for n in landing):
                    return True
        return False

    def _terms_of(self, pod: PodInfo) -> tuple[PodAntiAffinityTerm, ...]:
        """A pod's required anti-affinity: its own where read, else its Deployment's template's."""
        if pod.anti_affinity is not None:
            return pod.anti_affinity
        if pod.owner_kind == "Deployment":
            return self._template_terms.get((pod.namespace, pod.owner_name or ""), ())
        return ()

    def _terms_between(self, pod: PodInfo, other: PodInfo) -> list[PodAntiAffinityTerm]:
        """The required anti-affinity terms that keep two pods out of one domain: each one's selecting the other."""
        return [t for t in self._terms_of(pod) if t.selects(other)] + [
            t for t in self._terms_of(other) if t.selects(pod)
        ]

    def place(
        self,
        free: dict[str, int],
        pod_gpus: Sequence[int],
        gpu_type: str | None,
        training: bool,
        exclude: frozenset[str] = frozenset(),
        pods: Sequence[PodInfo] = (),
        beside: dict[str, tuple[int, int]] | None = None,
        node_selector: Mapping[str, str] | None = None,
        pod_beside: tuple[int, int] = (0, 0),
        suspended: bool = False,
    ) -> dict[str, int] | None:
        """Best fit, largest pod first: node -> GPUs taken, consuming ``free`` (and the CPU and memory ``beside``
        them, where known, by what each of ``pods`` requests); None (and both untouched) when one pod does not fit.
        The burst nodes are the last resort: a move onto one keeps it alive."""
        taken: dict[str, int] = defaultdict(int)
        trial = dict(free)
        trial_beside = dict(beside) if beside is not None else None
        needs = _needs(pod_gpus, pods, pod_beside)
        # the group's pods whose required anti-affinity selects a sibling (workers kept one per node): each placed
        # pod keeps such siblings off its domain
        apart = _may_keep_apart(pods, pod_gpus)
        placed: list[tuple[int, str]] = []
        for i in sorted(range(len(pod_gpus)), key=lambda k: -pod_gpus[k]):
            gpus, need = pod_gpus[i], needs[i]
            fits = [
                (self.nodes[n].pool in self.config.burst_pools, left, n)
                for n, left in trial.items()
                if left >= gpus
                and n not in exclude
                and self.allowed(n, gpu_type, training, pods, node_selector, suspended)
                and fits_beside(trial_beside, n, need)
                and not (apart and self.siblings_keep_off(pods, i, n, placed))
            ]
            if not fits:
                return None
            _, _, node = min(fits)
            trial[node] -= gpus
            taken[node] += gpus
            add_beside(trial_beside, node, need, -1)
            placed.append((i, node))
        free.update(trial)
        if beside is not None and trial_beside is not None:
            beside.update(trial_beside)
        return dict(taken)

    def siblings_keep_off(self, pods: Sequence[PodInfo], i: int, node: str, placed: Sequence[tuple[int, str]]) -> bool:
        """Whether a sibling already placed (``placed``: index, node) and pod ``i`` of the group select each other
        by a required anti-affinity term whose domain holds both ``node`` and the sibling's node."""
        here = self.nodes[node]
        return any(
            _same_domain(here, self.nodes[there], t.topology_key)
            for j, there in placed
            for t in self._terms_between(pods[i], pods[j])
        )

    def allows(self, node: str, target: _Target) -> bool:
        """``allowed`` for the waiting ``target``: its GPU type, pool, pods (or template's nodeSelector), and never a
        burst pool for a workload this controller suspended."""
        return self.allowed(
            node, target.gpu_type, target.training, target.pods, target.node_selector, target.suspended is not None
        )

    def place_target(
        self, free: dict[str, int], target: _Target, beside: dict[str, tuple[int, int]] | None
    ) -> dict[str, int] | None:
        """``place`` of the waiting ``target``'s pods, where ``allows`` lets them, with the CPU and memory they
        request."""
        return self.place(
            free, target.pod_gpus, target.gpu_type, target.training, pods=target.pods, beside=beside,
            node_selector=target.node_selector, pod_beside=target.beside, suspended=target.suspended is not None,
        )  # fmt: skip


def _may_keep_apart(pods: Sequence[PodInfo], pod_gpus: Sequence[int]) -> bool:
    """Whether a group's pods (one per entry of ``pod_gpus``) have required anti-affinity terms that may keep them
    apart: the siblings are then checked pair by pair (``_Cluster.siblings_keep_off``)."""
    return len(pods) == len(pod_gpus) and any(p.anti_affinity for p in pods)


def _same_domain(a: NodeInfo, b: NodeInfo, key: str) -> bool:
    """Whether two nodes are in one topology domain of ``key`` (a node without the label is in none)."""
    domain = topology_domain(a, key)
    return domain is not None and domain == topology_domain(b, key)


def _needs(pod_gpus: Sequence[int], pods: Sequence[PodInfo], each: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
    """(CPU millicores, memory bytes) of each pod of ``pod_gpus`` (``pods`` in the same order; without them,
    ``each``: a suspended workload's template's, else 0)."""
    if len(pods) != len(pod_gpus):
        return [each] * len(pod_gpus)
    return [(p.cpu_milli, p.memory_bytes) for p in pods]


def stranded_gpus(snapshot: ClusterSnapshot, config: RebalanceConfig | None = None) -> int:
    """Free GPUs on ready nodes where none of the waiting pods (pending, or suspended by this controller) fits
    although some may run there by GPU type and pool: free but unusable for the shapes that wait. 0 when nothing
    waits."""
    return _stranded(_Cluster(snapshot, config or RebalanceConfig()), _targets(snapshot))


def _stranded(cluster: _Cluster, targets: Sequence[_Target], free: Mapping[str, int] | None = None) -> int:
    free = cluster.free if free is None else free
    if not targets:
        return 0
    stranded = 0
    for node, left in free.items():
        if left <= 0:
            continue
        # GPUs of a type (or pool) no waiting pod may use are idle, not fragmented: they do not count
        allowed = [t for t in targets if cluster.allows(node, t)]
        if allowed and not any(g <= left for t in allowed for g in t.pod_gpus):
            stranded += left
    return stranded


def plan_rebalance(
    snapshot: ClusterSnapshot,
    now: float,
    config: RebalanceConfig,
    state: RebalanceState,
    *,
    protected: frozenset[str] = frozenset(),
    managed: Collection[str] | None = None,
    leaving: Collection[str] = (),
    resumable: Collection[str] | None = None,
) -> tuple[RebalancePlan, RebalanceState]:
    """The moves of this pass (none when a pass is not due), and the state for the next.

    ``protected``: owners (``deployment/<namespace>/<name>``, gang ids) not to move in this pass -- the controller
    protects a service whose metrics are stale, that is scaling up or whose SLO guard fired: a move takes one of its
    replicas away for a cold start.

    ``managed``: the service keys (``namespace/name``) of the Deployments a valid policy scales this tick
    (``managed_services``); only their replicas may move (a move is an eviction: a service whose policy is invalid,
    or that has none, is left alone). None: every Deployment's replicas may move (a caller that vetted the snapshot's
    Deployments itself, as the placement benchmarks do).

    ``leaving``: nodes on their way out that the snapshot may still show ready -- the controller passes the burst
    nodes its latest tick gave back (their Machine is being deleted; the node is cordoned only when its drain
    starts): no move lands there or makes room there, and their pods are left to the node's drain.

    ``resumable``: the workloads this controller suspended (``<kind>/<namespace>/<name>``) that the latest tick's
    capacity arbitration would resume once their GPUs are gathered (``CapacityReport.resumable_once_gathered``); the
    others are not moved for -- the arbitration keeps them suspended while inference is short or the free GPUs are
    reserved for coming replicas, and a replica moved for one only restarts. None: every one is moved for (a caller
    without the arbitration)."""
    if state.last_pass_at is not None and now - state.last_pass_at < config.interval_s:
        return RebalancePlan(ran=False), state
    if leaving:
        going = frozenset(leaving)
        nodes = tuple(replace(n, ready=False, leaving=True) if n.name in going else n for n in snapshot.nodes)
        snapshot = replace(snapshot, nodes=nodes)
    recent = tuple(t for t in state.move_times if now - t < HOUR_S)
    budget = min(config.max_moves_per_pass, config.max_moves_per_hour - len(recent))
    cluster = _Cluster(snapshot, config)
    targets = _targets(snapshot)
    stranded_before = _stranded(cluster, targets)
    units, notes = _movable_units(snapshot, now, config)
    state = _judge_moves(state, cluster, targets, now, config)
    held = put_back_hold(state, now, config)
    if held > 0:
        notes.append(
            f"moves held for {held:.0f}s more: the last {config.put_back_checks} moved pods were put back by the "
            "scheduler on the node they left (a spreading scorer fills the room a move makes with the moved pod; "
            "the scheduler extender or a bin-packing scorer makes moves land)"
        )
        budget = 0
    units = [u for u in units if u.owner not in protected]
    if managed is not None:
        allowed = frozenset(f"{_DEPLOYMENT}{key}" for key in managed)
        # a Deployment no valid policy scales moves only when its owner opted it in, on every pod (every replica,
        # not only the one a unit moves: a replica labelled by hand does not opt its Deployment in)
        opted = _opted_in_deployments(snapshot)
        units = [u for u in units if u.training or u.owner in allowed or u.owner in opted]
    free = dict(cluster.soon)
    beside = dict(cluster.soon_beside)  # CPU and memory beside ``free``, where the nodes say
    pdb_used: dict[str, int] = defaultdict(int)
    moved_owners: set[str] = set()
    served: set[str] = set()  # targets the moves make room for (they hold their GPUs in ``free`` from then on)
    moves: list[Move] = []

    def usable(unit: _Unit) -> bool:
        if unit.owner in moved_owners:
            return False
        return all(pdb_used[key] + covered <= allowed for key, covered, allowed in unit.pdb_use)

    landed: set[str] = set()  # nodes the pass's moves are expected to land on: not a burst node to empty

    def commit(chosen: Sequence[tuple[_Unit, dict[str, int]]], target: str, gain: int, why: str) -> None:
        for unit, dest in chosen:
            moved_owners.add(unit.owner)  # one replica of a Deployment a pass: never two siblings in one domain
            cluster.lands(unit.pods, dest)
            landed.update(dest)
            for key, covered, _ in unit.pdb_use:
                pdb_used[key] += covered
            where = ", ".join(f"{n} ({g})" for n, g in sorted(dest.items()))
            moves.append(
                Move(
                    tuple((p.namespace, p.name) for p in unit.pods),
                    dict(unit.gpus_by_node),
                    dest,
                    unit.owner,
                    unit.owner if unit.training else None,
                    target,
                    gain,
                    f"{why}; expected to land on {where}",
                )
            )

    attempts = _attempts_by_target(state.moved_for, config.attempts_remembered())
    for target in targets:
        trial = dict(free)
        trial_beside = dict(beside)
        placed = cluster.place_target(trial, target, trial_beside)
        if placed is not None:
            # It fits as things are: the scheduler's (or the arbitration's) job, no move needed. It takes that room
            # first (targets come highest priority first): a lower target's moves must not count on it, nor may a
            # burst node it will land on be emptied -- also when it was moved for lately (the room may be the one
            # those moves made, the scheduler not having bound it yet).
            free, beside = trial, trial_beside
            landed.update(placed)
            cluster.lands(target.pods, placed)
            continue
        if target.suspended is not None and resumable is not None and target.suspended not in resumable:
            notes.append(
                f"{target.name}: not moved for: the capacity arbitration keeps it suspended (inference short, or the "
                "free GPUs reserved for coming replicas), gathered GPUs would not resume it"
            )
            continue
        tried = attempts.get(target.name, ())
        if tried and now - tried[-1] < config.retry_wait_s(len(tried)):
            ago = now - tried[-1]
            notes.append(
                f"{target.name}: moved for {ago:.0f}s ago ({len(tried)} pass(es) of moves) and still waiting; not "
                f"moved for again before {config.retry_wait_s(len(tried)):g}s (the moved pods may have been put "
                "back; the wait doubles with each pass)"
            )
            continue
        if budget - _pods_moved(moves) <= 0:
            notes.append(
                f"{target.name}: move budget used up ({config.max_moves_per_pass}/pass, "
                f"{config.max_moves_per_hour}/hour)"
            )
            break
        candidates = [u for u in units if usable(u)]
        found = _make_room(cluster, free, beside, target, candidates, budget - _pods_moved(moves), pdb_used)
        if found is None:
            notes.append(
                f"{target.name}: {sum(target.pod_gpus)} GPU(s) do not fit, and no bounded set of movable "
                "pods makes room"
            )
            continue
        chosen, after, after_beside, homes = found
        if not chosen:
            # it fits once placed pod by pod: nothing to move, but the room found is its own, as when it fits
            free, beside = after, after_beside
            landed.update(homes)
            cluster.lands(target.pods, homes)
            continue
        gain = sum(target.pod_gpus)
        ratio = gain / sum(len(u.pods) for u, _ in chosen)
        if ratio < config.min_gain_per_move:
            notes.append(
                f"{target.name}: room for {gain} GPU(s) costs {len(chosen)} move(s), "
                f"{ratio:.2f} GPU(s) per move < {config.min_gain_per_move:g}"
            )
            continue
        free, beside = after, after_beside
        served.add(target.name)
        landed.update(homes)  # the target's pods land there: a burst node among them is kept, not emptied
        cluster.lands(target.pods, homes)
        commit(
            chosen,
            target.name,
            gain,
            f"makes room for {target.name} ({gain} GPU(s) that fit nowhere now), {ratio:.1f} GPU(s) per move",
        )
    moves_left = budget - _pods_moved(moves)  # the bounds count pods evicted, a gang's every pod
    for node in sorted(
        (n for n in cluster.nodes.values() if n.pool in config.burst_pools),
        key=lambda n: (n.allocatable_gpus - free.get(n.name, 0), n.name),
    ):
        used = node.allocatable_gpus - free.get(node.name, 0)
        if used <= 0 or used >= config.burst_empty_below * node.allocatable_gpus:
            continue
        if node.name in landed:
            notes.append(f"burst node {node.name}: this pass's moves or a waiting pod land on it, not emptied")
            continue
        if node.do_not_disrupt:
            # never given back (the arbitration keeps it): emptying it would evict its pods for nothing
            notes.append(f"burst node {node.name}: annotated not to be removed by an autoscaler, not emptied")
            continue
        keeper = next(
            (
                p
                for p in snapshot.pods
                if p.node == node.name and p.do_not_disrupt and not p.terminating
                and p.phase not in ("Succeeded", "Failed")
            ),
            None,
        )  # fmt: skip
        if keeper is not None:
            # not given back while it runs (the arbitration's give-back refuses such a node): moving the others off
            # would evict them for nothing
            notes.append(
                f"burst node {node.name}: {keeper.namespace}/{keeper.name} is annotated not to be disrupted and may "
                "not move: not emptied"
            )
            continue
        on_node = [u for u in units if node.name in u.gpus_by_node]
        # what must leave for the node to be empty: not a DaemonSet's or a static pod (part of the node, they go
        # with it), nor a pod already being deleted
        here = {
            (p.namespace, p.name)
            for p in snapshot.pods
            if p.node == node.name
            and p.gpus > 0
            and p.phase not in ("Succeeded", "Failed")
            and not p.terminating
            and p.owner_kind not in _NODE_BOUND_KINDS
        }
        if not here:
            continue  # nothing to move: as empty as the rebalancer can make it
        # Every pod on it must move (a set, not a count: a gang's pods elsewhere would stand in for one that
        # may not move, and the node would not be emptied after all)
        movable_here = {(p.namespace, p.name) for u in on_node for p in u.pods if p.node == node.name}
        together = all(usable(u) for u in on_node) and _admissible(on_node, pdb_used)
        if not here <= movable_here or not together:
            notes.append(f"burst node {node.name}: {used} GPU(s) in use by pods that may not move now")
            continue
        needed = sum(len(u.pods) for u in on_node)
        if needed > moves_left:
            notes.append(f"burst node {node.name}: {needed} move(s) needed, {moves_left} left in the budget")
            continue
        gain = node.allocatable_gpus
        ratio = gain / max(1, sum(len(u.pods) for u in on_node))
        if ratio < config.min_gain_per_move:
            notes.append(f"burst node {node.name}: {ratio:.2f} GPU(s) per move < {config.min_gain_per_move:g}")
            continue
        # Emptier burst nodes are being emptied too: only the on-prem nodes, fuller burst nodes and kept ones (never
        # emptied nor given back) receive.
        emptier = frozenset(
            n.name
            for n in cluster.nodes.values()
            if n.pool in config.burst_pools
            and not n.do_not_disrupt
            and n.allocatable_gpus - free.get(n.name, 0) <= used
        )
        trial = dict(free)
        trial_beside = dict(beside)
        drain: list[tuple[_Unit, dict[str, int]]] = []
        for unit in on_node:
            for n, g in unit.gpus_by_node.items():
                trial[n] = trial.get(n, 0) + g
            for pod in unit.pods:
                add_beside(trial_beside, pod.node or "", (pod.cpu_milli, pod.memory_bytes))
            dest = cluster.place(
                trial, unit.pod_gpus, unit.gpu_type, unit.training, exclude=emptier, pods=unit.pods,
                beside=trial_beside,
            )  # fmt: skip
            if dest is None:
                break
            drain.append((unit, dest))
        if len(drain) < len(on_node):
            notes.append(f"burst node {node.name}: its {used} GPU(s) in use do not fit on the other nodes")
            continue
        free, beside = trial, trial_beside
        moves_left -= needed
        commit(
            drain,
            f"{_BURST_TARGET}{node.name}",
            gain,
            f"empties burst node {node.name} ({used} of {node.allocatable_gpus} GPUs in use) for its give-back",
        )
    uids = {(p.namespace, p.name): p.uid for u in units if u.owner in moved_owners for p in u.pods}
    budgets = {
        u.owner: tuple((key, covered) for key, covered, _ in u.pdb_use) for u in units if u.owner in moved_owners
    }
    actions = tuple(
        EvictPod(
            ns,
            name,
            Reason.REBALANCE,
            m.detail,
            gang=m.gang,
            uid=uids.get((ns, name)),
            budgets=budgets.get(m.owner, ()) if m.gang else (),
        )
        for m in moves
        for ns, name in m.pods
    )
    stranded_after = _stranded(cluster, [t for t in targets if t.name not in served], free)
    times = recent + (now,) * len(actions)
    # A target no longer waiting (placed, or gone) is forgotten once its current wait is over: its moves worked, or
    # there is nothing to wait for. Not at once: a gang whose pods are being recreated (a Job replacing a failed pod,
    # Kueue requeueing a workload) is missing from one snapshot and waits again, as unplaceable, at the next.
    # This pass's own come last (record_pass keeps only those whose evictions were made).
    waiting = {t.name for t in targets}
    earlier = sorted(
        (
            (name, at)
            for name, times in attempts.items()
            if name in waiting or now - times[-1] < config.retry_wait_s(len(times))
            for at in times
        ),
        key=lambda item: (item[1], item[0]),
    )
    moved_for = tuple(earlier) + tuple((t, now) for t in dict.fromkeys(m.target for m in moves))
    plan = RebalancePlan(True, tuple(moves), actions, stranded_before, stranded_after, tuple(notes))
    return plan, RebalanceState(now, times, moved_for, state.watching, state.put_back)


def _judge_moves(
    state: RebalanceState, cluster: _Cluster, targets: Sequence[_Target], now: float, config: RebalanceConfig
) -> RebalanceState:
    """``state`` with the targets it watches judged: kept (False) when the target is placed or gone; put back (True)
    when it still waits and fits nowhere as things are -- the room its moves made was taken again (under a spreading
    scorer, by the moved replica's replacement or the service's next new replica); still watched while it fits where
    they made room (the scheduler, or the arbitration's resume after its quiet period, has not placed it yet), and
    kept once it has fitted there for ``put_back_watch_s`` (the room was not taken: it waits for something else)."""
    if not state.watching:
        return state
    waiting = {t.name: t for t in targets}
    watching: list[tuple[str, float]] = []
    put_back = list(state.put_back)
    for name, moved_at in state.watching:
        target = waiting.get(name)
        if target is None:
            put_back.append((now, False))
            continue
        fits = cluster.place_target(dict(cluster.soon), target, dict(cluster.soon_beside))
        if fits is None:
            put_back.append((now, True))
        elif now - moved_at < config.put_back_watch_s:
            # watched from now at the latest: moves after now (a wall clock stepped back) are not watched for longer
            watching.append((name, min(moved_at, now)))
        else:
            put_back.append((now, False))  # the room is still there: not refilled (the target waits for another thing)
    kept = tuple(put_back[-config.put_back_checks :]) if config.put_back_checks > 0 else ()
    return replace(state, watching=tuple(watching), put_back=kept)


def _make_room(
    cluster: _Cluster,
    free: Mapping[str, int],
    beside: Mapping[str, tuple[int, int]],
    target: _Target,
    units: Sequence[_Unit],
    budget: int,
    pdb_used: Mapping[str, int],
) -> tuple[list[tuple[_Unit, dict[str, int]]], dict[str, int], dict[str, tuple[int, int]], set[str]] | None:
    """The fewest movable units whose moves let every pod of ``target`` fit: pod by pod (largest first), the node of
    its type needing the fewest moves (then the fewest GPUs moved) becomes its home (pods of one target may share a
    home); the units moved off it must fit on other nodes than the homes. A pod needs its CPU and memory beside the
    GPUs on its home as well (``beside``, where the node says): units moved off give theirs back, and are moved only
    where theirs fit. Returns the moves with their destinations, the free GPUs and CPU and memory after them (the
    target's taken) and the target's homes, or None when ``budget`` moves do not do it."""
    work = dict(free)
    work_beside = dict(beside)
    homes: set[str] = set()
    chosen: list[tuple[_Unit, dict[str, int]]] = []
    taken: set[str] = set()
    # the units wholly on each node, largest first (in ``units``' order among equals), gathered once: scanning every
    # unit for every node made a pass quadratic in the cluster's size (minutes on a thousand nodes)
    on_one_node: dict[str, list[_Unit]] = defaultdict(list)
    for unit in units:
        if len(unit.gpus_by_node) == 1:
            on_one_node[next(iter(unit.gpus_by_node))].append(unit)
    for listed in on_one_node.values():
        listed.sort(key=lambda u: (-u.gpus, u.owner))
    needs = _needs(target.pod_gpus, target.pods, target.beside)
    apart = _may_keep_apart(target.pods, target.pod_gpus)
    placed: list[tuple[int, str]] = []  # (pod index, home) of the target's pods given a home
    for i in sorted(range(len(target.pod_gpus)), key=lambda k: -target.pod_gpus[k]):
        gpus, pod_needs = target.pod_gpus[i], needs[i]
        chosen_units = [u for u, _ in chosen]
        best: (
            tuple[tuple[int, int, str], list[tuple[_Unit, dict[str, int]]], dict[str, int], dict[str, tuple[int, int]],
                  str] | None
        ) = None  # fmt: skip
        for node in sorted(work):
            # a node already home to an earlier pod of the target may take this one too (the scheduler packs a
            # gang's pods wherever they fit); its GPUs left, and any freed for this pod, are what counts
            if not cluster.allows(node, target):
                continue
            # ... unless its pods keep apart (a term selecting each other): then no two in one domain
            if apart and cluster.siblings_keep_off(target.pods, i, node, placed):
                continue
            room = work_beside.get(node)
            if work[node] >= gpus and fits_beside(work_beside, node, pod_needs):
                best = ((0, 0, node), [], dict(work), dict(work_beside), node)
                break
            # what must leave: GPUs, and the CPU and memory the pod lacks there (where known; only what it requests,
            # as ``fits_beside``: a node over-requested in a resource the pod does not ask for still takes it)
            need = max(0, gpus - work[node])
            short_cpu = max(0, pod_needs[0] - room[0]) if room is not None and pod_needs[0] > 0 else 0
            short_memory = max(0, pod_needs[1] - room[1]) if room is not None and pod_needs[1] > 0 else 0
            here = [u for u in on_one_node.get(node, ()) if u.owner not in taken]
            if sum(u.gpus for u in here) < need:
                continue
            picked: list[_Unit] = []
            freed = freed_cpu = freed_memory = 0
            for unit in here:
                if freed >= need and freed_cpu >= short_cpu and freed_memory >= short_memory:
                    break
                # one unit per owner in a pass, and every budget held over all the pass's moves together
                if not _admissible([*chosen_units, *picked, unit], pdb_used):
                    continue
                picked.append(unit)
                freed += unit.gpus
                freed_cpu += sum(p.cpu_milli for p in unit.pods if p.node == node)
                freed_memory += sum(p.memory_bytes for p in unit.pods if p.node == node)
            if freed < need or freed_cpu < short_cpu or freed_memory < short_memory:
                continue
            # minimal: drop the smallest while the rest still frees enough
            for unit in sorted(picked, key=lambda u: u.gpus):
                cpu = sum(p.cpu_milli for p in unit.pods if p.node == node)
                memory = sum(p.memory_bytes for p in unit.pods if p.node == node)
                if freed - unit.gpus >= need and freed_cpu - cpu >= short_cpu and freed_memory - memory >= short_memory:
                    picked.remove(unit)
                    freed -= unit.gpus
                    freed_cpu -= cpu
                    freed_memory -= memory
            if not picked:
                continue
            moves = sum(len(u.pods) for u in picked)
            if moves + sum(len(u.pods) for u, _ in chosen) > budget:
                continue
            trial = dict(work)
            trial[node] += freed
            trial_beside = dict(work_beside)
            add_beside(trial_beside, node, (freed_cpu, freed_memory))
            dests = []
            exclude = frozenset(homes | {node})
            for unit in picked:
                dest = cluster.place(
                    trial, unit.pod_gpus, unit.gpu_type, unit.training, exclude=exclude, pods=unit.pods,
                    beside=trial_beside,
                )  # fmt: skip
                if dest is None:
                    break
                dests.append((unit, dest))
            if len(dests) < len(picked):
                continue
            key = (moves, freed, node)
            if best is None or key < best[0]:
                best = (key, dests, trial, trial_beside, node)
        if best is None:
            return None
        _, dests, work, work_beside, node = best
        work[node] -= gpus
        add_beside(work_beside, node, pod_needs, -1)
        homes.add(node)
        placed.append((i, node))
        for unit, _ in dests:
            taken.add(unit.owner)
        chosen.extend(dests)
    return chosen, work, work_beside, homes


def _admissible(units: Sequence[_Unit], pdb_used: Mapping[str, int]) -> bool:
    """Moving all of ``units`` in one pass (after what the pass already moved) takes no owner twice and keeps every
    PodDisruptionBudget within what it allows."""
    owners = [u.owner for u in units]
    if len(owners) != len(set(owners)):
        return False
    use: dict[str, int] = defaultdict(int)
    allowed: dict[str, int] = {}
    for unit in units:
        for key, covered, allows in unit.pdb_use:
            use[key] += covered
            allowed[key] = allows
    return all(pdb_used.get(key, 0) + n <= allowed[key] for key, n in use.items())


def _pods_moved(moves: Sequence[Move]) -> int:
    return sum(len(m.pods) for m in moves)


def record_pass(
    previous: RebalanceState,
    planned: RebalanceState,
    plan: RebalancePlan,
    now: float,
    applied: Collection[tuple[str, str]],
) -> RebalanceState:
    """The state after a pass of which only the evictions ``applied`` ((namespace, name)) were made -- a dry run or a
    PodDisruptionBudget's refusal moved nothing: only made moves spend the hourly bound or make their target wait."""
    recent = tuple(t for t in previous.move_times if now - t < HOUR_S)
    made = sum(1 for a in plan.actions if (a.namespace, a.name) in applied)
    targets = dict.fromkeys(m.target for m in plan.moves if any(p in applied for p in m.pods))
    # the targets still waiting from earlier passes (plan_rebalance put this pass's own after them): kept whatever their
    # time -- one after now (a wall clock stepped back) still waits out retry_after_s, not only this pass's applied
    this_pass = len(dict.fromkeys(m.target for m in plan.moves))
    kept = planned.moved_for[: len(planned.moved_for) - this_pass]
    # the targets of the moves made are watched: whether the room the moves made was kept for them (``_judge_moves``).
    # Only a target whose every eviction was made: one refused (a PodDisruptionBudget) left its room unmade, and the
    # target still fitting nowhere is no room put back. A target moved for again while watched is watched once, from
    # these moves (judged twice, one refilled room would count twice towards put_back_checks).
    unmade = {m.target for m in plan.moves if not all(p in applied for p in m.pods)}
    watched = tuple((t, now) for t in targets if t not in unmade and not t.startswith(_BURST_TARGET))
    again = {t for t, _ in watched}
    return RebalanceState(
        planned.last_pass_at,
        recent + (now,) * made,
        kept + tuple((t, now) for t in targets),
        tuple(w for w in planned.watching if w[0] not in again) + watched,
        planned.put_back,
    )


def merge_move_times(kept: Iterable[float], recorded: Iterable[float], now: float) -> tuple[float, ...]:
    """The evictions of the last hour as both this process (``kept``) and the move ledger (``recorded``) know them:
    each instant as many times as the one that saw it more often (the same pass's evictions share their instant, and
    a ledger written by this process holds its own instants again), oldest first. A leader that took over knows
    nothing and the ledger everything; a ledger whose correction after a refused eviction failed knows one more."""
    counts: dict[float, int] = {}
    for source in (kept, recorded):
        seen: dict[float, int] = {}
        for t in source:
            if now - t < HOUR_S:
                seen[t] = seen.get(t, 0) + 1
        for t, n in seen.items():
            counts[t] = max(counts.get(t, 0), n)
    return tuple(t for t in sorted(counts) for _ in range(counts[t]))


def merge_moved_for(
    kept: Iterable[tuple[str, float]], recorded: Iterable[tuple[str, float]]
) -> tuple[tuple[str, float], ...]:
    """The passes of moves for each target as both this process (``kept``) and the move ledger (``recorded``) know
    them: every (target, time) either saw, once, oldest first (``plan_rebalance`` keeps the latest few of each target
    still waiting; their count sets its wait). A leader that took over knows nothing and the ledger everything; a
    ledger written by this process holds its own passes again."""
    return tuple(sorted(set((*kept, *recorded)), key=lambda item: (item[1], item[0])))


def _attempts_by_target(moved_for: Iterable[tuple[str, float]], remembered: int) -> dict[str, tuple[float, ...]]:
    """Each target's passes of moves, oldest first, the latest ``remembered`` of them (the same instant once)."""
    by_target: dict[str, set[float]] = defaultdict(set)
    for target, at in moved_for:
        by_target[target].add(at)
    return {target: tuple(sorted(times))[-remembered:] for target, times in by_target.items()}


def protected_owners(
    decisions: Iterable[ScaleDecision], unsure: Iterable[str] = (), spare_only: bool = True
) -> frozenset[str]:
    """Deployments a rebalance move must not touch now (``deployment/<namespace>/<name>``): those whose metrics were
    stale or partial (``unsure`` service keys), and those the tick wanted to grow, guarded on latency or held at their
    maximum -- a move takes one of their replicas away for a cold start. With ``spare_only``
    (``RebalanceConfig.spare_replicas_only``) also those the tick recommended as many replicas as they run, or more
    (forecast floor included): they have none to spare. (A Deployment without a decision has no valid policy this
    tick: ``managed_services`` leaves it out of the pass altogether.)"""
    keys = set(unsure)
    for decision in decisions:
        if (
            decision.desired_replicas > decision.current_replicas
            or decision.reason in _BUSY
            or (
                spare_only
                and decision.recommended_replicas is not None
                and decision.recommended_replicas >= decision.current_replicas
            )
        ):
            keys.add(decision.key)
    return frozenset(f"{_DEPLOYMENT}{key}" for key in keys)


def _opted_in(pods: Sequence[PodInfo]) -> bool:
    return bool(pods) and all(p.labels.get(REBALANCE_LABEL) == "allowed" for p in pods)


def _opted_in_deployments(snapshot: ClusterSnapshot) -> frozenset[str]:
    """The Deployments (``deployment/<namespace>/<name>``) every GPU pod of which carries
    ``gpuautoscaler.dev/rebalance=allowed``."""
    replicas: dict[str, list[PodInfo]] = defaultdict(list)
    for pod in snapshot.pods:
        if pod.owner_kind != "Deployment" or not pod.owner_name or pod.gpus <= 0:
            continue
        if pod.phase not in ("Succeeded", "Failed"):
            replicas[f"{_DEPLOYMENT}{pod.namespace}/{pod.owner_name}"].append(pod)
    return frozenset(owner for owner, pods in replicas.items() if _opted_in(pods))


def resumable_suspended(plan: Plan) -> frozenset[str] | None:
    """The ``resumable`` of ``plan_rebalance`` from a tick's plan: the workloads this controller suspended that its
    capacity arbitration would resume once their GPUs are gathered; None when the tick ran no arbitration."""
    return None if plan.capacity is None else frozenset(plan.capacity.resumable_once_gathered)


def managed_services(decisions: Iterable[ScaleDecision]) -> frozenset[str]:
    """The services (``namespace/name``) a valid policy scaled this tick -- the ``managed`` of ``plan_rebalance``.
    Not one that is only recommended for (``recommend-only`` mode, or an HPA also scaling it): this controller does
    not act on it, and a move is an eviction (its owner may still opt its pods in with the label)."""
    return frozenset(decision.key for decision in decisions if not decision.recommend_only)


_BUSY = frozenset({Reason.SLO_BREACH, Reason.AT_MAX_REPLICAS})
