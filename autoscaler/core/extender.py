"""Placement advice for kube-scheduler (its HTTP extender's ``filter`` and ``prioritize``), pure: the controller's
latest ``ClusterSnapshot``, the pod being scheduled and the candidate nodes in, node verdicts and scores out.

The snapshot is the controller's, read once per tick; kube-scheduler's own cache is newer (it has assumed the pods it
placed since). So:

- **filter** says no only where a *stable* rule does, one a newer cache rarely overturns: the node's GPU type is not
  one the pod asks for (``GPU_TYPE_MISMATCH``), or the node has fewer GPUs in all than the pod asks for on one node
  (``NODE_TOO_SMALL``: no eviction makes an 8-GPU pod fit a 4-GPU node). Both are answered as resolvable
  ``FailedNodes``, not unresolvable: a node's GPU count or type label does change (a GPU back from unhealthy, a MIG
  or driver change), the scheduler's cache sees it first, and an unresolvable answer would park the pod and keep
  preemption off a node the scheduler, on its newer cache, finds fit. Only what the snapshot has shown counts: a
  node without a GPU type label or without allocatable GPUs in it passes (a new node whose feature discovery or
  device plugin had not reported yet; kube-scheduler's own resource fit and node affinity still reject a node that
  lacks them). Free GPUs are never filtered on: the snapshot may be behind the scheduler, which checks them itself;
  a node our snapshot thinks full is scored lowest instead.
- **prioritize** scores by GPU fragmentation (FGD, ``autoscaler.core.fragmentation``): each node's GPUs as whole GPUs
  free or taken by the snapshot's live pods, the task mix learnt from those pods, and each candidate's score from one
  swappable ``Scorer`` (0..100, None = does not fit per the snapshot). The scores are spread over the candidates to
  kube-scheduler's 0..``MAX_EXTENDER_PRIORITY`` (least fragmenting 10, most 1; a node that does not fit 0), so that
  the extender's weight, not the sigmoid's flat middle, sets how much the ranking counts.
- **fail open**: no snapshot, a snapshot older than ``ExtenderConfig.max_snapshot_age_s``, or a pod that could not be
  read -- every node passes and every score is 0, with the reason (``FailOpen``) for the caller to log and count. A
  pod asking for no GPU is not our business: every node passes, every score 0, not a failure.

``PlacementView.of(snapshot)`` does the per-snapshot work once (nodes, mix); the HTTP side keeps one per snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


class FilterReason(StrEnum):
    """Why the filter turned a node away; the text is the one kube-scheduler shows in the pod's events."""

    GPU_TYPE_MISMATCH = "gpu_type_mismatch"
    NODE_TOO_SMALL = "node_too_small"

    @property
    def text(self) -> str:
        return _FILTER_TEXT[self]


_FILTER_TEXT = {
    FilterReason.GPU_TYPE_MISMATCH: "gpu-autoscaler: the node's GPU type is not one the pod asks for",
    FilterReason.NODE_TOO_SMALL: "gpu-autoscaler: the node has fewer GPUs than the pod asks for",
}


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
    passed: tuple[str, ...]  # in the order asked
    failed: Mapping[str, FilterReason] = field(default_factory=dict)  # answered as FailedNodes (resolvable)
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
    """The candidates a stable GPU rule does not exclude (see the module doc). Nodes the snapshot does not know pass."""
    names = tuple(node_names)
    if pod is None:
        return FilterOutcome(names, fail_open=FailOpen.BAD_POD)
    why = check_fresh(view, now, config)
    if why is not None or view is None:
        return FilterOutcome(names, fail_open=why)
    if pod.gpus == 0:
        return FilterOutcome(names)
    passed: list[str] = []
    failed: dict[str, FilterReason] = {}
    for name in names:
        node = view.nodes.get(name)
        if node is None:
            passed.append(name)
        # Only facts the snapshot has: a node that joined before its device plugin registered its GPUs (0
        # allocatable) or before feature discovery labelled its type is not judged on what it did not show yet (the
        # scheduler's cache may be newer; an unresolvable answer parks the pod for minutes). kube-scheduler's own
        # resource fit still rejects a node without the GPUs.
        elif pod.gpu_products is not None and node.gpu_type is not None and node.gpu_type not in pod.gpu_products:
            failed[name] = FilterReason.GPU_TYPE_MISMATCH
        elif 0 < view.capacity[name] < pod.gpus:
            failed[name] = FilterReason.NODE_TOO_SMALL
        else:
            passed.append(name)
    return FilterOutcome(tuple(passed), failed)


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
    raw = dict(zip(known, scorer([view.nodes[name] for name in known], task, mix), strict=True))
    return PriorityOutcome(tuple((name, s) for name, s in zip(names, spread([raw.get(n) for n in names]), strict=True)))


def spread(scores: Sequence[int | float | None]) -> list[int]:
    """Scores (None = does not fit) to 0..MAX_EXTENDER_PRIORITY across the candidates: the best 10, the worst that
    fits 1, linear between, rounded; all fitting nodes 10 when they score the same; a node that does not fit 0."""
    fitting = [s for s in scores if s is not None]
    if not fitting:
        return [MIN_EXTENDER_PRIORITY] * len(scores)
    lo, hi = min(fitting), max(fitting)
    out: list[int] = []
    for s in scores:
        if s is None:
            out.append(MIN_EXTENDER_PRIORITY)
        elif hi == lo:
            out.append(MAX_EXTENDER_PRIORITY)
        else:
            out.append(1 + round((MAX_EXTENDER_PRIORITY - 1) * (s - lo) / (hi - lo)))
    return out
