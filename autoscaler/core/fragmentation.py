"""GPU fragmentation of nodes for a task mix: the measure of FGD (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23, section 4), pure data in, numbers out.

A node's free GPU is a **fragment for a task** when the task could not use it there:

- the task asks for no GPU: all the node's free GPU is fragment to it (it will never use any);
- the node's GPU type is not one the task accepts ("no access"): all of it;
- the node lacks the task's CPU or memory ("lack CPU", or "lack both" when the GPUs do not fit either): all of it;
- the node's GPUs cannot hold the task ("lack GPU": fewer than ``gpu_count`` GPUs with ``gpu_milli`` free each): all;
- otherwise the task fits ("satisfied"), and the fragment is the free GPU on the GPUs that each have less free than
  the task asks per GPU (0.3 free of a GPU is a fragment to a 0.5 task, and every partly used GPU is one to a task of
  whole GPUs).

The node's fragmentation for a **task mix** (task classes weighted by popularity) is the popularity-weighted expected
fragment, ``F_n(M) = sum_m p_m * F_n(m)``, in milli-GPU; the cluster's is the sum over nodes. FGD places a task
where its placement grows the cluster's fragmentation least (``placement_delta``); only the chosen node changes, so
the node's own change is the cluster's.

Learnt from the paper and from the authors' simulator, ``hkust-adsl/kubernetes-scheduler-simulator`` @ 8f3d641:
``pkg/utils/frag.go`` (``GetNodePodFrag`` -- the cases above --, ``NodeGpuShareFragAmount``,
``GetGpuFragMilliByNodeResAndPodRes``, ``CanNodeHostPodOnGpuMemory``, ``GetTypicalPods``: the task mix), ``pkg/utils/
utils.go`` (``IsNodeAccessibleToPodByType``), ``pkg/type/resource.go`` (``NodeResource.Sub``: which GPUs a placement
takes), ``pkg/simulator/plugin/fgd_score.go`` (the score: ``sigmoid(delta / 1000) * 100``, and the GPU choice of a
fractional task). Re-written here, not translated. One extension: the authors check only CPU for "lack CPU"; here
memory counts too (a mix learnt with ``memory_mib = 0``, as the reproduction in ``autoscaler.sim.placement`` does,
gives exactly their measure).

GPU amounts are integers in milli-GPU (1000 = one whole GPU), as the Kubernetes ``gpu-milli`` resource and the
authors' code count them: exact, where fractions in floating point would make ``0.7 + 0.3 >= 1.0`` a coin toss.
``GpuNode.from_fractions``, ``GpuNode.gpu_free`` and ``Task.of`` / ``Task.gpu`` speak fractions at the edges.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

GPU_MILLI = 1000  # one whole GPU


class FragmentCase(StrEnum):
    """Why a node's free GPU is (or is not) a fragment to one task (the paper's quadrants, Fig. 5)."""

    SATISFIED = "satisfied"  # Q-III: the task fits; the GPUs too small for it are fragments
    LACK_GPU = "lack_gpu"  # Q-II: CPU and memory fit, the GPUs do not
    LACK_CPU = "lack_cpu"  # Q-IV: the GPUs fit, CPU or memory does not
    LACK_BOTH = "lack_both"  # Q-I
    NO_GPU_REQUEST = "no_gpu_request"  # the task asks for no GPU: all free GPU is fragment to it
    NO_ACCESS = "no_access"  # the node's GPU type is not one the task accepts


@dataclass(frozen=True, slots=True)
class GpuNode:
    """A node's free resources: CPU (milli), memory (MiB), its GPU type, and the free milli-GPU of each GPU."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_type: str | None = None  # None: no GPUs (or an unknown model)
    gpu_free_milli: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"node {self.name}: free CPU and memory must be >= 0")
        for free in self.gpu_free_milli:
            if not 0 <= free <= GPU_MILLI:
                raise ValueError(f"node {self.name}: a GPU's free milli-GPU must be in [0, {GPU_MILLI}], got {free}")

    @classmethod
    def from_fractions(
        cls, name: str, cpu_milli: int, memory_mib: int, gpu_type: str | None, free_fractions: Iterable[float]
    ) -> GpuNode:
        """A node whose GPUs' free shares are given as fractions of a GPU (0.0 .. 1.0), rounded to milli-GPU."""
        return cls(name, cpu_milli, memory_mib, gpu_type, tuple(round(f * GPU_MILLI) for f in free_fractions))

    @property
    def gpu_free(self) -> tuple[float, ...]:
        """Each GPU's free share as a fraction of a GPU."""
        return tuple(free / GPU_MILLI for free in self.gpu_free_milli)

    @property
    def free_gpu_milli(self) -> int:
        return sum(self.gpu_free_milli)

    @property
    def whole_free_gpus(self) -> int:
        return sum(1 for free in self.gpu_free_milli if free == GPU_MILLI)


@dataclass(frozen=True, slots=True)
class Task:
    """What one pod asks for: CPU (milli), memory (MiB), and GPU -- a share of one GPU (``gpu_count`` 1 and
    ``gpu_milli`` 1..999), whole GPUs (``gpu_milli`` 1000 and any ``gpu_count``), or none (both 0) -- and the GPU
    types it accepts (``None``: any)."""

    cpu_milli: int
    memory_mib: int = 0
    gpu_milli: int = 0  # per GPU
    gpu_count: int = 0
    gpu_types: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("a task's CPU and memory must be >= 0")
        if (self.gpu_milli == 0) != (self.gpu_count == 0):
            raise ValueError("a task asks for GPUs with both gpu_milli and gpu_count, or for none with neither")
        if not 0 <= self.gpu_milli <= GPU_MILLI or self.gpu_count < 0:
            raise ValueError(f"gpu_milli must be in [0, {GPU_MILLI}] and gpu_count >= 0")
        if 0 < self.gpu_milli < GPU_MILLI and self.gpu_count != 1:
            raise ValueError("a share of a GPU is asked for on one GPU only")
        if self.gpu_types is not None and not self.gpu_types:
            raise ValueError("gpu_types is None (any type) or a non-empty set")

    @classmethod
    def of(
        cls, cpu_milli: int, memory_mib: int = 0, gpu: float = 0, gpu_types: Iterable[str] | str | None = None
    ) -> Task:
        """``gpu`` is a fraction of one GPU (0 < gpu < 1, rounded to milli-GPU), a whole count (1, 2, 8 ...) or 0.
        ``gpu_types`` is a set of models, or a string of them separated by ``|`` (the openb trace's ``gpu_spec``)."""
        if gpu < 0:
            raise ValueError("gpu must be >= 0")
        if gpu == 0:
            milli, count = 0, 0
        elif gpu < 1:
            milli, count = round(gpu * GPU_MILLI), 1
            if milli == 0:
                raise ValueError(f"gpu={gpu} is less than one milli-GPU")
        elif float(gpu).is_integer():
            milli, count = GPU_MILLI, int(gpu)
        else:
            raise ValueError(f"gpu={gpu}: a fraction below 1 or a whole number of GPUs")
        return cls(cpu_milli, memory_mib, milli, count, parse_gpu_types(gpu_types))

    @property
    def gpu(self) -> float:
        """The GPU request as the paper writes it: a fraction of one GPU, or a whole count."""
        return self.gpu_milli / GPU_MILLI if self.gpu_count == 1 else float(self.gpu_count)

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0

    @property
    def is_fractional(self) -> bool:
        return 0 < self.gpu_milli < GPU_MILLI


def parse_gpu_types(gpu_types: Iterable[str] | str | None) -> frozenset[str] | None:
    """``"V100M16|V100M32"``, ``["T4"]``, ``""`` or ``None`` to a set of models, or None for any model."""
    if gpu_types is None:
        return None
    names = gpu_types.split("|") if isinstance(gpu_types, str) else list(gpu_types)
    kept = frozenset(name.strip() for name in names if name.strip())
    return kept or None


@dataclass(frozen=True, slots=True)
class TaskClass:
    task: Task
    weight: float  # popularity: any positive number, the mix normalises

    def __post_init__(self) -> None:
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError("a task class's weight must be positive and finite")


@dataclass(frozen=True, slots=True)
class TaskMix:
    """The typical tasks a cluster expects, each with its popularity."""

    classes: tuple[TaskClass, ...]

    @classmethod
    def of(cls, pairs: Iterable[tuple[Task, float]]) -> TaskMix:
        return cls(tuple(TaskClass(task, weight) for task, weight in pairs))

    @property
    def total_weight(self) -> float:
        return sum(c.weight for c in self.classes)

    def popularities(self) -> tuple[tuple[Task, float], ...]:
        """Each class's task and its share of the mix (the shares sum to 1)."""
        total = self.total_weight
        return tuple((c.task, c.weight / total) for c in self.classes)


def _mix_key(task: Task) -> tuple[int, int, int, str]:
    """The authors' order of equally popular task classes (``PodResource.Less``): CPU, GPU share, GPU count, types."""
    types = "|".join(sorted(task.gpu_types)) if task.gpu_types else ""
    return task.cpu_milli, task.gpu_milli, task.gpu_count, types


def learn_task_mix(
    tasks: Iterable[Task],
    weights: Iterable[float] | None = None,
    coverage: float = 0.95,
    include_cpu_only: bool = True,
) -> TaskMix:
    """The mix of the tasks seen (running and recently submitted pods), as the FGD authors build it
    (``GetTypicalPods``): identical requests form one class weighted by how often they were seen (or by ``weights``);
    the most popular classes are kept, one by one, until they cover ``coverage`` of all tasks seen (the authors use
    95 %), and the kept ones are renormalised. Equally popular classes are taken in the authors' order (larger CPU
    first, then larger GPU). With ``include_cpu_only`` (the authors' setting), tasks asking for no GPU are part of
    the mix -- to each of them all free GPU is fragment, a share that does not depend on where a task goes.
    """
    if not 0 < coverage <= 1:
        raise ValueError("coverage must be in (0, 1]")
    counts: dict[Task, float] = {}
    weight_list = None if weights is None else list(weights)
    task_list = list(tasks)
    if weight_list is not None and len(weight_list) != len(task_list):
        raise ValueError("one weight per task")
    for i, task in enumerate(task_list):
        if not include_cpu_only and not task.wants_gpu:
            continue
        counts[task] = counts.get(task, 0.0) + (1.0 if weight_list is None else weight_list[i])
    total = sum(counts.values())
    if total <= 0:
        return TaskMix(())
    ranked = sorted(counts.items(), key=lambda item: (item[1], _mix_key(item[0])), reverse=True)
    kept: list[tuple[Task, float]] = []
    covered = 0.0
    for task, count in ranked:
        if covered >= coverage * total:
            break
        kept.append((task, count))
        covered += count
    return TaskMix.of(kept)


# --- one node, one task ----------------------------------------------------------------------------------------------


def gpu_type_allowed(node: GpuNode, task: Task) -> bool:
    """The node's GPU model is one the task accepts (a task without a constraint accepts any, even no GPU model)."""
    if task.gpu_types is None:
        return True
    return node.gpu_type is not None and node.gpu_type in task.gpu_types


def host_fits(node: GpuNode, task: Task) -> bool:
    """The node has the task's CPU and memory free."""
    return node.cpu_milli >= task.cpu_milli and node.memory_mib >= task.memory_mib


def gpus_fit(node: GpuNode, task: Task) -> bool:
    """At least ``gpu_count`` of the node's GPUs each have ``gpu_milli`` free (true for a task asking for none)."""
    if not task.wants_gpu:
        return True
    return sum(1 for free in node.gpu_free_milli if free >= task.gpu_milli) >= task.gpu_count


def fits(node: GpuNode, task: Task) -> bool:
    """The task can be placed on the node: GPU type, CPU, memory and GPUs. A task asking for no GPU is held to no
    GPU type (as the authors' GPU filter, ``open_gpu_share.go`` ``Filter``, passes it)."""
    type_ok = gpu_type_allowed(node, task) or not task.wants_gpu
    return type_ok and host_fits(node, task) and gpus_fit(node, task)


def fragment_case(node: GpuNode, task: Task) -> FragmentCase:
    if not task.wants_gpu:
        return FragmentCase.NO_GPU_REQUEST
    if not gpu_type_allowed(node, task):
        return FragmentCase.NO_ACCESS
    host, gpus = host_fits(node, task), gpus_fit(node, task)
    if host and gpus:
        return FragmentCase.SATISFIED
    if gpus:
        return FragmentCase.LACK_CPU
    return FragmentCase.LACK_GPU if host else FragmentCase.LACK_BOTH


def task_fragment_milli(node: GpuNode, task: Task) -> int:
    """The node's free milli-GPU that the task could not use (``F_n(m)`` in the paper)."""
    if fragment_case(node, task) is FragmentCase.SATISFIED:
        return sum(free for free in node.gpu_free_milli if free < task.gpu_milli)
    return node.free_gpu_milli


# --- a node, a cluster, a mix ----------------------------------------------------------------------------------------


def node_fragmentation(node: GpuNode, mix: TaskMix) -> float:
    """The node's expected fragment for the mix, milli-GPU: ``sum_m p_m * F_n(m)`` (0 for an empty mix)."""
    return sum(p * task_fragment_milli(node, task) for task, p in mix.popularities())


def fragmentation_by_case(node: GpuNode, mix: TaskMix) -> dict[FragmentCase, float]:
    """The node's free GPU split by case, milli-GPU, popularity-weighted; ``SATISFIED`` is the part the mix can use,
    the rest is fragment (the authors' per-quadrant report). The values sum to the node's free GPU."""
    out = dict.fromkeys(FragmentCase, 0.0)
    free = node.free_gpu_milli
    for task, p in mix.popularities():
        case = fragment_case(node, task)
        fragment = task_fragment_milli(node, task)
        if case is FragmentCase.SATISFIED:
            out[FragmentCase.LACK_GPU] += p * fragment  # GPUs too small for the task: it lacks GPU there
            out[FragmentCase.SATISFIED] += p * (free - fragment)
        else:
            out[case] += p * fragment
    return out


def cluster_fragmentation(nodes: Iterable[GpuNode], mix: TaskMix) -> float:
    """The cluster's fragmentation for the mix, milli-GPU: the sum over its nodes."""
    return sum(node_fragmentation(node, mix) for node in nodes)


def fragmentation_ratio(nodes: Iterable[GpuNode], mix: TaskMix) -> float:
    """Fragmentation ÷ free GPU of the cluster (0.0 .. 1.0; 0.0 when no GPU is free)."""
    node_list = list(nodes)
    free = sum(node.free_gpu_milli for node in node_list)
    return cluster_fragmentation(node_list, mix) / free if free else 0.0


# --- placements and moves --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """A task on a node's GPUs (indices into ``gpu_free_milli``; empty for a task asking for no GPU), and how much it
    changes the node's -- hence the cluster's -- fragmentation, milli-GPU (negative: it shrinks)."""

    node: str
    gpus: tuple[int, ...]
    delta_milli: float


def default_gpus(node: GpuNode, task: Task) -> tuple[int, ...] | None:
    """The GPUs a placement takes when none are named: a share goes to the GPU with the least free that holds it
    (first such GPU); whole GPUs are the first wholly free ones. None when the task does not fit the GPUs."""
    if not task.wants_gpu:
        return ()
    if task.is_fractional:
        best: int | None = None
        for i, free in enumerate(node.gpu_free_milli):
            if free >= task.gpu_milli and (best is None or free < node.gpu_free_milli[best]):
                best = i
        return None if best is None else (best,)
    whole = tuple(i for i, free in enumerate(node.gpu_free_milli) if free == GPU_MILLI)
    return whole[: task.gpu_count] if len(whole) >= task.gpu_count else None


def candidate_gpus(node: GpuNode, task: Task) -> tuple[tuple[int, ...], ...]:
    """The GPU choices that can differ in fragmentation: each GPU that holds a share; for whole GPUs, the first
    wholly free ones (any wholly free GPUs leave the same node behind)."""
    if task.is_fractional:
        return tuple((i,) for i, free in enumerate(node.gpu_free_milli) if free >= task.gpu_milli)
    chosen = default_gpus(node, task)
    return () if chosen is None else (chosen,)


def allocate(node: GpuNode, task: Task, gpus: Sequence[int] | None = None) -> GpuNode:
    """The node with the task placed on it (on ``gpus``, or the default ones). Raises ValueError if it does not fit.
    Never leaves negative free CPU, memory or GPU."""
    if not fits(node, task):
        raise ValueError(f"task does not fit node {node.name}")
    chosen = default_gpus(node, task) if gpus is None else tuple(gpus)
    if chosen is None or len(chosen) != task.gpu_count or len(set(chosen)) != len(chosen):
        raise ValueError(f"task needs {task.gpu_count} distinct GPUs on node {node.name}, got {chosen}")
    free = list(node.gpu_free_milli)
    for i in chosen:
        if not 0 <= i < len(free) or free[i] < task.gpu_milli:
            raise ValueError(f"GPU {i} of node {node.name} cannot hold {task.gpu_milli} milli-GPU")
        free[i] -= task.gpu_milli
    return replace(
        node,
        cpu_milli=node.cpu_milli - task.cpu_milli,
        memory_mib=node.memory_mib - task.memory_mib,
        gpu_free_milli=tuple(free),
    )


def release(node: GpuNode, task: Task, gpus: Sequence[int]) -> GpuNode:
    """The node with a task that ran on ``gpus`` removed (the inverse of ``allocate``)."""
    if len(gpus) != task.gpu_count:
        raise ValueError(f"the task held {task.gpu_count} GPUs, got {len(gpus)}")
    free = list(node.gpu_free_milli)
    for i in gpus:
        if not 0 <= i < len(free) or free[i] + task.gpu_milli > GPU_MILLI:
            raise ValueError(f"GPU {i} of node {node.name} cannot give back {task.gpu_milli} milli-GPU")
        free[i] += task.gpu_milli
    return replace(
        node,
        cpu_milli=node.cpu_milli + task.cpu_milli,
        memory_mib=node.memory_mib + task.memory_mib,
        gpu_free_milli=tuple(free),
    )


def placement_delta(node: GpuNode, task: Task, mix: TaskMix, gpus: Sequence[int] | None = None) -> float:
    """How much placing the task (on ``gpus``, or the default ones) changes the node's fragmentation, milli-GPU:
    after minus before. The cluster's changes by the same, since no other node changes. Rounded to 1e-6 milli-GPU:
    the popularity-weighted sums carry float noise (+4.5e-13 for an exact 0), which scored a placement that changes
    nothing 49 instead of 50 and broke exact ties at random (the replay rounds the same way)."""
    return round(node_fragmentation(allocate(node, task, gpus), mix) - node_fragmentation(node, mix), 6)


def fgd_placement(node: GpuNode, task: Task, mix: TaskMix) -> Placement | None:
    """FGD's choice on one node: the GPUs whose placement grows the node's fragmentation least (for a share, the
    first such GPU); None when the task does not fit."""
    if not fits(node, task):
        return None
    base = node_fragmentation(node, mix)
    best: Placement | None = None
    for gpus in candidate_gpus(node, task):
        delta = round(node_fragmentation(allocate(node, task, gpus), mix) - base, 6)  # see placement_delta
        if best is None or delta < best.delta_milli:
            best = Placement(node.name, gpus, delta)
    return best


def fgd_score(delta_milli: float, max_score: int = 100) -> int:
    """The authors' scheduler score of a placement (``fgd_score.go``): ``sigmoid(-delta / 1000) * max_score``,
    truncated -- 50 for no change, higher when the placement shrinks fragmentation."""
    x = -delta_milli / GPU_MILLI
    sig = 1.0 / (1.0 + math.exp(-x)) if x >= -700 else 0.0
    return int(sig * max_score)


def move_delta(
    source: GpuNode,
    target: GpuNode,
    task: Task,
    source_gpus: Sequence[int],
    mix: TaskMix,
    target_gpus: Sequence[int] | None = None,
) -> float:
    """How much moving a task from ``source`` (where it holds ``source_gpus``) to ``target`` changes the cluster's
    fragmentation, milli-GPU (negative: the move defragments). Raises ValueError if it does not fit the target."""
    if source.name == target.name:
        raise ValueError("a move needs two different nodes")
    freed = release(source, task, source_gpus)
    placed = allocate(target, task, target_gpus)
    return (
        node_fragmentation(freed, mix)
        - node_fragmentation(source, mix)
        + node_fragmentation(placed, mix)
        - node_fragmentation(target, mix)
    )
