"""A simulated cluster of nodes, GPUs, pods and gangs, behind the controller's own ports.

``SimCluster`` implements ``ClusterReader`` (``snapshot``), ``ClusterWriter`` (scale, evict, suspend, events) and
``NodePoolScaler`` (``node_count``, ``scale``), so that the simulator can drive the controller's tick through the
same ports as a real cluster (issue 11). Time moves only when the simulator calls ``advance(now)``.

What it models, as Kubernetes does it:

- **Placement**: the scheduler's filter (node ready and schedulable, GPU type, enough free ``nvidia.com/gpu`` on one
  node) then score (``LeastAllocated``, the default, or ``MostAllocated`` to bin-pack GPUs, or ``Fragmentation``:
  ``LeastAllocated`` plus this project's scheduler extender at its shipped weight -- FGD's score for the task mix of
  the live pods, spread to 0..10, x 10 x 5 -- from the scheduler's own up-to-date view), ties by node name;
  pending pods are placed in priority order, then by creation time, each tick of the simulator.
- **Pod start** = scheduling + image pull + model load: a pod is ready ``cold_start_s`` after it is bound to a node
  (the Deployment's measured cold start), never before.
- **Deployments**: scaling creates pending pods or deletes pods in the ReplicaSet controller's order (unscheduled
  first, then not ready, then doubled up on a node with more of its replicas, then the latest ready, the newest);
  an evicted pod of a Deployment is replaced by a new pending one.
- **Training jobs** (``SimJob``, a batch Job of ``pods`` pods under a gang scheduler such as Kueue or Volcano):
  admitted at their submit time, placed all pods at once or not at all, training once every pod has started
  (``restart_s``: image pull + checkpoint load); a checkpoint every ``checkpoint_s`` of work. Suspending the Job,
  evicting any of its pods or losing a node under one stops the whole gang, which loses its work since the last
  checkpoint (an evicted worker fails the job: the rest of the gang's work is lost too). A suspended Job waits until
  it is resumed; an evicted or failed one is recreated by its controller at once (pending, lower priority).
- **Scheduler preemption** (``preemption=True``, the kube-scheduler's DefaultPreemption): a pending pod that fits
  nowhere evicts lower-priority pods on one node, pod by pod, by the published criteria (fewest victims breaking a
  PodDisruptionBudget, then the lowest highest-priority victim, then the smallest sum of priorities, then the fewest
  victims, then the most recently started, by when they were bound), with no notion of gangs or checkpoints.
- **PodDisruptionBudgets** (``add_pdb``, selecting pods by label: a Deployment's replicas carry ``app=<name>``): the
  Eviction API (``evict_pod``) refuses the eviction of a ready pod when the budget allows no disruption now
  (healthy = ready matching pods, as the disruption controller counts them); a pod not ready goes while the budget
  is met, a Pending one whatever the budget, as the API server decides. The scheduler's preemption honours them as
  best effort (it prefers victims that break no budget, but evicts through them when it must); node removal ignores
  them, as a deleted node does.
- **Node pools**: a scale-up adds nodes that hold no pods until they have booted (``boot_s``); a scale-down removes
  the node it names (a Machine marked for deletion), then the emptiest nodes, all at once, and their pods go back to
  pending (Deployments) or are lost (training).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from autoscaler.core.cluster import (
    DELETION_COST_BY_US,
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodDisruptionBudgetInfo,
    PodInfo,
    WorkloadInfo,
    replica_removal_order,
)
from autoscaler.core.extender import MAX_EXTENDER_PRIORITY, fgd_scores_per_node, spread
from autoscaler.core.fragmentation import GPU_MILLI, GpuNode, Task, TaskMix, learn_task_mix
from autoscaler.core.rebalance import REBALANCE_LABEL
from autoscaler.core.victims import TrainingRules
from autoscaler.ports import (
    ChangedSinceRead,
    EvictionOutcome,
    PortError,
    WriteGuard,
    WriteOutcome,
    refuse_pool_size_changed,
)

PREEMPTIBLE_LABEL = TrainingRules().non_preemptible_label
APP_LABEL = "app"  # a Deployment's replicas carry app=<deployment name> (what a PodDisruptionBudget selects)


class Scoring(StrEnum):
    LEAST_ALLOCATED = "LeastAllocated"  # the default scheduler: spread
    MOST_ALLOCATED = "MostAllocated"  # bin-pack GPUs, keeps whole nodes free
    # the default scheduler (LeastAllocated) plus this project's scheduler extender (deploy/overlays/
    # scheduler-extender): FGD's score of each node for the live pods' task mix, 0..10, x 10 x its weight
    FRAGMENTATION = "Fragmentation"


#: The shipped KubeSchedulerConfiguration's weight of the extender (deploy/overlays/scheduler-extender).
EXTENDER_WEIGHT = 5
# DefaultPreemption adds this to every victim's priority before summing them (pickOneNodeForPreemption).
_PRIORITY_OFFSET = 2**31
# Unbounded CPU and memory: the simulated nodes have GPUs only (as the extender's view of a snapshot).
_HOST = 1 << 40


@dataclass(slots=True)
class SimNode:
    name: str
    gpus: int
    gpu_product: str | None = None
    pool: str | None = None
    ready_at: float = 0.0  # booted from then on

    def ready(self, now: float) -> bool:
        return now >= self.ready_at


@dataclass(slots=True)
class SimPod:
    namespace: str
    name: str
    gpus: int
    priority: int
    created_at: float
    cold_start_s: float
    owner: str | None = None  # "namespace/deployment" for replicas
    gang: str | None = None
    gpu_product: str | None = None  # node selector on the GPU type; None = any
    node: str | None = None
    ready_at: float | None = None  # set when bound
    bound_at: float | None = None  # when the scheduler bound it (its cold start runs from here)
    # controller.kubernetes.io/pod-deletion-cost and who set it (``PodInfo.deletion_cost``, ``deletion_cost_by``):
    # the ReplicaSet's scale-down reads the cost (``_reconcile``)
    deletion_cost: int = 0
    deletion_cost_by: str | None = None

    def ready(self, now: float) -> bool:
        return self.ready_at is not None and now >= self.ready_at


@dataclass(slots=True)
class SimJob:
    """A training job (a batch Job under a gang scheduler). Times are seconds; work is seconds of the whole gang."""

    namespace: str
    name: str
    pods: int
    gpus_per_pod: int
    priority: int
    work_s: float  # training time the job needs with its whole gang running
    checkpoint_s: float  # a checkpoint every this many seconds of work
    submit_at: float  # Unix seconds
    min_runtime_s: float = 600.0
    preemptible: bool = True
    restart_s: float = 60.0  # pod bound to training: image pull + checkpoint load
    gpu_product: str | None = None
    rebalance_allowed: bool = False  # its pods carry gpuautoscaler.dev/rebalance=allowed
    # state
    admitted: bool = False  # its pods exist (pending or bound)
    progress_s: float = 0.0
    checkpoint_progress_s: float = 0.0
    checkpoint_at: float | None = None  # when the last checkpoint of the current run was written
    updated_at: float = 0.0
    suspended_at: float | None = None  # suspended by the controller since then
    finished_at: float | None = None
    stops: int = 0  # preemptions, evictions and node losses that stopped the gang
    lost_gpu_s: float = 0.0

    @property
    def gang(self) -> str:
        return f"job/{self.namespace}/{self.name}"

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(slots=True)
class SimDeployment:
    namespace: str
    name: str
    replicas: int
    gpus_per_replica: int = 1
    cold_start_s: float = 90.0
    priority: int = 1000
    gpu_product: str | None = None


@dataclass(slots=True)
class SimPdb:
    """A PodDisruptionBudget: ``min_available`` or ``max_unavailable`` pods of those its selector matches."""

    namespace: str
    name: str
    selector: dict[str, str]
    min_available: int | None = None
    max_unavailable: int | None = None


@dataclass(slots=True)
class SimPool:
    name: str
    gpus_per_node: int
    gpu_product: str | None
    boot_s: float
    min_nodes: int = 0
    max_nodes: int = 1000
    nodes: list[str] = field(default_factory=list)
    next_index: int = 0


class SimCluster:
    """The simulated cluster; every write is recorded in ``writes`` as (time, op, args)."""

    def __init__(self, scoring: Scoring = Scoring.LEAST_ALLOCATED, now: float = 0.0, preemption: bool = False) -> None:
        self.scoring = scoring
        self.preemption = preemption
        self.now = now
        self.jobs: dict[str, SimJob] = {}  # by gang id
        # Pools whose nodes carry a taint only inference tolerates (the burst pools: training never lands there)
        self.inference_only_pools: set[str] = set()
        self.scheduler_preemptions = 0  # pods the scheduler evicted
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[tuple[str, str], SimPod] = {}
        self.deployments: dict[str, SimDeployment] = {}
        self.pools: dict[str, SimPool] = {}
        self.pdbs: list[SimPdb] = []
        self.evictions_blocked = 0  # evictions refused by a PodDisruptionBudget (the API server's 429)
        self.writes: list[tuple[float, str, tuple[object, ...]]] = []
        self.events: list[tuple[float, str, str, str, str, str, str]] = []
        self.lost_training_gpu_s = 0.0
        self._serial = 0
        # What the snapshot and the counts were computed from: nothing changes until a write, a binding, a pod
        # turning ready or a node finishing its boot (``_next_change``), so most simulator steps reuse them.
        self._dirty = True
        self._next_change = math.inf
        self._snapshot: ClusterSnapshot | None = None
        self._pod_infos: dict[tuple[str, str], tuple[SimPod, tuple[object, ...], PodInfo]] = {}
        self._counts: dict[str, tuple[int, int, int]] = {}
        self._training_gpus = 0
        self._node_gpus = 0
        self._mix: TaskMix | None = None  # the extender's task mix of this scheduling pass (Fragmentation scoring)
        self.generation = 0  # bumped whenever the cluster's state (what a snapshot shows but its time) may change

    # ---- building -------------------------------------------------------------------------------------------------

    def add_node(self, name: str, gpus: int, gpu_product: str | None = None, pool: str | None = None) -> SimNode:
        node = SimNode(name, gpus, gpu_product, pool, self.now)
        self.nodes[name] = node
        self._dirty = True
        return node

    def add_pool(self, pool: SimPool, nodes: int = 0) -> None:
        self.pools[pool.name] = pool
        for _ in range(nodes):
            self._new_pool_node(pool, ready_at=self.now)

    def add_deployment(self, deployment: SimDeployment, warm: bool = False) -> None:
        """Add a Deployment; ``warm``: the replicas that are placed now are already serving (a simulation's initial
        state), the others wait for GPUs like any new pod."""
        key = f"{deployment.namespace}/{deployment.name}"
        self.deployments[key] = deployment
        self._reconcile(deployment)
        if warm:
            for pod in self.pods.values():
                if pod.owner == key and pod.node is not None:
                    # created one cold start before the run and ready at its start: created_at == ready_at read
                    # as a 0 s cold start, and the controller then forecast for now + 0 (and held no scale-down over
                    # a cold start) until the first replica it made itself came up
                    pod.created_at, pod.ready_at = self.now - pod.cold_start_s, self.now
                    pod.bound_at = pod.created_at
            self._dirty = True

    def add_training_pod(
        self, namespace: str, name: str, gpus: int, priority: int, gang: str | None = None, node: str | None = None
    ) -> SimPod:
        pod = SimPod(namespace, name, gpus, priority, self.now, 0.0, gang=gang)
        if node is not None:
            if self.free_gpus(node) < gpus:
                raise ValueError(f"node {node} has {self.free_gpus(node)} free GPUs, {name} needs {gpus}")
            pod.node, pod.ready_at, pod.bound_at = node, self.now, self.now
        self.pods[(namespace, name)] = pod
        self._dirty = True
        return pod

    def place_pod(self, namespace: str, name: str, node: str, ready: bool = True) -> None:
        """Put a pod on ``node`` as an initial state (where an earlier scheduler left it), ready or starting."""
        pod = self.pods[(namespace, name)]
        if pod.node != node and self.free_gpus(node) < pod.gpus:
            raise ValueError(f"node {node} has {self.free_gpus(node)} free GPUs, {name} needs {pod.gpus}")
        pod.node = node
        pod.ready_at = self.now if ready else self.now + pod.cold_start_s
        pod.bound_at = self.now - pod.cold_start_s if ready else self.now
        self._dirty = True

    def add_pdb(self, pdb: SimPdb) -> None:
        """A PodDisruptionBudget; the Eviction API refuses an eviction that would break it (``evict_pod``)."""
        if (pdb.min_available is None) == (pdb.max_unavailable is None):
            raise ValueError(f"PodDisruptionBudget {pdb.namespace}/{pdb.name}: one of minAvailable, maxUnavailable")
        self.pdbs.append(pdb)
        self._dirty = True

    def add_job(self, job: SimJob) -> None:
        """A training job, admitted (its pods created) once the clock reaches ``submit_at``."""
        if job.gang in self.jobs:
            raise ValueError(f"job {job.namespace}/{job.name} exists")
        job.updated_at = max(job.submit_at, self.now)
        self.jobs[job.gang] = job
        self._dirty = True

    def _admit(self, job: SimJob) -> None:
        job.admitted = True
        job.checkpoint_at = None
        job.updated_at = self.now
        for index in range(job.pods):
            pod = SimPod(
                job.namespace, f"{job.name}-{job.stops}-{index}", job.gpus_per_pod, job.priority, self.now,
                job.restart_s, gang=job.gang, gpu_product=job.gpu_product,
            )
            self.pods[(pod.namespace, pod.name)] = pod
        self._dirty = True

    def _job_pods(self, job: SimJob) -> list[SimPod]:
        return [p for p in self.pods.values() if p.gang == job.gang]

    def _training_since(self, job: SimJob) -> float | None:
        """When the whole gang started training (every pod bound and started), or None."""
        pods = self._job_pods(job)
        if len(pods) < job.pods or any(p.ready_at is None for p in pods):
            return None
        return max(p.ready_at for p in pods if p.ready_at is not None)

    def _run_jobs(self, now: float) -> None:
        """Progress, checkpoints, completion and admission of the training jobs up to ``now``."""
        for job in self.jobs.values():
            if job.finished_at is not None:
                continue
            if not job.admitted:
                if job.suspended_at is None and job.submit_at <= now:
                    self._admit(job)
                continue
            self._accrue(job, now)

    def _accrue(self, job: SimJob, now: float) -> None:
        """The job's training since it was last updated, its checkpoints, and its completion."""
        since = self._training_since(job)
        if since is None:
            job.updated_at = now
            return
        start = max(job.updated_at, since)
        if now > start:
            before = job.progress_s
            job.progress_s = min(job.work_s, before + (now - start))
            if job.progress_s >= job.work_s:
                job.finished_at = start + (job.work_s - before)
                job.admitted = False
                for pod in self._job_pods(job):
                    del self.pods[(pod.namespace, pod.name)]
                self._dirty = True
            else:
                reached = math.floor(job.progress_s / job.checkpoint_s) * job.checkpoint_s
                if reached > job.checkpoint_progress_s:
                    job.checkpoint_progress_s = reached
                    job.checkpoint_at = start + (reached - before)
                    self._dirty = True  # the snapshot shows the new checkpoint
        job.updated_at = now

    def _stop_job(self, job: SimJob) -> None:
        """The gang stops: every pod goes, the work since the last checkpoint is lost."""
        self._accrue(job, self.now)
        if job.finished_at is not None:
            return
        lost = (job.progress_s - job.checkpoint_progress_s) * job.gpus
        job.lost_gpu_s += lost
        self.lost_training_gpu_s += lost
        job.progress_s = job.checkpoint_progress_s
        job.stops += 1
        job.admitted = False
        for pod in self._job_pods(job):
            del self.pods[(pod.namespace, pod.name)]
        self._dirty = True

    def _job_event_times(self, now: float) -> float:
        """The next time a job is admitted, checkpoints or finishes (the snapshot changes then)."""
        soonest = math.inf
        for job in self.jobs.values():
            if job.finished_at is not None:
                continue
            if not job.admitted:
                if job.suspended_at is None and job.submit_at > now:
                    soonest = min(soonest, job.submit_at)
                continue
            since = self._training_since(job)
            if since is None:
                continue
            base = max(since, job.updated_at)
            left = job.work_s - job.progress_s
            to_checkpoint = (math.floor(job.progress_s / job.checkpoint_s) + 1) * job.checkpoint_s - job.progress_s
            soonest = min(soonest, base + min(left, to_checkpoint))
        return soonest

    def training_gpu_seconds(self) -> tuple[float, float]:
        """(useful GPU-seconds of training kept, GPU-seconds of training lost to stops) so far."""
        # Progress is brought up to date lazily (at a write, a checkpoint, a pod ready...): bring every running gang's
        # up to now, or the work since the cluster last changed would be missing.
        for job in self.jobs.values():
            if job.admitted and job.finished_at is None:
                self._accrue(job, self.now)
        kept = sum(job.progress_s * job.gpus for job in self.jobs.values())
        return kept, self.lost_training_gpu_s

    # ---- time -----------------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Move the clock to ``now`` and place the pending pods that fit."""
        if now < self.now:
            raise ValueError(f"time goes forward: {now} < {self.now}")
        self.now = now
        if self._dirty or now >= self._next_change:
            if self.jobs:
                self._run_jobs(now)
            self.schedule()
            if self.jobs:
                self._run_jobs(now)  # a gang bound just now starts its clock now
            self._recount()

    def _recount(self) -> None:
        """Recompute the cached snapshot and counts, and when they next go out of date by time alone."""
        now = self.now
        counts: dict[str, list[int]] = {key: [0, 0, 0] for key in self.deployments}
        next_change = math.inf
        training = 0
        for pod in self.pods.values():
            ready_at = pod.ready_at
            if ready_at is not None and ready_at > now:
                next_change = min(next_change, ready_at)
            if pod.owner is None:
                if pod.node is not None:
                    training += pod.gpus
                continue
            entry = counts.get(pod.owner)
            if entry is None:
                continue
            if pod.node is None:
                entry[2] += 1
            else:
                entry[1] += 1
                if ready_at is not None and ready_at <= now:
                    entry[0] += 1
        for node in self.nodes.values():
            if node.ready_at > now:
                next_change = min(next_change, node.ready_at)
        if self.jobs:
            next_change = min(next_change, self._job_event_times(now))
        self._counts = {key: (c[0], c[1], c[2]) for key, c in counts.items()}
        self._training_gpus = training
        self._node_gpus = sum(node.gpus for node in self.nodes.values())
        self._next_change = next_change
        self._snapshot = None
        self._dirty = False
        self.generation += 1

    def counts(self, now: float) -> dict[str, tuple[int, int, int]]:
        """Per Deployment ``namespace/name``: (ready pods, pods bound to a node, pending pods) at ``now``."""
        self.advance(now)
        return self._counts

    def gpu_use(self, now: float) -> tuple[int, int]:
        """(GPUs held by training and other non-Deployment pods, GPUs of every node, booting ones included)."""
        self.advance(now)
        return self._training_gpus, self._node_gpus

    def nodes_per_pool(self) -> dict[str, int]:
        """Nodes of each pool, booting ones included (what a cloud bills)."""
        return {name: len(pool.nodes) for name, pool in self.pools.items()}

    def free_gpus(self, node: str) -> int:
        used = sum(p.gpus for p in self.pods.values() if p.node == node)
        return self.nodes[node].gpus - used

    def schedule(self) -> None:
        pending = sorted(
            (p for p in self.pods.values() if p.node is None), key=lambda p: (-p.priority, p.created_at, p.name)
        )
        if not pending:
            return
        free = {name: node.gpus for name, node in self.nodes.items()}
        for bound in self.pods.values():
            if bound.node is not None:
                free[bound.node] -= bound.gpus
        done: set[str] = set()
        self._mix = self._task_mix() if self.scoring is Scoring.FRAGMENTATION else None
        for pod in pending:
            if pod.node is not None:
                continue
            if pod.gang is not None and pod.gang in self.jobs:
                if pod.gang not in done:
                    done.add(pod.gang)
                    self._place_gang(self.jobs[pod.gang], free)
                continue
            best = self._best_node(pod, free)
            if best is None and self.preemption:
                best = self._preempt_for(pod, free)
            if best is None or pod.node is not None or (pod.namespace, pod.name) not in self.pods:
                continue
            self._bind(pod, best, free)

    def _fits_on(self, node: SimNode, pod: SimPod, free: dict[str, int]) -> bool:
        return (
            node.ready(self.now)
            and free[node.name] >= pod.gpus
            and (pod.gpu_product is None or node.gpu_product == pod.gpu_product)
            and (pod.owner is not None or node.pool not in self.inference_only_pools)
        )

    def _best_node(self, pod: SimPod, free: dict[str, int]) -> SimNode | None:
        fits = [node for node in self.nodes.values() if self._fits_on(node, pod, free)]
        if not fits:
            return None
        if self.scoring is Scoring.FRAGMENTATION and pod.gpus > 0:
            extender = self._extender_scores(pod, fits, free)
            return max(
                zip(fits, extender, strict=True),
                key=lambda pair: (
                    self._score(pair[0], free[pair[0].name], pod.gpus) * 100.0 + pair[1] * 10 * EXTENDER_WEIGHT,
                    _desc(pair[0].name),
                ),
            )[0]
        return max(fits, key=lambda n: (self._score(n, free[n.name], pod.gpus), _desc(n.name)))

    def _task_mix(self) -> TaskMix:
        """The extender's task mix: a task per live GPU pod (bound or pending), by its GPU request and type."""
        tasks = [
            Task(0, 0, GPU_MILLI, p.gpus, None if p.gpu_product is None else frozenset({p.gpu_product}))
            for p in self.pods.values()
            if p.gpus > 0
        ]
        return learn_task_mix(tasks, include_cpu_only=False)

    def _extender_scores(self, pod: SimPod, nodes: list[SimNode], free: dict[str, int]) -> list[int]:
        """The extender's ``prioritize`` for ``pod`` over the fitting ``nodes``: 0..MAX_EXTENDER_PRIORITY each."""
        task = Task(0, 0, GPU_MILLI, pod.gpus, None if pod.gpu_product is None else frozenset({pod.gpu_product}))
        mix = self._mix if self._mix is not None and self._mix.classes else TaskMix.of([(task, 1.0)])
        views = [
            GpuNode(n.name, _HOST, _HOST, n.gpu_product, (GPU_MILLI,) * free[n.name] + (0,) * (n.gpus - free[n.name]))
            for n in nodes
        ]
        scores = spread(fgd_scores_per_node(views, task, mix))
        assert all(0 <= s <= MAX_EXTENDER_PRIORITY for s in scores)
        return scores

    def _bind(self, pod: SimPod, node: SimNode, free: dict[str, int]) -> None:
        pod.node = node.name
        pod.ready_at = self.now + pod.cold_start_s
        pod.bound_at = self.now
        free[node.name] -= pod.gpus
        self._dirty = True

    def _place_gang(self, job: SimJob, free: dict[str, int]) -> None:
        """All the gang's pending pods at once, or none (a gang scheduler's admission)."""
        pods = [p for p in self._job_pods(job) if p.node is None]
        trial = dict(free)
        chosen = []
        for pod in pods:
            node = self._best_node(pod, trial)
            if node is None:
                return
            trial[node.name] -= pod.gpus
            chosen.append((pod, node))
        for pod, node in chosen:
            self._bind(pod, node, free)

    def _preempt_for(self, pod: SimPod, free: dict[str, int]) -> SimNode | None:
        """DefaultPreemption: on each node, all lower-priority pods are candidates; the most important ones (higher
        priority, then started earlier) are reprieved while the pod still fits, those whose eviction would break a
        PodDisruptionBudget first (``selectVictimsOnNode``); the node with the fewest budget-breaking victims, then
        the least disruptive victims, wins (``pickOneNodeForPreemption``). The victims go, budgets or not (the
        kube-scheduler honours budgets as best effort only)."""
        best: tuple[tuple[object, ...], SimNode, list[SimPod]] | None = None
        allowed = {id(pdb): self._disruptions_allowed(pdb, self.now) for pdb in self.pdbs}
        for node in self.nodes.values():
            if not node.ready(self.now) or (pod.gpu_product is not None and node.gpu_product != pod.gpu_product):
                continue
            if pod.owner is None and node.pool in self.inference_only_pools:
                continue
            lower = [p for p in self.pods.values() if p.node == node.name and p.priority < pod.priority]
            room = free[node.name] + sum(p.gpus for p in lower)
            if room < pod.gpus:
                continue
            # MoreImportantPod: the higher priority, then the earlier start (a bound pod's start time)
            lower.sort(key=lambda p: (-p.priority, _started(p), p.name))
            violating, harmless = self._split_by_budget(lower, allowed)
            victims = []
            breaking = 0
            for candidates, breaks in ((violating, True), (harmless, False)):
                for candidate in candidates:
                    if room - candidate.gpus >= pod.gpus:
                        room -= candidate.gpus  # reprieved: it stays
                    else:
                        victims.append(candidate)
                        breaking += breaks
            if not victims:
                continue
            top = max(v.priority for v in victims)
            earliest_top = min(_started(v) for v in victims if v.priority == top)
            # the sum as the kube-scheduler counts it: MaxInt32 + 1 added to each priority (all >= 0), so that more
            # victims of a negative priority never sum to less than fewer of them
            key = (breaking, top, sum(v.priority + _PRIORITY_OFFSET for v in victims), len(victims), -earliest_top,
                   _desc(node.name))  # fmt: skip
            if best is None or key < best[0]:
                best = (key, node, victims)
        if best is None:
            return None
        _, node, victims = best
        self.scheduler_preemptions += len(victims)
        self._lose_pods(victims)
        # the gangs of the victims lost their other pods too, and the replacements' own scheduling passes may have
        # bound pods: this pass's free GPUs as they are now
        for name in free:
            free[name] = self.nodes[name].gpus - sum(p.gpus for p in self.pods.values() if p.node == name)
        return node if self._fits_on(node, pod, free) else None

    def _split_by_budget(
        self, candidates: list[SimPod], allowed: dict[int, int]
    ) -> tuple[list[SimPod], list[SimPod]]:
        """``filterPodsWithPDBViolation``: in their order, the candidates whose eviction would take a budget below
        the disruptions it allows now, and the others (each candidate spends one of every budget covering it)."""
        left = dict(allowed)
        violating: list[SimPod] = []
        harmless: list[SimPod] = []
        for candidate in candidates:
            labels = self._labels_of(candidate)
            breaks = False
            for pdb in self.pdbs:
                if not _selects(pdb, candidate.namespace, labels):
                    continue
                left[id(pdb)] -= 1
                breaks |= left[id(pdb)] < 0
            (violating if breaks else harmless).append(candidate)
        return violating, harmless

    def _lose_pod(self, pod: SimPod) -> None:
        """A pod goes (evicted, preempted, its node removed): a training job's gang stops and is recreated by its
        controller; a Deployment's pod is replaced."""
        self._lose_pods([pod])

    def _lose_pods(self, pods: list[SimPod]) -> None:
        """Pods go together (a preemption's victims): each gang stops once, and the Deployments' pods are replaced
        once all of them are gone (a replacement's scheduling pass must not see, and evict again, a victim still
        to go). A pod already gone (with its gang) is skipped."""
        removed = []
        for pod in pods:
            if self.pods.get((pod.namespace, pod.name)) is not pod:
                continue
            job = self.jobs.get(pod.gang) if pod.gang is not None else None
            if job is not None and job.admitted:
                self._stop_job(job)
                if job.finished_at is None:
                    self._admit(job)
                continue
            del self.pods[(pod.namespace, pod.name)]
            removed.append(pod)
        self._dirty = True
        for pod in removed:
            self._removed(pod)

    def _score(self, node: SimNode, free: int, request: int) -> float:
        """The GPU part of NodeResourcesFit, 0..1: MostAllocated, or LeastAllocated (also under Fragmentation)."""
        used_after = (node.gpus - free + request) / node.gpus if node.gpus else 1.0
        return used_after if self.scoring is Scoring.MOST_ALLOCATED else 1.0 - used_after

    # ---- ClusterReader --------------------------------------------------------------------------------------------

    def snapshot(self, now: float) -> ClusterSnapshot:
        self.advance(now)  # the scheduler has run by the time anybody looks
        if self._snapshot is not None:
            if self._snapshot.time != now:  # nothing changed since: the same objects, seen at ``now``
                self._snapshot = replace(self._snapshot, time=now)
            return self._snapshot
        self._snapshot = self._build_snapshot(now)
        return self._snapshot

    def _build_snapshot(self, now: float) -> ClusterSnapshot:
        # One pass over the pods: each Deployment's ready count comes from the same pass (a pass per Deployment
        # made a snapshot O(Deployments x pods): half the run time at 50 services).
        ready_by_owner: dict[str, int] = {}
        created_by_owner: dict[str, int] = {}  # status.replicas: every pod of the Deployment (none terminates here)
        pod_infos = []
        # A pod's PodInfo is made again only when what it shows changed (most pods are as they were: a snapshot is
        # rebuilt whenever anything in the cluster changed); the cache holds exactly the live pods.
        previous, cache = self._pod_infos, {}
        for key, p in self.pods.items():
            ready = p.ready(now)
            if p.owner is not None:
                created_by_owner[p.owner] = created_by_owner.get(p.owner, 0) + 1
                if ready:
                    ready_by_owner[p.owner] = ready_by_owner.get(p.owner, 0) + 1
            job = self.jobs.get(p.gang) if p.gang is not None else None
            shown = (
                p.node, ready, p.ready_at, p.priority, p.deletion_cost, p.deletion_cost_by,
                None if job is None else (job.checkpoint_at, job.preemptible, job.rebalance_allowed),
            )  # fmt: skip
            entry = previous.get(key)
            if entry is None or entry[0] is not p or entry[1] != shown:
                info = PodInfo(
                    namespace=p.namespace,
                    name=p.name,
                    node=p.node,
                    gpus=p.gpus,
                    priority=p.priority,
                    phase="Running" if p.node is not None else "Pending",
                    ready=ready,
                    owner_kind="Deployment" if p.owner else None,
                    owner_name=p.owner.split("/", 1)[1] if p.owner else None,
                    gang=p.gang,
                    created_at=p.created_at,
                    scheduled_at=p.bound_at,
                    ready_at=p.ready_at if ready else None,
                    last_checkpoint_at=self._checkpoint_of(p),
                    labels=self._labels_of(p),
                    gpu_product=p.gpu_product,
                    deletion_cost=p.deletion_cost,
                    deletion_cost_by=p.deletion_cost_by,
                )
                entry = (p, shown, info)
            cache[key] = entry
            pod_infos.append(entry[2])
        self._pod_infos = cache
        pods = tuple(pod_infos)
        deployments = [
            DeploymentInfo(
                dep.namespace, dep.name, dep.replicas, ready_by_owner.get(key, 0), gpu_product=dep.gpu_product,
                status_replicas=created_by_owner.get(key, 0),
            )
            for key, dep in self.deployments.items()
        ]
        nodes = tuple(NodeInfo(n.name, n.gpus, n.gpu_product, n.pool, n.ready(now)) for n in self.nodes.values())
        workloads = tuple(
            WorkloadInfo(
                "Job", job.namespace, job.name, job.gang, job.suspended_at is not None, job.priority,
                (job.gpus_per_pod,) * job.pods, job.gpu_product, job.suspended_at, job.min_runtime_s,
            )
            for job in self.jobs.values()
            if job.finished_at is None and (job.admitted or job.suspended_at is not None)
        )
        return ClusterSnapshot(
            time=now, deployments=tuple(deployments), pods=pods, nodes=nodes, workloads=workloads,
            pdbs=tuple(
                PodDisruptionBudgetInfo(b.namespace, b.name, dict(b.selector), self._disruptions_allowed(b, now))
                for b in self.pdbs
            ),
        )

    def _disruptions_allowed(self, pdb: SimPdb, now: float) -> int:
        """As the disruption controller counts: healthy (ready) matching pods above what the budget keeps; the
        expected count is the matching pods (a ReplicaSet's replacement counts, unready, until it is ready)."""
        healthy, desired = self._pdb_health(pdb, now)
        return max(0, healthy - desired)

    def _pdb_health(self, pdb: SimPdb, now: float) -> tuple[int, int]:
        """(currentHealthy, desiredHealthy) of the budget, as its status shows them."""
        matching = [
            p for p in self.pods.values()
            if _selects(pdb, p.namespace, self._labels_of(p))
        ]
        healthy = sum(1 for p in matching if p.ready(now))
        if pdb.min_available is not None:
            return healthy, pdb.min_available
        assert pdb.max_unavailable is not None
        return healthy, max(0, len(matching) - pdb.max_unavailable)

    def _checkpoint_of(self, pod: SimPod) -> float | None:
        job = self.jobs.get(pod.gang) if pod.gang is not None else None
        return job.checkpoint_at if job is not None else None

    def _labels_of(self, pod: SimPod) -> dict[str, str]:
        if pod.owner is not None:
            return {APP_LABEL: pod.owner.split("/", 1)[1]}
        job = self.jobs.get(pod.gang) if pod.gang is not None else None
        labels = {}
        if job is not None and not job.preemptible:
            labels[PREEMPTIBLE_LABEL] = "false"
        if job is not None and job.rebalance_allowed:
            labels[REBALANCE_LABEL] = "allowed"
        return labels

    # ---- ClusterWriter --------------------------------------------------------------------------------------------

    # The simulated cluster has one writer and no Lease: ``expected_replicas`` and ``can_write`` (ports.ClusterWriter)
    # cannot disagree with it, and are accepted for the Protocol.
    def scale_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        expected_replicas: int | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        key = f"{namespace}/{name}"
        dep = self.deployments.get(key)
        if dep is None:
            return WriteOutcome.GONE  # as the real writer answers a 404: nothing written
        if replicas < 0:
            raise PortError(f"scale deployment {key}: replicas {replicas} < 0")
        self.writes.append((self.now, "scale_deployment", (namespace, name, replicas)))
        if dep.replicas == replicas:
            return WriteOutcome.ALREADY
        dep.replicas = replicas
        self._reconcile(dep)
        return WriteOutcome.WROTE

    def evict_pod(
        self,
        namespace: str,
        name: str,
        *,
        dry_run: bool = False,
        can_write: WriteGuard | None = None,
        uid: str | None = None,  # simulated pods carry none: nothing to compare
    ) -> EvictionOutcome:
        """The Eviction API: refused (429, ``BLOCKED``) when a PodDisruptionBudget covering the pod allows no
        disruption now; otherwise the pod goes (a replica is replaced by its ReplicaSet and scheduled again, cold;
        a training worker stops its whole gang, which is recreated and restarts from its checkpoint)."""
        pod = self.pods.get((namespace, name))
        if pod is not None and self.pdbs and self._eviction_blocked(pod):
            if not dry_run:
                self.writes.append((self.now, "evict_pod_blocked", (namespace, name)))
                self.evictions_blocked += 1
            return EvictionOutcome.BLOCKED
        if dry_run:
            return EvictionOutcome.EVICTED if pod is not None else EvictionOutcome.GONE
        self.writes.append((self.now, "evict_pod", (namespace, name)))
        if pod is None:
            return EvictionOutcome.GONE
        self._lose_pod(pod)
        return EvictionOutcome.EVICTED

    def _eviction_blocked(self, pod: SimPod) -> bool:
        """As the Eviction API decides: a Pending pod is evicted whatever the budget (``canIgnorePDB``); a pod that
        is not ready is not one of the healthy ones, and goes while the budget is met (currentHealthy >=
        desiredHealthy > 0: ``unhealthyPodEvictionPolicy: IfHealthyBudget``, the default); a ready one needs a
        disruption allowed."""
        if pod.node is None:
            return False
        labels = self._labels_of(pod)
        ready = pod.ready(self.now)
        for pdb in self.pdbs:
            if not _selects(pdb, pod.namespace, labels):
                continue
            healthy, desired = self._pdb_health(pdb, self.now)
            if not ready and 0 < desired <= healthy:
                continue
            if healthy - desired <= 0:
                return True
        return False

    def set_pod_deletion_cost(
        self,
        namespace: str,
        name: str,
        cost: int | None,
        *,
        uid: str | None = None,  # simulated pods carry none: nothing to compare
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """The pod's deletion cost and our mark (what the real writer annotates), read by the ReplicaSet's next
        scale-down; a cost somebody else set is not touched (``ChangedSinceRead``)."""
        pod = self.pods.get((namespace, name))
        if pod is None:
            return WriteOutcome.GONE
        if pod.deletion_cost_by is not None and pod.deletion_cost_by != DELETION_COST_BY_US:
            raise ChangedSinceRead(f"pod {namespace}/{name}: a deletion cost somebody else set: not touched")
        wanted = (cost, DELETION_COST_BY_US) if cost is not None else (0, None)
        if (pod.deletion_cost, pod.deletion_cost_by) == wanted:
            return WriteOutcome.ALREADY
        self.writes.append((self.now, "set_pod_deletion_cost", (namespace, name, cost)))
        pod.deletion_cost, pod.deletion_cost_by = wanted
        self._dirty = True
        return WriteOutcome.WROTE

    def suspend_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        """A Job: suspended (``ALREADY`` when it is, or has finished). Another kind is a gang of pods whose
        suspension removes them (``ALREADY`` when none is left)."""
        self.writes.append((self.now, "suspend_workload", (kind, namespace, name)))
        job = self.jobs.get(f"job/{namespace}/{name}") if kind == "Job" else None
        if job is not None:
            if job.suspended_at is not None or job.finished_at is not None:
                return WriteOutcome.ALREADY
            if job.admitted:
                self._stop_job(job)
            if job.finished_at is None:
                job.suspended_at = self.now
            self._dirty = True
            return WriteOutcome.WROTE
        # no Job of that name: a gang of pods (suspended by removing them; ALREADY when none is left), or nothing
        outcome = WriteOutcome.GONE if kind == "Job" else WriteOutcome.ALREADY
        for key, pod in list(self.pods.items()):
            if pod.gang is not None and pod.gang.rsplit("/", 2)[-2:] == [namespace, name]:
                del self.pods[key]
                self._dirty = True
                self._removed(pod)
                outcome = WriteOutcome.WROTE
        return outcome

    def resume_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        self.writes.append((self.now, "resume_workload", (kind, namespace, name)))
        job = self.jobs.get(f"job/{namespace}/{name}") if kind == "Job" else None
        if job is None:
            return WriteOutcome.GONE  # no such workload
        if job.suspended_at is None:
            return WriteOutcome.ALREADY
        job.suspended_at = None
        if job.finished_at is None and not job.admitted:
            self._admit(job)
        return WriteOutcome.WROTE

    def emit_event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        event_type: str = "Normal",
        *,
        can_write: WriteGuard | None = None,
        uid: str | None = None,  # simulated pods carry none
    ) -> None:
        self.events.append((self.now, kind, namespace, name, reason, message, event_type))

    # ---- NodePoolScaler -------------------------------------------------------------------------------------------

    def node_count(self, pool: str) -> int:
        return len(self._pool(pool).nodes)

    def scale(
        self,
        pool: str,
        nodes: int,
        expected: int | None = None,
        remove_node: str | None = None,
        *,
        can_write: WriteGuard | None = None,  # one writer, no Lease (see the ClusterWriter section): accepted, unused
        remove_unregistered: bool = False,
        unregistered_min_age_s: float = 0.0,  # no simulated node is unregistered: accepted, unused
    ) -> WriteOutcome:
        spec = self._pool(pool)
        if remove_unregistered and nodes < len(spec.nodes):
            # a simulated pool's node is a Node from its request on: none ever fails to register
            raise PortError(f"scale pool {pool} to {nodes}: every node of the pool registered")
        if len(spec.nodes) != nodes:  # already there is fine whatever the plan saw
            refuse_pool_size_changed(f"scale pool {pool} to {nodes}", len(spec.nodes), expected)
        wanted = max(spec.min_nodes, min(spec.max_nodes, nodes))
        if wanted < len(spec.nodes) and remove_node is not None and remove_node not in spec.nodes:
            raise PortError(f"scale pool {pool} to {nodes}: node {remove_node!r} is not in the pool")
        self.writes.append((self.now, "scale", (pool, wanted)))
        if wanted == len(spec.nodes):
            return WriteOutcome.ALREADY
        self._dirty = True
        while len(spec.nodes) < wanted:
            self._new_pool_node(spec, ready_at=self.now + spec.boot_s)
        gone: set[str] = set()
        while len(spec.nodes) > wanted:
            # the named node first (a Machine marked for deletion), then the emptiest (the Cluster Autoscaler's pick)
            if remove_node in spec.nodes:
                emptiest = remove_node
            else:
                emptiest = min(spec.nodes, key=lambda n: (self.nodes[n].gpus - self.free_gpus(n), _desc(n)))
            spec.nodes.remove(emptiest)
            gone.add(emptiest)
        if not gone:
            return WriteOutcome.WROTE
        # The nodes and their pods go first, all together, then the ReplicaSets replace the pods: not on any of these
        # nodes again (removed one by one, a replacement or a recreated gang bound to the next node to go was lost
        # twice, and its gang counted as stopped twice).
        for name in gone:
            del self.nodes[name]
        self._lose_pods([p for p in self.pods.values() if p.node in gone])
        return WriteOutcome.WROTE

    # ---- internals ------------------------------------------------------------------------------------------------

    def _pool(self, pool: str) -> SimPool:
        try:
            return self.pools[pool]
        except KeyError:
            raise PortError(f"node pool {pool!r}: not found") from None

    def _new_pool_node(self, pool: SimPool, ready_at: float) -> None:
        self._dirty = True
        name = f"{pool.name}-{pool.next_index}"
        pool.next_index += 1
        pool.nodes.append(name)
        self.nodes[name] = SimNode(name, pool.gpus_per_node, pool.gpu_product, pool.name, ready_at)

    def _removed(self, pod: SimPod) -> None:
        """A Deployment's ReplicaSet replaces a lost pod; a training pod's work since its start is lost."""
        if pod.owner is not None:
            dep = self.deployments.get(pod.owner)
            if dep is not None:
                self._reconcile(dep)
        elif pod.ready_at is not None:
            self.lost_training_gpu_s += pod.gpus * max(0.0, self.now - pod.ready_at)

    def _rank_info(self, pod: SimPod) -> PodInfo:
        """What the ReplicaSet's scale-down ranking reads of a replica (the snapshot shows the same)."""
        ready = pod.ready(self.now)
        return PodInfo(
            pod.namespace, pod.name, pod.node, pod.gpus, pod.priority, "Running" if pod.node is not None else "Pending",
            ready, created_at=pod.created_at, ready_at=pod.ready_at if ready else None,
            deletion_cost=pod.deletion_cost, deletion_cost_by=pod.deletion_cost_by,
        )  # fmt: skip

    def _reconcile(self, dep: SimDeployment) -> None:
        key = f"{dep.namespace}/{dep.name}"
        owned = [p for p in self.pods.values() if p.owner == key]
        for _ in range(dep.replicas - len(owned)):
            self._serial += 1
            pod = SimPod(
                dep.namespace,
                f"{dep.name}-{self._serial:06d}",
                dep.gpus_per_replica,
                dep.priority,
                self.now,
                dep.cold_start_s,
                owner=key,
                gpu_product=dep.gpu_product,
            )
            self.pods[(pod.namespace, pod.name)] = pod
        if len(owned) > dep.replicas:
            # the ReplicaSet controller's order (ActivePodsWithRanks), as the core predicts it: one ranking for both
            by_name = {p.name: p for p in owned}
            ranked = replica_removal_order([self._rank_info(p) for p in owned])
            doomed = [by_name[info.name] for info in ranked[: len(owned) - dep.replicas]]
            for pod in doomed:
                del self.pods[(pod.namespace, pod.name)]
        self._dirty = True
        self.schedule()


def _selects(pdb: SimPdb, namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether the budget covers a pod of ``namespace`` carrying ``labels`` (its selector's labels all match)."""
    return pdb.namespace == namespace and all(labels.get(k) == v for k, v in pdb.selector.items())


def _started(pod: SimPod) -> float:
    """The pod's ``status.startTime``: when the kubelet took it, i.e. when it was bound (its creation if unknown)."""
    return pod.bound_at if pod.bound_at is not None else pod.created_at


@functools.lru_cache(maxsize=1 << 16)
def _desc(name: str) -> tuple[int, ...]:
    """Ties broken towards the smaller name when maximising: the key of a name, negated (cached: a scale-down
    sorts every pod of the Deployment by it)."""
    return tuple(-ord(c) for c in name)
