"""Placement advice for kube-scheduler (its HTTP extender's ``filter`` and ``prioritize``), pure: the controller's
latest ``ClusterSnapshot``, the pod being scheduled and the candidate nodes in, node verdicts and scores out.

The snapshot is the controller's, read once per tick; kube-scheduler's own cache is newer (it has assumed the pods it
placed since). So:

- **filter** turns no node away. kube-scheduler calls an extender only with the nodes its own filters (NodeAffinity,
  NodeResourcesFit: the GPU type label, the GPUs free) passed on its cache, which is newer than our snapshot; every
  rule the snapshot could add (a GPU type the pod does not select, a node with fewer GPUs than the pod asks for) says
  no only where the snapshot is behind -- a GPU back from unhealthy, a node relabelled since the tick's read -- and
  then wrongly: the only fitting node turned away, the pod unschedulable and the scheduler's preemption evicting
  lower-priority GPU pods elsewhere for it. ``deploy/`` does not configure the verb (one round trip less per pod);
  it is answered, every node passing, for a scheduler configuration that still names it.
- **prioritize** scores by GPU fragmentation (FGD, ``autoscaler.core.fragmentation``): each node's GPUs as whole GPUs
  free or taken by the snapshot's live pods, the task mix learnt from those pods, and each candidate's score from one
  swappable ``Scorer`` (0..100, None = does not fit per the snapshot). A candidate whose free GPUs the snapshot shows
  fewer than the pod asks for had GPUs freed since the read (the scheduler sends only nodes that fit on its newer
  cache): it is scored as having exactly the pod's GPUs free, the least the scheduler's answer implies -- scored as
  not fitting it came last, and a draining queue's pods went to empty nodes instead of refilling the busy ones. The
  scores are spread over the candidates to kube-scheduler's 0..``MAX_EXTENDER_PRIORITY`` (least fragmenting 10,
  most 1; a node that does not fit even so 0), so that the extender's weight, not the sigmoid's flat middle, sets
  how much the ranking counts.
- **fail open**: no snapshot, a snapshot older than ``ExtenderConfig.max_snapshot_age_s``, or a pod that could not be
  read -- every node passes and every score is 0, with the reason (``FailOpen``) for the caller to log and count. A
  pod asking for no GPU is not our business: every node passes, every score 0, not a failure.

``PlacementView.of(snapshot)`` does the per-snapshot work once (nodes, mix); the HTTP side keeps one per snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from autoscaler.core.cluster import ClusterSnapshot, PodInfo, free_gpus_per_node
from autoscaler.core.fragmentation import GPU_MILLI, GpuNode, Task, TaskMix, fgd_placement, fgd_score, learn_task_mix

MAX_EXTENDER_PRIORITY = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority
MIN_EXTENDER_PRIORITY = 0

# The snapshot has no CPU or memory per node: the host side of FGD's fit is left to kube-scheduler (it filtered on
# it before asking us), so every node's host is "large enough".
_HOST_UNBOUNDED = 1 << 40

Scorer = Callable[[Sequence[GpuNode], Task, TaskMix], list[int | None]]
"""``(nodes, task, mix) -> score per node`` in 0..100 (higher = better placement), None where the task does not fit."""


class FailOpen(StrEnum):
    """Why the extender gave no advice (every node passes, every score 0)."""

    NO_SNAPSHOT = "no_snapshot"  # the controller has not read the cluster yet
    STALE_SNAPSHOT = "stale_snapshot"  # its latest read is older than the configured maximum age
    BAD_POD = "bad_pod"  # the pod in the request could not be read (its GPU request or selector)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What the extender needs of the pod being scheduled."""

    namespace: str
    name: str
    gpus: int  # whole nvidia.com/gpu on one node (the pod's effective request)
    gpu_products: frozenset[str] | None = None  # GPU types it accepts (nvidia.com/gpu.product); None = any
    priority: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError("a pod's GPU request must be >= 0")
        if self.gpu_products is not None and not self.gpu_products:
            raise ValueError("gpu_products is None (any type) or a non-empty set")

    @property
    def task(self) -> Task:
        if self.gpus == 0:
            return Task(0)
        return Task(0, 0, GPU_MILLI, self.gpus, self.gpu_products)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    max_snapshot_age_s: float = 60.0  # older: fail open

    def __post_init__(self) -> None:
        if not self.max_snapshot_age_s > 0:
            raise ValueError("max_snapshot_age_s must be > 0")


@dataclass(frozen=True, slots=True)
class PlacementView:
    """The per-snapshot part of the advice: each node as FGD sees it, its GPU capacity, and the task mix."""

    time: float  # the snapshot's time (Unix seconds)
    nodes: Mapping[str, GpuNode]
    capacity: Mapping[str, int]  # allocatable GPUs of each node
    mix: TaskMix

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> PlacementView:
        free = free_gpus_per_node(snapshot)
        nodes: dict[str, GpuNode] = {}
        capacity: dict[str, int] = {}
        for n in snapshot.nodes:
            gpus = max(0, n.allocatable_gpus)
            idle = min(free.get(n.name, 0), gpus)
            nodes[n.name] = GpuNode(
                n.name,
                _HOST_UNBOUNDED,
                _HOST_UNBOUNDED,
                n.gpu_product,
                (GPU_MILLI,) * idle + (0,) * (gpus - idle),
            )
            capacity[n.name] = gpus
        return cls(snapshot.time, nodes, capacity, learn_task_mix(_snapshot_tasks(snapshot), include_cpu_only=False))


def _snapshot_tasks(snapshot: ClusterSnapshot) -> Iterable[Task]:
    """A task per live GPU pod, with the GPU type its Deployment or training workload selects."""
    by_deployment = {(d.namespace, d.name): d.gpu_product for d in snapshot.deployments}
    by_gang = {w.gang: w.gpu_product for w in snapshot.workloads}
    for pod in snapshot.pods:
        if pod.gpus <= 0 or pod.phase in ("Succeeded", "Failed"):
            continue
        product = _pod_product(pod, by_deployment, by_gang)
        yield Task(0, 0, GPU_MILLI, pod.gpus, None if product is None else frozenset({product}))


def _pod_product(
    pod: PodInfo, by_deployment: Mapping[tuple[str, str], str | None], by_gang: Mapping[str, str | None]
) -> str | None:
    if pod.gpu_product is not None:
        return pod.gpu_product
    if pod.owner_kind == "Deployment" and pod.owner_name:
        return by_deployment.get((pod.namespace, pod.owner_name))
    if pod.gang is not None:
        return by_gang.get(pod.gang)
    return None


def fgd_scores_per_node(nodes: Sequence[GpuNode], task: Task, mix: TaskMix) -> list[int | None]:
    """FGD's score of each node (``fgd_score`` of its least-fragmenting placement), None where it does not fit."""
    out: list[int | None] = []
    for node in nodes:
        placement = fgd_placement(node, task, mix)
        out.append(None if placement is None else fgd_score(placement.delta_milli))
    return out


def once_per_node_state(scorer: Scorer) -> Scorer:
    """``scorer`` called on one node of each distinct state (GPU type, free GPUs, CPU, memory) and its scores copied
    to the nodes in the same state. A large cluster has few distinct states (1,000 nodes of 8 whole GPUs: at most 9
    per GPU type), so this turns a per-node cost into a per-state one. Exact for scorers whose score of a node depends
    only on its state and on the set of states offered (not on names, order or repeats) -- FGD's, and a min-max
    rescaling over the candidates such as ``autoscaler.core.placement_score.score_nodes``."""

    def scored(nodes: Sequence[GpuNode], task: Task, mix: TaskMix) -> list[int | None]:
        index: dict[tuple[str | None, tuple[int, ...], int, int], int] = {}
        unique: list[GpuNode] = []
        slots: list[int] = []
        for node in nodes:
            key = (node.gpu_type, node.gpu_free_milli, node.cpu_milli, node.memory_mib)
            if key not in index:
                index[key] = len(unique)
                unique.append(node)
            slots.append(index[key])
        scores = scorer(unique, task, mix)
        return [scores[i] for i in slots]

    return scored


fgd_scores: Scorer = once_per_node_state(fgd_scores_per_node)
"""The extender's default scorer: FGD, once per distinct node state."""


def check_fresh(view: PlacementView | None, now: float, config: ExtenderConfig) -> FailOpen | None:
    """None when the view may be used at ``now``; else why not."""
    if view is None:
        return FailOpen.NO_SNAPSHOT
    if now - view.time > config.max_snapshot_age_s:
        return FailOpen.STALE_SNAPSHOT
    return None


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: tuple[str, ...]  # in the order asked: every node (see the module doc)
    fail_open: FailOpen | None = None


@dataclass(frozen=True, slots=True)
class PriorityOutcome:
    scores: tuple[tuple[str, int], ...]  # (node, 0..MAX_EXTENDER_PRIORITY), in the order asked
    fail_open: FailOpen | None = None


def filter_nodes(
    view: PlacementView | None,
    pod: PodRequest | None,
    node_names: Sequence[str],
    now: float,
    config: ExtenderConfig,
) -> FilterOutcome:
    """Every candidate passes (see the module doc); ``fail_open`` says when the advice would have been none anyway
    (no usable snapshot, an unreadable pod), for the caller's counts."""
    names = tuple(node_names)
    if pod is None:
        return FilterOutcome(names, fail_open=FailOpen.BAD_POD)
    return FilterOutcome(names, fail_open=check_fresh(view, now, config))


def prioritize_nodes(
    view: PlacementView | None,
    pod: PodRequest | None,
    node_names: Sequence[str],
    now: float,
    config: ExtenderConfig,
    scorer: Scorer = fgd_scores,
) -> PriorityOutcome:
    """Each candidate's score, 0..10: the ``scorer``'s 0..100 spread over the candidates (see the module doc)."""
    names = tuple(node_names)
    zeros = tuple((name, MIN_EXTENDER_PRIORITY) for name in names)
    if pod is None:
        return PriorityOutcome(zeros, FailOpen.BAD_POD)
    why = check_fresh(view, now, config)
    if why is not None or view is None:
        return PriorityOutcome(zeros, why)
    if pod.gpus == 0:
        return PriorityOutcome(zeros)
    known = [name for name in names if name in view.nodes]
    task = pod.task
    mix = view.mix if view.mix.classes else TaskMix.of([(task, 1.0)])  # nothing seen yet: the pod is the mix
    nodes = [_with_room_for(view.nodes[name], pod.gpus, pod.gpu_products) for name in known]
    raw = dict(zip(known, scorer(nodes, task, mix), strict=True))
    return PriorityOutcome(tuple((name, s) for name, s in zip(names, spread([raw.get(n) for n in names]), strict=True)))


def _with_room_for(node: GpuNode, gpus: int, gpu_products: frozenset[str] | None = None) -> GpuNode:
    """``node`` as the scheduler found it, on its newer cache, when it offered it as a candidate (its resource fit
    and node affinity passed): with at least ``gpus`` whole GPUs free (GPUs the snapshot shows taken have been freed
    since; as few as the pod needs are counted free; a GPU node the snapshot counted fewer GPUs on -- unhealthy at the
    read -- gets the missing ones, free), and of a GPU type the pod selects (``gpu_products``) when the snapshot had
    none (a new node GPU feature discovery had not labelled yet). Scored as "does not fit" on our older view, an
    exact fit was ranked last. A node the snapshot has no GPU on at all, or another GPU type (a type does not change
    under a node), is left as it is (does not fit)."""
    if not node.gpu_free_milli:
        return node
    if gpu_products is not None and node.gpu_type is None:
        node = replace(node, gpu_type=min(gpu_products))
    if len(node.gpu_free_milli) < gpus:
        node = replace(node, gpu_free_milli=node.gpu_free_milli + (GPU_MILLI,) * (gpus - len(node.gpu_free_milli)))
    free = sum(1 for f in node.gpu_free_milli if f == GPU_MILLI)
    if free >= gpus:
        return node
    freed = 0  # the first GPUs not wholly free, as many as needed (the view's GPUs are wholly free or taken)
    gpus_free: list[int] = []
    for f in node.gpu_free_milli:
        if f < GPU_MILLI and freed < gpus - free:
            gpus_free.append(GPU_MILLI)
            freed += 1
        else:
            gpus_free.append(f)
    return replace(node, gpu_free_milli=tuple(gpus_free))


def spread(scores: Sequence[int | float | None]) -> list[int]:
    """Scores (None = does not fit) to 0..MAX_EXTENDER_PRIORITY across the candidates: the best 10, the worst that
    fits 1, linear between, rounded -- but below 10 for every score below the best (rounded up to 10, a node FGD
    scores lower tied the best, and kube-scheduler breaks ties at random); all fitting nodes 10 when they score the
    same; a node that does not fit 0."""
    fitting = [s for s in scores if s is not None]
    if not fitting:
        return [MIN_EXTENDER_PRIORITY] * len(scores)
    lo, hi = min(fitting), max(fitting)
    out: list[int] = []
    for s in scores:
        if s is None:
            out.append(MIN_EXTENDER_PRIORITY)
        elif hi == lo or s == hi:
            out.append(MAX_EXTENDER_PRIORITY)
        else:
            out.append(min(MAX_EXTENDER_PRIORITY - 1, 1 + round((MAX_EXTENDER_PRIORITY - 1) * (s - lo) / (hi - lo))))
    return out
