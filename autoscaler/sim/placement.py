"""Placement simulator under the FGD protocol (issue 15): the openb GPU-sharing trace replayed pod by pod onto its
1,213 GPU nodes by one of six scheduling policies, recording the GPU allocation ratio and the fragmentation at every
1 % of the workload arrived, as the FGD authors (Weng et al., USENIX ATC '23) published them.

The protocol, re-implemented from the authors' simulator ``hkust-adsl/kubernetes-scheduler-simulator`` @ 8f3d641
(the files are named where each rule is used below):

- **Cluster**: ``openb_node_list_gpu_node.csv`` (the trace's ``prepare_input.sh`` copies that node list).
- **Workload** (``pkg/simulator/core.go`` ``Simulate``, ``simulator.go`` ``SortClusterPods``, ``tuneUpPods``,
  ``tuneDownPods``; ``experiments/run_scripts/generate_run_scripts.py``): the pods, sorted by name, are **shuffled**
  with the seed (the published runs pass ``--shuffle-pod=true``, and the YAML the trace generates carries no creation
  time, so there is no creation order to keep; ``order="creation"`` replays by ``creation_time`` instead). Then the
  workload is tuned to 1.3 x the cluster's GPUs: while short, pods drawn uniformly from the original list are
  appended until the next one would pass the target (the authors test the next pod's *per-GPU* milli against the
  target but add its total, which we keep); when over (multigpu40/50), random pods are removed until under it.
  Pods never leave. Seeds 42-51.
- **Task mix** for the fragmentation measure (``pkg/utils/frag.go`` ``GetTypicalPods``; ``scripts/
  generate_config_and_run.py``: CPU-only pods included, popularity threshold 95 %, step 1): the original pods'
  distinct (CPU, GPU milli, GPU count, GPU types) weighted by count, the most popular covering 95 %.
- **Filter**: CPU and memory (kube-scheduler's ``NodeResourcesFit``), GPU type and GPUs (``open_gpu_share.go``
  ``Filter``). **Score** each feasible node with one policy (``pkg/simulator/plugin/*_score.go``; integer scores, as
  the scheduler framework truncates them), take the highest; ties go to the smallest node name, as the authors'
  kube-scheduler fork has it (``vendor/.../scheduler/core/generic_scheduler.go`` ``selectHost``), and node names
  carry a random prefix drawn once per run (``simulator.go`` ``syncClusterResourceList``): one fixed random order of
  the nodes per seed breaks every tie. (Uniform random ties instead -- upstream kube-scheduler -- cost FGD about 5.6
  points at 130 %, and GpuPacking and GpuClustering about 2.5: a fixed order packs.) **GPUs** (``open_gpu_share.go``
  ``allocateGpuId``): FGD's own choice for FGD; for Random a random GPU that holds the share; for the others the
  tightest GPU that holds it; whole GPUs are the first wholly free ones.
- **Recorded** after every pod (``pkg/simulator/analysis.go`` ``ClusterGpuFragReport``): GPU milli arrived (every pod
  tried, placed or not), allocated, and the cluster's fragmentation for the mix; binned to 0..130 % arrived and
  averaged per bin as ``experiments/analysis/merge_{alloc,frag,frag_ratio}_discrete.py`` do.

The policies (``POLICIES``): ``Random`` (``random_score.go``), ``DotProd`` (Tetris' dot product of the node's free
and the pod's request, CPU and total GPU, normalised by 128 CPUs and 8 GPUs; ``dot_product_score.go`` with
``merge``/``max``), ``GpuClustering`` (nodes already running pods of the same GPU shape first; ``gpu_clustering_
score.go``), ``GpuPacking`` (used GPUs, then used nodes, then free nodes; ``gpu_packing_score.go``), ``BestFit``
(least free CPU and GPU left after placing, min-max normalised over nodes; ``best_fit_score.go``) and ``FGD``
(``sigmoid(fragmentation decrease / 1000) * 100``; ``fgd_score.go``) -- the published six, ``FGD_POLICIES`` --
and this project's ``FGD+`` (``OURS``): ``autoscaler.core.placement_score`` (FGD's fragmentation change plus the
*fill* fragmentation -- the GPU a node would leave unused if filled with each typical task one after another, so
CPU, memory and per-GPU remainders count before they strand anything --, the mix's memory the median of each class,
gains quantised to 0.1 GPU, ties to the fixed node order), vectorised here (``_Fill``; ``ours_node_keys`` is the
same for any cluster state, and the tests hold it equal to the core's ``node_keys``). FGD's own exact (unrounded)
change with the same ties is a point *worse* than its integer sigmoid score on openb: the coarse score packs.

**Migrations** (``replay(..., migrations=Migrations(...))``, any policy): when a pod fits no node, the replay tries
to make room on one node by moving at most ``per_failure`` placed pods (default 2), never more than ``total`` (default
5 % of the pods submitted) in the run; every move is counted (``Replay.moves``, ``move_steps``). Plans, cheapest
first: one pod whose departure lets the failed pod fit (the smallest GPU request, then CPU; each moved pod goes where
the policy scores best among the other nodes that fit it); a GPU emptied of its 2..``per_failure`` pods; a **swap**
(two moves) that trades a pod on a node short of CPU or memory for a pod elsewhere with the same GPU request and
less CPU and memory, when the failed pod fits that node's GPUs. A plan that does not end with the failed pod placed
is rolled back. On openb almost all gain comes from swaps: once the cluster is full, the holes left are too small
for any moved share (``repack_estimate`` gives what perfect repacking of the placed shares could reach).

The fragmentation of a node is ``autoscaler.core.fragmentation.node_fragmentation``; this module keeps, per node
and task class, the counts it needs in numpy arrays and updates only the node a pod lands on, and keeps FGD's node
scores per request shape until the node changes, so a whole openb run takes about a second or two.

What the authors' Go runs had and this has not: Go's random streams (so single seeds differ; means over seeds are
what compares) and their floating-point summation order in the FGD score (only ever visible when a score sits on an
integer boundary).
"""

from __future__ import annotations

import bisect
import csv
import gzip
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from autoscaler.core.fragmentation import GPU_MILLI, GpuNode, Task, TaskMix, learn_task_mix, parse_gpu_types
from autoscaler.core.placement_score import QUANTUM_MILLI, typical_memory_mix

FGD_POLICIES = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD")
PUBLISHED_LABELS = {name: f"{i:02d}-{name}" for i, name in enumerate(FGD_POLICIES, start=1)}
OURS = "FGD+"
POLICIES = (*FGD_POLICIES, OURS)
WORKLOADS = (  # the 17 openb workloads of the published experiments (generate_run_scripts.py FILELIST)
    "openb_pod_list_default",
    "openb_pod_list_cpu050",
    "openb_pod_list_cpu100",
    "openb_pod_list_cpu200",
    "openb_pod_list_cpu250",
    "openb_pod_list_gpushare100",
    "openb_pod_list_gpushare40",
    "openb_pod_list_gpushare60",
    "openb_pod_list_gpushare80",
    "openb_pod_list_gpuspec10",
    "openb_pod_list_gpuspec20",
    "openb_pod_list_gpuspec25",
    "openb_pod_list_gpuspec33",
    "openb_pod_list_multigpu20",
    "openb_pod_list_multigpu30",
    "openb_pod_list_multigpu40",
    "openb_pod_list_multigpu50",
)
SEEDS = tuple(range(42, 52))
TUNE = 1.3
ARRIVED_PERCENTS = np.arange(0, 131)  # the published curves' columns: % of the cluster's GPUs requested so far
MIX_COVERAGE = 0.95

MAX_SPEC_CPU = 128_000  # the authors' normalisers (open-gpu-share/utils/const.go): the largest node's CPU, GPU
MAX_SPEC_GPU = 8_000
MAX_SCORE = 100
_MAX_GPU_TAG = 8  # GpuClustering's shapes: 0 = a share of a GPU, k = k whole GPUs (k <= 8 in openb)


def traces_dir() -> Path:
    """``$AUTOSCALER_TRACES`` or ``/work/shared/traces`` (where ``SOURCES.md`` records each file's provenance)."""
    return Path(os.environ.get("AUTOSCALER_TRACES", "/work/shared/traces"))


# --- inputs ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeTable:
    """Nodes at full capacity, one entry per node."""

    names: tuple[str, ...]
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    gpus: np.ndarray  # int64, GPUs per node
    gpu_type: tuple[str | None, ...]

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * GPU_MILLI

    @classmethod
    def of(cls, nodes: Sequence[GpuNode]) -> NodeTable:
        """Empty nodes from ``GpuNode`` records (their free resources taken as their capacity)."""
        for node in nodes:
            if any(free != GPU_MILLI for free in node.gpu_free_milli):
                raise ValueError(f"node {node.name}: a replay starts from empty nodes")
        return cls(
            tuple(n.name for n in nodes),
            np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            np.array([n.memory_mib for n in nodes], dtype=np.int64),
            np.array([len(n.gpu_free_milli) for n in nodes], dtype=np.int64),
            tuple(n.gpu_type for n in nodes),
        )


@dataclass(frozen=True)
class PodTable:
    """Pods' requests, one entry per pod (the openb pod list's columns, as the trace's YAML gives them)."""

    names: tuple[str, ...]
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64, per GPU; 0 for a pod asking for none
    gpu_count: np.ndarray  # int64
    gpu_types: tuple[frozenset[str] | None, ...]
    creation_time: np.ndarray | None = None  # float64 seconds, when the list has it

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> np.ndarray:
        total: np.ndarray = self.gpu_milli * self.gpu_count
        return total

    def task(self, i: int) -> Task:
        return Task(
            int(self.cpu_milli[i]),
            int(self.memory_mib[i]),
            int(self.gpu_milli[i]),
            int(self.gpu_count[i]),
            self.gpu_types[i],
        )

    @classmethod
    def of(cls, tasks: Sequence[Task], names: Sequence[str] | None = None) -> PodTable:
        return cls(
            tuple(names) if names is not None else tuple(f"pod-{i:05d}" for i in range(len(tasks))),
            np.array([t.cpu_milli for t in tasks], dtype=np.int64),
            np.array([t.memory_mib for t in tasks], dtype=np.int64),
            np.array([t.gpu_milli for t in tasks], dtype=np.int64),
            np.array([t.gpu_count for t in tasks], dtype=np.int64),
            tuple(t.gpu_types for t in tasks),
        )


def _read_csv(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _int(value: str | None) -> int:
    return 0 if value is None or value.strip() == "" else int(float(value))


@lru_cache(maxsize=4)
def load_openb_nodes(path: Path) -> NodeTable:
    """An openb node list (``sn,cpu_milli,memory_mib,gpu,model``)."""
    rows = _read_csv(path)
    return NodeTable(
        tuple(r["sn"] for r in rows),
        np.array([_int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        np.array([_int(r["memory_mib"]) for r in rows], dtype=np.int64),
        np.array([_int(r["gpu"]) for r in rows], dtype=np.int64),
        tuple((r.get("model") or "").strip() or None for r in rows),
    )


@lru_cache(maxsize=32)
def load_openb_pods(path: Path) -> PodTable:
    """An openb pod list, with the trace's own CSV-to-YAML rules (``pod_csv_to_yaml.py``): GPU milli clipped to
    1..1000 and set only for pods with ``num_gpu`` > 0, ``gpu_spec`` split on ``|``."""
    rows = _read_csv(path)
    count = np.array([_int(r["num_gpu"]) for r in rows], dtype=np.int64)
    raw_milli = np.array([_int(r.get("gpu_milli")) if "gpu_milli" in r else GPU_MILLI for r in rows], dtype=np.int64)
    milli = np.where(count > 0, np.clip(raw_milli, 0, GPU_MILLI), 0)
    count = np.where(milli > 0, count, 0)  # a GPU count with 0 milli asks for no GPU (the filter passes it)
    created = None
    if rows and "creation_time" in rows[0]:
        created = np.array([float(r["creation_time"] or "nan") for r in rows], dtype=np.float64)
    return PodTable(
        tuple(r["name"] for r in rows),
        np.array([_int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        np.array([_int(r["memory_mib"]) for r in rows], dtype=np.int64),
        milli,
        count,
        tuple(parse_gpu_types(r.get("gpu_spec")) if int(c) > 0 else None for r, c in zip(rows, count, strict=True)),
        created,
    )


def openb_paths(workload: str, traces: Path | None = None) -> tuple[Path, Path]:
    base = (traces or traces_dir()) / "alibaba-gpu-v2023-openb"
    return base / "openb_node_list_gpu_node.csv", base / f"{workload}.csv"


def openb_mix(pods: PodTable, coverage: float = MIX_COVERAGE) -> TaskMix:
    """The authors' typical pods of a workload: its pods' (CPU, GPU, types) without memory (their ``PodResource``
    has none), CPU-only pods included, the most popular covering ``coverage``."""
    tasks = [
        Task(int(pods.cpu_milli[i]), 0, int(pods.gpu_milli[i]), int(pods.gpu_count[i]), pods.gpu_types[i])
        for i in range(len(pods))
    ]
    return learn_task_mix(tasks, coverage=coverage, include_cpu_only=True)


def tuned_workload(
    pods: PodTable, cluster_gpu_milli: int, rng: np.random.Generator, tune: float = TUNE, order: str = "shuffle"
) -> np.ndarray:
    """The indices of the pods to submit, in submission order: the authors' ``SortClusterPods`` (shuffled, or by
    creation time) then ``TunePodsByNodeTotalResource`` to ``tune`` x the cluster's GPU milli."""
    n = len(pods)
    by_name = np.array(sorted(range(n), key=lambda i: pods.names[i]), dtype=np.int64)
    if order == "shuffle":
        sequence = by_name.copy()
        rng.shuffle(sequence)
    elif order == "creation":
        created = pods.creation_time if pods.creation_time is not None else np.zeros(n)
        sequence = by_name[np.argsort(created[by_name], kind="stable")]
    elif order == "name":
        sequence = by_name.copy()
    else:
        raise ValueError(f"order must be shuffle, creation or name, not {order!r}")
    if tune <= 0:
        return sequence
    per_pod = pods.total_gpu_milli
    total = int(per_pod[sequence].sum())
    target = tune * cluster_gpu_milli
    if total > target:  # tuneDownPods: drop random pods until under the target
        keep = list(sequence)
        while total > target and keep:
            j = int(rng.integers(len(keep)))
            total -= int(per_pod[keep.pop(j)])
        return np.array(keep, dtype=np.int64)
    if total <= 0:
        # as the authors' TunePodsByNodeTotalResource (it panics): no clone adds GPU demand, the loop never ends
        raise ValueError("the workload asks for no GPU: it cannot be tuned to a share of the cluster's GPUs")
    extra: list[int] = []
    while total < target:  # tuneUpPods: clones of random original pods until the next would pass the target
        j = int(by_name[int(rng.integers(n))])
        if total + int(pods.gpu_milli[j]) > target:
            break
        total += int(per_pod[j])
        extra.append(j)
    return np.concatenate([sequence, np.array(extra, dtype=np.int64)])


# --- the replay ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curves:
    """Per % of the workload arrived (``ARRIVED_PERCENTS``): GPU allocation ratio (%), fragmentation amount (% of the
    cluster's GPUs) and fragmentation ratio (% of the free GPU); NaN where no pod arrived in the bin."""

    alloc: np.ndarray
    frag_amount: np.ndarray
    frag_ratio: np.ndarray


@dataclass(frozen=True)
class Replay:
    """One replay: one entry per pod submitted, after that pod was placed (or failed)."""

    policy: str
    seed: int
    cluster_gpu_milli: int
    arrived_milli: np.ndarray  # cumulative GPU milli requested
    allocated_milli: np.ndarray
    frag_milli: np.ndarray  # the cluster's fragmentation for the mix
    free_milli: np.ndarray
    placed: np.ndarray  # bool, per pod
    nodes: np.ndarray  # node index per pod, -1 when it failed
    gpu_left: np.ndarray  # final free milli-GPU, per node and GPU slot (0 on slots the node does not have)
    cpu_left: np.ndarray  # final free CPU (milli), per node
    memory_left: np.ndarray  # final free memory (MiB), per node
    moves: int = 0  # migrations made (each: one placed pod moved to another node)
    move_steps: np.ndarray | None = None  # per migration, the step (submitted pod) whose failure it served
    order: np.ndarray | None = None  # the pod (index into the pod table) submitted at each step

    @property
    def failed(self) -> int:
        return int((~self.placed).sum())

    @property
    def final_allocation(self) -> float:
        return float(self.allocated_milli[-1]) / self.cluster_gpu_milli if len(self.allocated_milli) else 0.0

    def curves(self) -> Curves:
        return discretise(self)

    def final_nodes(self, nodes: NodeTable) -> list[GpuNode]:
        """The cluster at the end of the replay, as ``GpuNode`` records (free resources)."""
        return [
            GpuNode(
                nodes.names[i],
                int(self.cpu_left[i]),
                int(self.memory_left[i]),
                nodes.gpu_type[i],
                tuple(int(x) for x in self.gpu_left[i, : int(nodes.gpus[i])]),
            )
            for i in range(len(nodes))
        ]


def repack_estimate(result: Replay, pods: PodTable) -> float:
    """An estimate of what repacking could reach for the pods a run placed, as a GPU allocation ratio (%): the
    shares of a GPU it placed packed best-fit decreasing onto as few GPUs as that takes, every other GPU busy with
    whole-GPU work, CPU and memory ignored (optimistic). The GPU left free then is the shares' own leftovers -- an
    0.81 share leaves 0.19 that only the few pods asking for 0.19 or less can use. Migrations that move pods but
    place the same ones cannot beat it by much; only placing *other* pods could."""
    if result.order is None:
        raise ValueError("the replay did not record its submission order")
    placed = result.order[result.placed]
    milli = pods.gpu_milli[placed]
    shares = np.sort(milli[(milli > 0) & (milli < GPU_MILLI)])[::-1]
    rooms: list[int] = []  # the GPUs' free milli, sorted ascending
    for share in shares.tolist():
        k = bisect.bisect_left(rooms, share)
        room = rooms.pop(k) - share if k < len(rooms) else GPU_MILLI - share
        bisect.insort(rooms, room)
    waste = sum(rooms)
    return 100.0 * (result.cluster_gpu_milli - waste) / result.cluster_gpu_milli


def discretise(replay: Replay) -> Curves:
    """The per-pod records binned as the authors' ``merge_*_discrete.py``: a pod's bin is its arrived ratio rounded
    to a whole %; a bin's value is the mean of its pods' (the neighbouring +-1 % when it has none)."""
    gpus = replay.cluster_gpu_milli / GPU_MILLI
    arrived = np.round(replay.arrived_milli / gpus / 10)
    alloc = np.round(replay.allocated_milli / gpus / 10, 2)
    frag = np.round(replay.frag_milli, 2)  # the log prints both with 2 decimals
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.round(100 * replay.frag_milli / replay.free_milli, 2)
    out = np.full((3, len(ARRIVED_PERCENTS)), np.nan)
    for col, pct in enumerate(ARRIVED_PERCENTS):
        sel = arrived == pct
        if not sel.any():
            sel = (arrived >= pct - 1) & (arrived <= pct + 1)
            if not sel.any():
                continue
        out[0, col] = round(float(alloc[sel].mean()), 2)
        out[1, col] = round(100 * float(frag[sel].mean()) / 1000 / gpus, 2)
        # a step with no free GPU has no ratio (Go logs NaN for 0/0); pandas' mean, as the merge script takes it,
        # skips it instead of blanking the bin
        ratios = ratio[sel][~np.isnan(ratio[sel])]
        out[2, col] = float(ratios.mean()) if len(ratios) else math.nan
    return Curves(out[0], out[1], out[2])


class _Cluster:
    """The replay's state in numpy arrays, and the per-node, per-task-class counts the fragmentation needs."""

    def __init__(
        self, nodes: NodeTable, mix: TaskMix, pod_types: Sequence[frozenset[str] | None], rank: np.ndarray
    ) -> None:
        self.n = len(nodes)
        self.table, self.pod_types, self.mix = nodes, pod_types, mix
        self.rank = rank  # the nodes' tie-break order (lower first)
        self.slots = max(1, int(nodes.gpus.max()) if self.n else 1)
        self.cpu = nodes.cpu_milli.astype(np.int64).copy()
        self.mem = nodes.memory_mib.astype(np.int64).copy()
        self.ngpus = nodes.gpus.astype(np.int64).copy()
        self.gpu_left = np.where(np.arange(self.slots)[None, :] < self.ngpus[:, None], GPU_MILLI, 0).astype(np.int64)
        self.total = self.gpu_left.sum(axis=1)
        self.tags = np.zeros((self.n, _MAX_GPU_TAG + 1), dtype=np.int64)
        self.version = np.zeros(self.n, dtype=np.int64)  # bumped whenever a pod lands on the node
        self.fgd_cache: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.lower = np.tril(np.ones((self.slots, self.slots), dtype=bool), k=-1)  # [g, h]: h < g
        # GPU types: node type ids, and per constraint which types it accepts (the last column: no GPU type)
        type_names = sorted({t for t in nodes.gpu_type if t is not None})
        type_id = {name: i for i, name in enumerate(type_names)}
        self.node_type = np.array(
            [type_id[t] if t is not None else len(type_names) for t in nodes.gpu_type], dtype=np.int64
        )
        constraints = {t for t in pod_types if t is not None} | {
            c.task.gpu_types for c in mix.classes if c.task.gpu_types is not None
        }
        self.constraint_id: dict[frozenset[str] | None, int] = {None: 0}
        access = [np.ones(len(type_names) + 1, dtype=bool)]  # no constraint: any type, even none
        for constraint in sorted(constraints, key=sorted):
            self.constraint_id[constraint] = len(access)
            access.append(np.array([name in constraint for name in type_names] + [False], dtype=bool))
        self.access = np.array(access)  # [constraint, type]
        self.type_names = type_names
        # the mix, one column per task class
        pops = mix.popularities()
        self.m = len(pops)
        self.m_cpu = np.array([t.cpu_milli for t, _ in pops], dtype=np.int64)
        self.m_mem = np.array([t.memory_mib for t, _ in pops], dtype=np.int64)
        self.m_milli = np.array([t.gpu_milli for t, _ in pops], dtype=np.int64)
        self.m_count = np.array([t.gpu_count for t, _ in pops], dtype=np.int64)
        self.m_w = np.array([p for _, p in pops], dtype=np.float64)
        self.m_gpu = self.m_count > 0
        self.m_access = self.access[[self.constraint_id[t.gpu_types] for t, _ in pops]].T  # [type, class]
        self.cnt, self.q3 = self._counts(self.gpu_left)
        self.frag_cls = self._fragments(self.cpu, self.mem, self.cnt, self.q3, self.total, self.node_type)
        self.frag = self.frag_cls @ self.m_w
        self.fill: _Fill | None = None

    def access_row(self, constraint: frozenset[str] | None) -> np.ndarray:
        """Which node GPU types (the ``node_type`` ids) a constraint accepts, also one no pod of the replay names."""
        if constraint is None or constraint in self.constraint_id:
            row: np.ndarray = self.access[self.constraint_id[constraint]]
            return row
        return np.array([name in constraint for name in self.type_names] + [False], dtype=bool)

    def _counts(self, left: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per node and class: GPUs that hold the class's share, and free milli on the GPUs that do not."""
        big = left[:, :, None] >= self.m_milli[None, None, :]
        cnt = big.sum(axis=1)
        q3 = np.where(big, 0, left[:, :, None]).sum(axis=1)
        return cnt, q3

    def _fragments(
        self, cpu: np.ndarray, mem: np.ndarray, cnt: np.ndarray, q3: np.ndarray, total: np.ndarray, types: np.ndarray
    ) -> np.ndarray:
        """Per node (row) and class: ``F_n(m)`` (``fragmentation.task_fragment_milli``), milli-GPU."""
        sat = (
            self.m_gpu[None, :]
            & self.m_access[types]
            & (cpu[:, None] >= self.m_cpu[None, :])
            & (mem[:, None] >= self.m_mem[None, :])
            & (cnt >= self.m_count[None, :])
        )
        return np.where(sat, q3, total[:, None]).astype(np.float64)

    def refresh(self, i: int) -> None:
        cnt, q3 = self._counts(self.gpu_left[i : i + 1])
        self.cnt[i], self.q3[i] = cnt[0], q3[0]
        self.total[i] = self.gpu_left[i].sum()
        row = self._fragments(
            self.cpu[i : i + 1], self.mem[i : i + 1], cnt, q3, self.total[i : i + 1], self.node_type[i : i + 1]
        )
        self.frag_cls[i] = row[0]
        self.frag[i] = row[0] @ self.m_w
        if self.fill is not None:
            self.fill.refresh(self, i)

    def feasible(self, cpu: int, mem: int, milli: int, count: int, constraint: int) -> np.ndarray:
        ok = (self.cpu >= cpu) & (self.mem >= mem)
        if count > 0:
            ok &= self.access[constraint][self.node_type]
            ok &= (self.gpu_left >= milli).sum(axis=1) >= count
        return np.flatnonzero(ok)

    def place(self, i: int, cpu: int, mem: int, milli: int, gpus: Sequence[int], count: int) -> None:
        self.cpu[i] -= cpu
        self.mem[i] -= mem
        for g in gpus:
            self.gpu_left[i, g] -= milli
        if count > 0:
            self.tags[i, _gpu_tag(milli, count)] += 1
        self.version[i] += 1
        self.refresh(i)
        if self.fill is not None and self.fill.fgd is not self:
            self.fill.fgd.place(i, cpu, mem, milli, gpus, count)

    def unplace(self, i: int, cpu: int, mem: int, milli: int, gpus: Sequence[int], count: int) -> None:
        """The inverse of ``place``: a pod leaves node ``i`` (a migration's first half)."""
        self.cpu[i] += cpu
        self.mem[i] += mem
        for g in gpus:
            self.gpu_left[i, g] += milli
        if count > 0:
            self.tags[i, _gpu_tag(milli, count)] -= 1
        self.version[i] += 1
        self.refresh(i)
        if self.fill is not None and self.fill.fgd is not self:
            self.fill.fgd.unplace(i, cpu, mem, milli, gpus, count)


class _Fill:
    """This project's scorer's state (``OURS``): per node and task class of its mix, the class's tasks the node's GPUs
    could still hold one after another (``units``: per GPU ``free // share``, summed; divided by the class's GPU
    count), and the fill fragmentation ``free - k * demand`` with ``k`` the tasks that fit GPUs, CPU and memory."""

    def __init__(self, c: _Cluster, mix: TaskMix) -> None:
        # FGD's part of the gain, for this mix: the cluster's own arrays when the mixes agree, else a shadow cluster
        # kept in step with it (a replay starts from empty nodes)
        self.fgd = c if mix == c.mix else _Cluster(c.table, mix, c.pod_types, c.rank)
        pops = mix.popularities()
        self.m_cpu = np.array([t.cpu_milli for t, _ in pops], dtype=np.int64)
        self.m_mem = np.array([t.memory_mib for t, _ in pops], dtype=np.int64)
        self.m_milli = np.array([t.gpu_milli for t, _ in pops], dtype=np.int64)
        self.m_count = np.array([t.gpu_count for t, _ in pops], dtype=np.int64)
        self.m_w = np.array([p for _, p in pops], dtype=np.float64)
        self.m_gpu = self.m_count > 0
        rows = [c.access_row(t.gpu_types) for t, _ in pops]
        self.m_access = np.array(rows, dtype=bool).reshape(len(pops), c.access.shape[1]).T  # [type, class]
        self.safe_milli = np.maximum(self.m_milli, 1)
        self.safe_count = np.maximum(self.m_count, 1)
        self.demand = self.m_milli * self.m_count
        self.big = np.iinfo(np.int64).max // 4
        self.units = self.count_units(c.gpu_left)
        self.frag_cls = self.fragments(c.cpu, c.mem, self.units, c.total, c.node_type)
        self.cache: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def count_units(self, left: np.ndarray) -> np.ndarray:
        units: np.ndarray = (left[:, :, None] // self.safe_milli[None, None, :]).sum(axis=1)
        return units

    def fragments(
        self, cpu: np.ndarray, mem: np.ndarray, units: np.ndarray, total: np.ndarray, types: np.ndarray
    ) -> np.ndarray:
        k = units // self.safe_count[None, :]
        k = np.minimum(k, np.where(self.m_cpu > 0, cpu[:, None] // np.maximum(self.m_cpu, 1)[None, :], self.big))
        k = np.minimum(k, np.where(self.m_mem > 0, mem[:, None] // np.maximum(self.m_mem, 1)[None, :], self.big))
        usable = np.where(self.m_gpu[None, :] & self.m_access[types], k * self.demand[None, :], 0)
        out: np.ndarray = (total[:, None] - usable).astype(np.float64)
        return out

    def refresh(self, c: _Cluster, i: int) -> None:
        self.units[i] = self.count_units(c.gpu_left[i : i + 1])[0]
        self.frag_cls[i] = self.fragments(
            c.cpu[i : i + 1], c.mem[i : i + 1], self.units[i : i + 1], c.total[i : i + 1], c.node_type[i : i + 1]
        )[0]

    def scores(
        self, c: _Cluster, nodes: np.ndarray, cpu: int, mem: int, milli: int, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the best decrease of the fill fragmentation over its GPU choices, and that GPU for a share."""
        left = c.gpu_left[nodes]
        if 0 < milli < GPU_MILLI:
            dup = ((left[:, :, None] == left[:, None, :]) & c.lower[None]).any(axis=2)
            rows, gpus = np.nonzero((left >= milli) & ~dup)
            cand = nodes[rows]
            before = left[rows, gpus][:, None]
            after = before - milli
            units = self.units[cand] - before // self.safe_milli[None, :] + after // self.safe_milli[None, :]
            total = c.total[cand] - milli
        else:
            rows = np.arange(len(nodes))
            gpus = np.full(len(nodes), -1, dtype=np.int64)
            cand = nodes
            units = self.units[cand] - count * (GPU_MILLI // self.safe_milli)[None, :]
            total = c.total[cand] - milli * count
        after_frag = self.fragments(c.cpu[cand] - cpu, c.mem[cand] - mem, units, total, c.node_type[cand])
        decrease = ((self.frag_cls[cand] - after_frag) * self.m_w[None, :]).sum(axis=1)
        g = self.fgd
        if 0 < milli < GPU_MILLI:  # FGD's own change, as ``_fgd_scores`` computes it
            cls_milli = g.m_milli[None, :]
            cnt = g.cnt[cand] - (before >= cls_milli) + (after >= cls_milli)
            q3 = g.q3[cand] - np.where(before < cls_milli, before, 0) + np.where(after < cls_milli, after, 0)
        else:
            cnt = g.cnt[cand] - count * g.m_gpu[None, :]
            q3 = g.q3[cand]
        fgd_after = g._fragments(c.cpu[cand] - cpu, c.mem[cand] - mem, cnt, q3, total, c.node_type[cand])
        decrease = decrease + ((g.frag_cls[cand] - fgd_after) * g.m_w[None, :]).sum(axis=1)
        decrease = np.floor(np.round(decrease, 6) / QUANTUM_MILLI)  # ``placement_score.quantise``
        if len(rows) == len(nodes):
            return decrease, gpus
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        top = np.maximum.reduceat(decrease, starts)
        owner = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(rows)]))
        first = np.flatnonzero(decrease == top[owner])
        _, pick = np.unique(owner[first], return_index=True)
        return top, gpus[first[pick]]


def ours_node_keys(nodes: Sequence[GpuNode], task: Task, mix: TaskMix) -> list[int | None]:
    """The replay's vectorised ``FGD+`` keys for one task on nodes in any state (free resources as given): what
    ``autoscaler.core.placement_score.node_keys`` computes one node at a time (the tests hold them equal)."""
    table = NodeTable(
        tuple(n.name for n in nodes),
        np.array([n.cpu_milli for n in nodes], dtype=np.int64),
        np.array([n.memory_mib for n in nodes], dtype=np.int64),
        np.array([len(n.gpu_free_milli) for n in nodes], dtype=np.int64),
        tuple(n.gpu_type for n in nodes),
    )
    c = _Cluster(table, mix, [task.gpu_types], np.arange(len(nodes)))
    for i, node in enumerate(nodes):
        c.gpu_left[i, : len(node.gpu_free_milli)] = node.gpu_free_milli
    c.cnt, c.q3 = c._counts(c.gpu_left)
    c.total = c.gpu_left.sum(axis=1)
    c.frag_cls = c._fragments(c.cpu, c.mem, c.cnt, c.q3, c.total, c.node_type)
    c.frag = c.frag_cls @ c.m_w
    c.fill = _Fill(c, mix)
    feas = c.feasible(task.cpu_milli, task.memory_mib, task.gpu_milli, task.gpu_count, c.constraint_id[task.gpu_types])
    out: list[int | None] = [None] * len(nodes)
    if len(feas):
        keys, _ = c.fill.scores(c, feas, task.cpu_milli, task.memory_mib, task.gpu_milli, task.gpu_count)
        for i, key in zip(feas.tolist(), keys.tolist(), strict=True):
            out[i] = int(key)
    return out


def _choose_ours(c: _Cluster, feas: np.ndarray, cpu: int, mem: int, milli: int, count: int) -> tuple[int, list[int]]:
    fill = c.fill
    assert fill is not None
    key = (cpu, mem, milli, count)
    if key not in fill.cache:
        fill.cache[key] = (np.full(c.n, -1, dtype=np.int64), np.zeros(c.n), np.zeros(c.n, dtype=np.int64))
    seen, best, gpu = fill.cache[key]
    stale = feas[seen[feas] != c.version[feas]]
    if len(stale):
        best[stale], gpu[stale] = fill.scores(c, stale, cpu, mem, milli, count)
        seen[stale] = c.version[stale]
    i = int(feas[_select(best[feas], c.rank[feas])])
    if count == 0:
        return i, []
    return i, [int(gpu[i])] if 0 < milli < GPU_MILLI else _whole_gpus(c.gpu_left[i], count)


def _gpu_tag(milli: int, count: int) -> int:
    """GpuClustering's shape of a GPU pod (``GetGpuAffinityFromPodAnnotation``): 0 for a share, k for k GPUs."""
    return 0 if milli < GPU_MILLI else min(count, _MAX_GPU_TAG)


def _whole_gpus(left: np.ndarray, count: int) -> list[int]:
    """``AllocateExclusiveGpuId``: the first ``count`` wholly free GPUs."""
    return [int(g) for g in np.flatnonzero(left == GPU_MILLI)[:count]]


def _tightest_gpu(left: np.ndarray, milli: int) -> int:
    """``allocateGpuIdBasedOnBestFit`` for a share: the GPU with the least free that holds it (the first such)."""
    return int(np.argmin(np.where(left >= milli, left, GPU_MILLI + 1)))


def _select(scores: np.ndarray, rank: np.ndarray) -> int:
    """The authors' ``selectHost`` (their kube-scheduler fork, ``vendor/k8s.io/kubernetes/pkg/scheduler/core/
    generic_scheduler.go``): the highest score, ties to the smallest node name -- and the names carry a random
    prefix drawn once per run (``syncClusterResourceList``), so ties go to one fixed random order of the nodes.
    ``rank`` is that order for the candidates. Returns a position."""
    best = np.flatnonzero(scores == scores.max())
    return int(best[0]) if len(best) == 1 else int(best[np.argmin(rank[best])])


def _sigmoid_score(decrease: np.ndarray) -> np.ndarray:
    x = np.round(decrease, 6) / GPU_MILLI  # exact ties stay exact (no summation noise around 0)
    return (1.0 / (1.0 + np.exp(-x)) * MAX_SCORE).astype(np.int64)


def _choose(
    policy: str,
    c: _Cluster,
    feas: np.ndarray,
    cpu: int,
    mem: int,
    milli: int,
    count: int,
    rng: np.random.Generator,
) -> tuple[int, list[int]]:
    """One policy's node and GPUs for a pod among the feasible nodes ``feas``."""
    share = 0 < milli < GPU_MILLI

    def default_gpus(i: int) -> list[int]:
        if count == 0:
            return []
        return [_tightest_gpu(c.gpu_left[i], milli)] if share else _whole_gpus(c.gpu_left[i], count)

    if policy == "Random":
        i = int(feas[int(rng.integers(len(feas)))])
        if share:  # allocateGpuIdBasedOnRandomFit: a uniformly random GPU that holds the share
            holders = np.flatnonzero(c.gpu_left[i] >= milli)
            return i, [int(holders[int(rng.integers(len(holders)))])]
        return i, default_gpus(i)

    if policy == "DotProd":  # dot_product_score.go, merge + max normalisation, "best" GPU selection
        dot = (c.cpu[feas] / MAX_SPEC_CPU) * (cpu / MAX_SPEC_CPU) + (c.total[feas] / MAX_SPEC_GPU) * (
            milli * count / MAX_SPEC_GPU
        )
        scores = (MAX_SCORE * (1 - dot / 2)).astype(np.int64)
    elif policy == "BestFit":  # best_fit_score.go, then NormalizeScore (min-max to 0..100)
        raw = (c.cpu[feas] - cpu) / MAX_SPEC_CPU * 0.5 + (c.total[feas] - milli * count) / MAX_SPEC_GPU * 0.5
        scores = ((1.0 - raw) * MAX_SCORE).astype(np.int64)
        low, high = int(scores.min()), int(scores.max())
        scores = np.zeros_like(scores) if high == low else (scores - low) * MAX_SCORE // (high - low)
    elif policy == "GpuPacking":  # gpu_packing_score.go
        if count == 0:
            scores = np.zeros(len(feas), dtype=np.int64)
        else:
            left = c.gpu_left[feas]
            whole_free = (left == GPU_MILLI).sum(axis=1)
            all_free = whole_free == c.ngpus[feas]
            if share:
                tightest = np.where(left >= milli, left, GPU_MILLI + 1).min(axis=1)
                used_gpu = np.maximum(MAX_SCORE - (tightest * 100 // GPU_MILLI) // 10, MAX_SCORE // 2)
                partial = np.where(tightest == GPU_MILLI, max(MAX_SCORE // 2 - 1, MAX_SCORE // 3), used_gpu)
            else:
                partial = np.full(len(feas), max(MAX_SCORE // 2 - count, MAX_SCORE // 3), dtype=np.int64)
            scores = np.where(all_free, np.maximum(MAX_SCORE // 3 - whole_free, whole_free), partial)
    elif policy == "GpuClustering":  # gpu_clustering_score.go
        if count == 0:
            scores = np.zeros(len(feas), dtype=np.int64)
        else:
            base = (MAX_SCORE // 4) * (MAX_SPEC_GPU - c.total[feas]) // MAX_SPEC_GPU
            tags = c.tags[feas]
            kinds = (tags > 0).sum(axis=1)
            same = tags[:, _gpu_tag(milli, count)] > 0
            quarter = MAX_SCORE // 4
            scores = np.where(
                same,
                np.where(kinds == 1, base + MAX_SCORE * 3 // 4, base + MAX_SCORE * 2 // 4),
                np.where(kinds == 0, base + quarter, base),
            )
    elif policy == "FGD":
        return _choose_fgd(c, feas, cpu, mem, milli, count)
    elif policy == OURS:
        return _choose_ours(c, feas, cpu, mem, milli, count)
    else:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    i = int(feas[_select(scores, c.rank[feas])])
    return i, default_gpus(i)


def _fgd_scores(
    c: _Cluster, nodes: np.ndarray, cpu: int, mem: int, milli: int, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """``fgd_score.go`` on the given (feasible) nodes: per candidate GPU choice, the node's fragmentation before
    minus after, through a sigmoid. A share tries each GPU that holds it (the first of equal scores wins); whole GPUs
    take the first free ones. Returns each node's best score and, for a share, its GPU."""
    left = c.gpu_left[nodes]
    if 0 < milli < GPU_MILLI:
        dup = ((left[:, :, None] == left[:, None, :]) & c.lower[None]).any(axis=2)
        rows, gpus = np.nonzero((left >= milli) & ~dup)  # equal free GPUs on a node give equal scores: one each
        cand = nodes[rows]
        before = left[rows, gpus][:, None]
        after = before - milli
        cls_milli = c.m_milli[None, :]
        cnt = c.cnt[cand] - (before >= cls_milli) + (after >= cls_milli)
        q3 = c.q3[cand] - np.where(before < cls_milli, before, 0) + np.where(after < cls_milli, after, 0)
        total = c.total[cand] - milli
    else:
        rows = np.arange(len(nodes))
        gpus = np.full(len(nodes), -1, dtype=np.int64)
        cand = nodes
        cnt = c.cnt[cand] - count * c.m_gpu[None, :]  # whole GPUs: every GPU class loses `count` holders
        q3 = c.q3[cand]
        total = c.total[cand] - milli * count
    frag_after = c._fragments(c.cpu[cand] - cpu, c.mem[cand] - mem, cnt, q3, total, c.node_type[cand])
    decrease = ((c.frag_cls[cand] - frag_after) * c.m_w[None, :]).sum(axis=1)
    scores = _sigmoid_score(decrease)
    if len(rows) == len(nodes):  # one candidate per node
        return scores, gpus
    # per node, the first candidate with its top score (candidates come in node, GPU order)
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    top = np.maximum.reduceat(scores, starts)
    owner = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(rows)]))
    first = np.flatnonzero(scores == top[owner])
    _, pick = np.unique(owner[first], return_index=True)
    return top, gpus[first[pick]]


def _choose_fgd(c: _Cluster, feas: np.ndarray, cpu: int, mem: int, milli: int, count: int) -> tuple[int, list[int]]:
    """FGD's node and GPUs. A node's score for a request changes only when a pod lands on that node, so scores are
    kept per request shape and recomputed only on the nodes changed since that shape was last scored."""
    key = (cpu, mem, milli, count)
    if key not in c.fgd_cache:
        c.fgd_cache[key] = (
            np.full(c.n, -1, dtype=np.int64),
            np.zeros(c.n, dtype=np.int64),
            np.zeros(c.n, dtype=np.int64),
        )
    seen, best, gpu = c.fgd_cache[key]
    stale = feas[seen[feas] != c.version[feas]]
    if len(stale):
        best[stale], gpu[stale] = _fgd_scores(c, stale, cpu, mem, milli, count)
        seen[stale] = c.version[stale]
    i = int(feas[_select(best[feas], c.rank[feas])])
    if count == 0:
        return i, []
    return i, [int(gpu[i])] if 0 < milli < GPU_MILLI else _whole_gpus(c.gpu_left[i], count)


@dataclass(frozen=True)
class Migrations:
    """The bound on migrations in a replay: at most ``per_failure`` pods moved to place one pod that fits nowhere,
    and at most ``total`` moves in the whole run (None: ``per_pod_arrived`` x the pods submitted)."""

    per_failure: int = 2
    total: int | None = None
    per_pod_arrived: float = 0.05
    tries: int = 12  # plans tried per failed pod, then as many swaps (each rolled back if it does not place the pod)

    def budget(self, pods_submitted: int) -> int:
        return self.total if self.total is not None else int(self.per_pod_arrived * pods_submitted)


class _Residents:
    """Who runs where during a replay, for migrations: per submitted pod its request, node (-1: not placed) and
    GPUs; per node the set of its pods; per GPU the number of pods on it."""

    def __init__(self, c: _Cluster, pods: PodTable, order: np.ndarray) -> None:
        self.cpu = pods.cpu_milli[order].astype(np.int64)
        self.mem = pods.memory_mib[order].astype(np.int64)
        self.milli = pods.gpu_milli[order].astype(np.int64)
        self.count = pods.gpu_count[order].astype(np.int64)
        self.constraint = np.array([c.constraint_id[pods.gpu_types[p]] for p in order.tolist()], dtype=np.int64)
        self.node = np.full(len(order), -1, dtype=np.int64)
        self.gpu0 = np.full(len(order), -1, dtype=np.int64)
        self.gpus: list[list[int]] = [[] for _ in range(len(order))]
        self.on_node: list[set[int]] = [set() for _ in range(c.n)]
        self.nres = np.zeros((c.n, c.slots), dtype=np.int64)

    def add(self, step: int, i: int, gpus: Sequence[int]) -> None:
        self.node[step] = i
        self.gpus[step] = list(gpus)
        self.gpu0[step] = gpus[0] if gpus else -1
        self.on_node[i].add(step)
        for g in gpus:
            self.nres[i, g] += 1

    def remove(self, step: int) -> tuple[int, list[int]]:
        i, gpus = int(self.node[step]), self.gpus[step]
        self.on_node[i].discard(step)
        for g in gpus:
            self.nres[i, g] -= 1
        self.node[step] = -1
        return i, gpus


def _place_pod(c: _Cluster, res: _Residents, step: int, policy: str, feas: np.ndarray, rng: np.random.Generator) -> int:
    cpu, mem, milli, count = int(res.cpu[step]), int(res.mem[step]), int(res.milli[step]), int(res.count[step])
    i, gpus = _choose(policy, c, feas, cpu, mem, milli, count, rng)
    c.place(i, cpu, mem, milli, gpus, count)
    res.add(step, i, gpus)
    return i


def _lift(c: _Cluster, res: _Residents, step: int) -> tuple[int, list[int]]:
    i, gpus = res.remove(step)
    c.unplace(i, int(res.cpu[step]), int(res.mem[step]), int(res.milli[step]), gpus, int(res.count[step]))
    return i, gpus


def _put_back(c: _Cluster, res: _Residents, step: int, i: int, gpus: list[int]) -> None:
    c.place(i, int(res.cpu[step]), int(res.mem[step]), int(res.milli[step]), gpus, int(res.count[step]))
    res.add(step, i, gpus)


class _MoveCheck:
    """Whether a placed pod could move: its request fits a node other than its own as the cluster stands. One
    feasibility test per distinct request, at most ``limit`` tests per failed pod (the search's cost bound)."""

    def __init__(self, c: _Cluster, res: _Residents, constraint_ids: Sequence[int], limit: int) -> None:
        self.c, self.res, self.constraint_ids, self.left = c, res, constraint_ids, limit
        self.feasible: dict[tuple[int, int, int, int, int], np.ndarray | None] = {}

    def __call__(self, q: int) -> bool:
        res = self.res
        key = (int(res.cpu[q]), int(res.mem[q]), int(res.milli[q]), int(res.count[q]), self.constraint_ids[q])
        if key not in self.feasible:
            if self.left <= 0:
                return False
            self.left -= 1
            self.feasible[key] = self.c.feasible(*key)
        feas = self.feasible[key]
        return feas is not None and bool((feas != res.node[q]).any())


def _plans(
    c: _Cluster, res: _Residents, step: int, constraint_ids: Sequence[int], limit: int, tries: int
) -> list[tuple[int, ...]]:
    """Candidate sets of placed pods whose departure from one node would let the failed pod ``step`` fit there,
    cheapest first: one pod (the smallest GPU demand, then CPU), then whole GPUs emptied of up to ``limit`` pods."""
    cpu, mem, milli, count = int(res.cpu[step]), int(res.mem[step]), int(res.milli[step]), int(res.count[step])
    constraint = constraint_ids[step]
    placed = np.flatnonzero(res.node >= 0)
    n = res.node[placed]
    ok = (c.cpu[n] + res.cpu[placed] >= cpu) & (c.mem[n] + res.mem[placed] >= mem)
    share_q = (res.milli[placed] > 0) & (res.milli[placed] < GPU_MILLI)
    whole_q = res.milli[placed] == GPU_MILLI
    if count > 0:
        ok &= c.access[constraint][c.node_type[n]] & (c.ngpus[n] >= count)
        left_q = np.where(share_q, c.gpu_left[n, np.maximum(res.gpu0[placed], 0)] + res.milli[placed], 0)
        if milli < GPU_MILLI:
            ok &= ((c.gpu_left[n] >= milli).any(axis=1)) | (left_q >= milli) | whole_q
        else:
            whole_after = (c.gpu_left[n] == GPU_MILLI).sum(axis=1) + np.where(
                whole_q, res.count[placed], (left_q == GPU_MILLI).astype(np.int64)
            )
            ok &= whole_after >= count
    ok &= ~(
        (res.milli[placed] == milli)
        & (res.count[placed] == count)
        & (res.cpu[placed] >= cpu)
        & (res.mem[placed] >= mem)
        & (res.constraint[placed] == constraint)
    )  # a pod at least as large as the failed one (same GPU request and types) fits nowhere else either
    movable = _MoveCheck(c, res, constraint_ids, limit=2 * tries)
    single = placed[ok]
    cost = res.milli[single] * res.count[single] * 10**7 + res.cpu[single]
    by_cost = np.argsort(cost, kind="stable")
    single, cost = single[by_cost], cost[by_cost]
    plans: list[tuple[int, ...]] = []
    if len(single):
        # one feasibility test per distinct request, the cheapest requests first, at most 2 x tries of them
        keys = np.stack(
            [res.cpu[single], res.mem[single], res.milli[single], res.count[single], res.constraint[single]], axis=1
        )
        shapes, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        n_feas = np.zeros(len(shapes), dtype=np.int64)
        only = np.full(len(shapes), -1, dtype=np.int64)
        for u in np.argsort(first, kind="stable")[: 2 * tries].tolist():
            feas = c.feasible(*(int(x) for x in shapes[u]))
            n_feas[u] = len(feas)
            only[u] = int(feas[0]) if len(feas) else -1
        can = (n_feas[inverse] > 1) | ((n_feas[inverse] == 1) & (only[inverse] != res.node[single]))
        plans = [(int(q),) for q in single[can][:tries]]
    if limit >= 2 and count <= 1 and len(plans) < tries:
        # empty one GPU of its 2..limit pods (a GPU shared by small pods, for a whole GPU or a large share)
        need_cpu = np.maximum(cpu - c.cpu, 0)
        cand = (res.nres >= 2) & (res.nres <= limit)
        if count > 0:
            cand &= c.access[constraint][c.node_type][:, None]
        nodes_g, gpus_g = np.nonzero(cand)
        order = np.argsort(res.nres[nodes_g, gpus_g] * 10**6 + (GPU_MILLI - c.gpu_left[nodes_g, gpus_g]), kind="stable")
        for k in order[: 4 * tries]:
            i, g = int(nodes_g[k]), int(gpus_g[k])
            members = tuple(sorted(q for q in res.on_node[i] if g in res.gpus[q]))
            if (
                sum(int(res.cpu[q]) for q in members) < need_cpu[i]
                or any(res.count[q] > 1 for q in members)
                or not all(movable(q) for q in members)
            ):
                continue
            plans.append(members)
            if len(plans) >= tries:
                break
    return plans


def _migrate_for(
    c: _Cluster,
    res: _Residents,
    step: int,
    constraint_ids: Sequence[int],
    constraint: int,
    policy: str,
    limit: int,
    tries: int,
    rng: np.random.Generator,
) -> list[int] | None:
    """Try to place the failed pod ``step`` by moving at most ``limit`` placed pods off one node, each to the node
    the policy scores best among the others where it fits. Returns the moved pods' steps (the failed pod placed), or
    None with the cluster unchanged."""
    cpu, mem, milli, count = int(res.cpu[step]), int(res.mem[step]), int(res.milli[step]), int(res.count[step])
    for plan in _plans(c, res, step, constraint_ids, limit, tries):
        if len(plan) > limit:
            continue
        source = int(res.node[plan[0]])
        done: list[tuple[int, int, list[int]]] = []  # (moved pod, its old node, its old GPUs)
        lifted = [(q, *_lift(c, res, q)) for q in plan]
        good = True
        for q, _, _ in lifted:
            feas = c.feasible(int(res.cpu[q]), int(res.mem[q]), int(res.milli[q]), int(res.count[q]), constraint_ids[q])
            feas = feas[feas != source]
            if not len(feas):
                good = False
                break
            _place_pod(c, res, q, policy, feas, rng)
            done.append((q, source, []))
        if good:
            here = c.feasible(cpu, mem, milli, count, constraint)
            good = bool((here == source).any())
        if good:
            _place_pod(c, res, step, policy, np.array([source]), rng)
            return [q for q, _, _ in lifted]
        for q, _, _ in done:  # roll back: the moved pods to their old GPUs
            _lift(c, res, q)
        for q, i, gpus in lifted:
            _put_back(c, res, q, i, gpus)
    if limit >= 2:
        for a, b in _swaps(c, res, step, tries):
            n, a_gpus = _lift(c, res, a)
            m, b_gpus = _lift(c, res, b)
            _put_back(c, res, b, n, a_gpus)
            _put_back(c, res, a, m, b_gpus)
            if (c.feasible(cpu, mem, milli, count, constraint) == n).any():
                _place_pod(c, res, step, policy, np.array([n]), rng)
                return [a, b]
            _lift(c, res, a)
            _lift(c, res, b)
            _put_back(c, res, a, n, a_gpus)
            _put_back(c, res, b, m, b_gpus)
    return None


SWAP_NODES = 8  # nodes short of CPU or memory tried per failed pod (the least short first)
SWAP_PODS = 16  # pods on each tried for a swap (the most CPU first)


def _swaps(c: _Cluster, res: _Residents, step: int, tries: int) -> list[tuple[int, int]]:
    """Swaps (two moves) for a failed pod that fits some node's GPUs but not its CPU or memory: a pod ``a`` there
    trades places with a pod ``b`` of the same GPU request that needs less CPU and memory, whose node can take
    ``a`` in turn. Each swap keeps both nodes' GPUs as they were; it moves CPU and memory to where they are free."""
    cpu, mem, milli, count = int(res.cpu[step]), int(res.mem[step]), int(res.milli[step]), int(res.count[step])
    constraint = int(res.constraint[step])
    gpu_ok = (c.gpu_left >= milli).sum(axis=1) >= count
    short = gpu_ok & c.access[constraint][c.node_type] & ((c.cpu < cpu) | (c.mem < mem))
    nodes = np.flatnonzero(short)
    if not len(nodes):
        return []
    deficit = np.maximum(cpu - c.cpu[nodes], 0) * 1_000 + np.maximum(mem - c.mem[nodes], 0)
    placed = np.flatnonzero((res.node >= 0) & (res.count > 0))
    b_node = res.node[placed]
    out: list[tuple[int, int]] = []
    for n in nodes[np.argsort(deficit, kind="stable")][:SWAP_NODES].tolist():
        dc, dm = max(cpu - int(c.cpu[n]), 0), max(mem - int(c.mem[n]), 0)
        for a in sorted(res.on_node[n], key=lambda q: -int(res.cpu[q]))[:SWAP_PODS]:
            if res.count[a] == 0 or res.cpu[a] < dc or res.mem[a] < dm:
                continue
            ok = (
                (res.milli[placed] == res.milli[a])
                & (res.count[placed] == res.count[a])
                & (b_node != n)
                & (res.cpu[placed] <= res.cpu[a] - dc)
                & (res.mem[placed] <= res.mem[a] - dm)
                & (c.cpu[b_node] + res.cpu[placed] >= res.cpu[a])
                & (c.mem[b_node] + res.mem[placed] >= res.mem[a])
                & c.access[res.constraint[a]][c.node_type[b_node]]
                & c.access[res.constraint[placed], c.node_type[n]]
            )
            found = placed[ok]
            if len(found):
                out.append((a, int(found[0])))
                if len(out) >= tries:
                    return out
    return out


def replay(
    nodes: NodeTable,
    pods: PodTable,
    policy: str,
    seed: int,
    mix: TaskMix | None = None,
    sequence: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
    ours_mix: TaskMix | None = None,
    migrations: Migrations | None = None,
) -> Replay:
    """Replay ``pods`` (in ``sequence`` order, default as listed) onto empty ``nodes`` with one policy. ``mix`` is
    the fragmentation's task mix (default: learnt from the pods, memory included). Deterministic for a seed."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    rng = rng if rng is not None else np.random.default_rng(seed)
    order = np.arange(len(pods)) if sequence is None else np.asarray(sequence, dtype=np.int64)
    if mix is None:
        mix = learn_task_mix([pods.task(i) for i in range(len(pods))], coverage=MIX_COVERAGE)
    # the random name prefixes, in the name order of the nodes (``syncClusterResourceList``)
    by_name = np.array(sorted(range(len(nodes)), key=lambda i: nodes.names[i]), dtype=np.int64)
    rank = np.empty(len(nodes), dtype=np.int64)
    rank[by_name] = rng.permutation(len(nodes))
    c = _Cluster(nodes, mix, pods.gpu_types, rank)
    if policy == OURS:
        c.fill = _Fill(c, ours_mix if ours_mix is not None else mix)
    steps = len(order)
    arrived = np.zeros(steps, dtype=np.int64)
    allocated = np.zeros(steps, dtype=np.int64)
    frag = np.zeros(steps)
    free = np.zeros(steps, dtype=np.int64)
    placed = np.zeros(steps, dtype=bool)
    where = np.full(steps, -1, dtype=np.int64)
    capacity = nodes.total_gpu_milli
    arrived_total = used_total = 0
    constraint_ids = [c.constraint_id[t] for t in pods.gpu_types]
    res = _Residents(c, pods, order) if migrations is not None else None
    step_constraints = [constraint_ids[p] for p in order]
    budget = migrations.budget(steps) if migrations is not None else 0
    move_steps: list[int] = []
    for step, p in enumerate(order):
        cpu, mem = int(pods.cpu_milli[p]), int(pods.memory_mib[p])
        milli, count = int(pods.gpu_milli[p]), int(pods.gpu_count[p])
        arrived_total += milli * count
        feas = c.feasible(cpu, mem, milli, count, constraint_ids[p])
        if len(feas):
            i, gpus = _choose(policy, c, feas, cpu, mem, milli, count, rng)
            c.place(i, cpu, mem, milli, gpus, count)
            if res is not None:
                res.add(step, i, gpus)
            used_total += milli * count
            placed[step], where[step] = True, i
        elif res is not None and migrations is not None and len(move_steps) < budget and count > 0:
            limit = min(migrations.per_failure, budget - len(move_steps))
            moved = _migrate_for(
                c, res, step, step_constraints, step_constraints[step], policy, limit, migrations.tries, rng
            )
            if moved is not None:
                move_steps.extend([step] * len(moved))
                used_total += milli * count
                placed[step] = True
        arrived[step], allocated[step] = arrived_total, used_total
        frag[step] = c.frag.sum()
        free[step] = capacity - used_total
    if res is not None:
        where = np.where(placed, res.node, -1)
    return Replay(
        policy,
        seed,
        capacity,
        arrived,
        allocated,
        frag,
        free,
        placed,
        where,
        c.gpu_left.copy(),
        c.cpu.copy(),
        c.mem.copy(),
        len(move_steps),
        np.array(move_steps, dtype=np.int64),
        order,
    )


def run_openb(
    workload: str = "openb_pod_list_default",
    policy: str = "FGD",
    seed: int = 42,
    traces: Path | None = None,
    tune: float = TUNE,
    order: str = "shuffle",
    migrations: Migrations | None = None,
) -> Replay:
    """One run of the published protocol: the workload tuned to ``tune`` x the cluster's GPUs with the seed, then
    replayed with the policy (the same seed drives the policy's random choices), with ``migrations`` if given."""
    node_path, pod_path = openb_paths(workload, traces)
    nodes, pods = load_openb_nodes(node_path), load_openb_pods(pod_path)
    rng = np.random.default_rng(seed)
    sequence = tuned_workload(pods, nodes.total_gpu_milli, rng, tune, order)
    mix = openb_mix(pods)
    ours_mix = typical_memory_mix(mix, (pods.task(i) for i in range(len(pods)))) if policy == OURS else None
    return replay(
        nodes, pods, policy, seed, mix=mix, sequence=sequence, rng=rng, ours_mix=ours_mix, migrations=migrations
    )


# --- the published results -------------------------------------------------------------------------------------------

_RESULT_FILES = {
    "alloc": "analysis_allo_discrete.csv.gz",
    "frag_amount": "analysis_frag_discrete.csv.gz",
    "frag_ratio": "analysis_frag_ratio_discrete.csv.gz",
}


@lru_cache(maxsize=8)
def _published(path: Path) -> Mapping[tuple[str, str, int], np.ndarray]:
    out: dict[tuple[str, str, int], np.ndarray] = {}
    for row in _read_csv(path):
        values = np.array([float(row[str(p)]) if row.get(str(p), "") != "" else np.nan for p in ARRIVED_PERCENTS])
        out[(row["workload"], row["sc_policy"], int(row["seed"]))] = values
    return out


def published_curves(metric: str = "alloc", traces: Path | None = None) -> Mapping[tuple[str, str, int], np.ndarray]:
    """The FGD authors' published curves (``fgd-atc23-expected-results``): ``{(workload, policy, seed): values per %
    arrived}``, policy as in ``POLICIES``; ``metric`` is ``alloc``, ``frag_amount`` or ``frag_ratio``."""
    path = (traces or traces_dir()) / "fgd-atc23-expected-results" / _RESULT_FILES[metric]
    labels = {label: name for name, label in PUBLISHED_LABELS.items()}
    return {(w, labels.get(p, p), s): v for (w, p, s), v in _published(path).items()}


def published_mean(
    workload: str, policy: str, metric: str = "alloc", seeds: Iterable[int] = SEEDS, traces: Path | None = None
) -> np.ndarray:
    curves = published_curves(metric, traces)
    mean: np.ndarray = np.nanmean(np.array([curves[(workload, policy, s)] for s in seeds]), axis=0)
    return mean


def mean_abs_deviation(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Mean absolute difference over the % arrived where both curves have a value, in points."""
    both = ~(np.isnan(ours) | np.isnan(theirs))
    return float(np.abs(ours[both] - theirs[both]).mean()) if both.any() else math.nan
