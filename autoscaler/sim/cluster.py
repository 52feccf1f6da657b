"""A simulated cluster of nodes, GPUs, pods and gangs, behind the controller's own ports.

``SimCluster`` implements ``ClusterReader`` (``snapshot``), ``ClusterWriter`` (scale, evict, suspend, events) and
``NodePoolScaler`` (``node_count``, ``scale``), so that the simulator can drive the controller's tick through the
same ports as a real cluster (issue 11). Time moves only when the simulator calls ``advance(now)``.

What it models, as Kubernetes does it:

- **Placement**: the scheduler's filter (node ready and schedulable, GPU type, enough free ``nvidia.com/gpu`` on one
  node) then score (``LeastAllocated``, the default, or ``MostAllocated`` to bin-pack GPUs), ties by node name;
  pending pods are placed in priority order, then by creation time, each tick of the simulator.
- **Pod start** = scheduling + image pull + model load: a pod is ready ``cold_start_s`` after it is bound to a node
  (the Deployment's measured cold start), never before.
- **Deployments**: scaling creates pending pods or deletes pods in the ReplicaSet controller's order (unscheduled
  first, then not ready, then the newest); an evicted pod of a Deployment is replaced by a new pending one.
- **Gangs**: training pods carry a gang id; suspending the workload or evicting its pods removes them.
- **Node pools**: a scale-up adds nodes that hold no pods until they have booted (``boot_s``); a scale-down removes
  the emptiest nodes, and their pods go back to pending (Deployments) or are lost (training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo
from autoscaler.ports import EvictionOutcome, PortError


class Scoring(StrEnum):
    LEAST_ALLOCATED = "LeastAllocated"  # the default scheduler: spread
    MOST_ALLOCATED = "MostAllocated"  # bin-pack GPUs, keeps whole nodes free


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

    def ready(self, now: float) -> bool:
        return self.ready_at is not None and now >= self.ready_at


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

    def __init__(self, scoring: Scoring = Scoring.LEAST_ALLOCATED, now: float = 0.0) -> None:
        self.scoring = scoring
        self.now = now
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[tuple[str, str], SimPod] = {}
        self.deployments: dict[str, SimDeployment] = {}
        self.pools: dict[str, SimPool] = {}
        self.writes: list[tuple[float, str, tuple[object, ...]]] = []
        self.events: list[tuple[float, str, str, str, str, str, str]] = []
        self.lost_training_gpu_s = 0.0
        self._serial = 0
        # What the snapshot and the counts were computed from: nothing changes until a write, a binding, a pod
        # turning ready or a node finishing its boot (``_next_change``), so most simulator steps reuse them.
        self._dirty = True
        self._next_change = math.inf
        self._snapshot: ClusterSnapshot | None = None
        self._counts: dict[str, tuple[int, int, int]] = {}

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
                    pod.ready_at = self.now
            self._dirty = True

    def add_training_pod(
        self, namespace: str, name: str, gpus: int, priority: int, gang: str | None = None, node: str | None = None
    ) -> SimPod:
        pod = SimPod(namespace, name, gpus, priority, self.now, 0.0, gang=gang)
        if node is not None:
            if self.free_gpus(node) < gpus:
                raise ValueError(f"node {node} has {self.free_gpus(node)} free GPUs, {name} needs {gpus}")
            pod.node, pod.ready_at = node, self.now
        self.pods[(namespace, name)] = pod
        self._dirty = True
        return pod

    # ---- time -----------------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Move the clock to ``now`` and place the pending pods that fit."""
        if now < self.now:
            raise ValueError(f"time goes forward: {now} < {self.now}")
        self.now = now
        if self._dirty or now >= self._next_change:
            self.schedule()
            self._recount()

    def _recount(self) -> None:
        """Recompute the cached snapshot and counts, and when they next go out of date by time alone."""
        now = self.now
        counts: dict[str, list[int]] = {key: [0, 0, 0] for key in self.deployments}
        next_change = math.inf
        for pod in self.pods.values():
            ready_at = pod.ready_at
            if ready_at is not None and ready_at > now:
                next_change = min(next_change, ready_at)
            if pod.owner is None:
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
        self._counts = {key: (c[0], c[1], c[2]) for key, c in counts.items()}
        self._next_change = next_change
        self._snapshot = None
        self._dirty = False

    def counts(self, now: float) -> dict[str, tuple[int, int, int]]:
        """Per Deployment ``namespace/name``: (ready pods, pods bound to a node, pending pods) at ``now``."""
        self.advance(now)
        return self._counts

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
        free = {name: node.gpus for name, node in self.nodes.items()}
        for bound in self.pods.values():
            if bound.node is not None:
                free[bound.node] -= bound.gpus
        for pod in pending:
            fits = [
                node
                for node in self.nodes.values()
                if node.ready(self.now)
                and free[node.name] >= pod.gpus
                and (pod.gpu_product is None or node.gpu_product == pod.gpu_product)
            ]
            if not fits:
                continue
            best = max(fits, key=lambda n: (self._score(n, free[n.name], pod.gpus), _desc(n.name)))
            pod.node = best.name
            pod.ready_at = self.now + pod.cold_start_s
            free[best.name] -= pod.gpus
            self._dirty = True

    def _score(self, node: SimNode, free: int, request: int) -> float:
        used_after = (node.gpus - free + request) / node.gpus if node.gpus else 1.0
        return used_after if self.scoring is Scoring.MOST_ALLOCATED else 1.0 - used_after

    # ---- ClusterReader --------------------------------------------------------------------------------------------

    def snapshot(self, now: float) -> ClusterSnapshot:
        self.advance(now)  # the scheduler has run by the time anybody looks
        if self._snapshot is not None:
            return self._snapshot if self._snapshot.time == now else replace(self._snapshot, time=now)
        self._snapshot = self._build_snapshot(now)
        return self._snapshot

    def _build_snapshot(self, now: float) -> ClusterSnapshot:
        deployments = []
        for key, dep in self.deployments.items():
            ready = sum(1 for p in self.pods.values() if p.owner == key and p.ready(now))
            deployments.append(DeploymentInfo(dep.namespace, dep.name, dep.replicas, ready))
        pods = tuple(
            PodInfo(
                namespace=p.namespace,
                name=p.name,
                node=p.node,
                gpus=p.gpus,
                priority=p.priority,
                phase="Running" if p.node is not None else "Pending",
                ready=p.ready(now),
                owner_kind="Deployment" if p.owner else None,
                owner_name=p.owner.split("/", 1)[1] if p.owner else None,
                gang=p.gang,
                created_at=p.created_at,
                ready_at=p.ready_at if p.ready(now) else None,
            )
            for p in self.pods.values()
        )
        nodes = tuple(NodeInfo(n.name, n.gpus, n.gpu_product, n.pool, n.ready(now)) for n in self.nodes.values())
        return ClusterSnapshot(time=now, deployments=tuple(deployments), pods=pods, nodes=nodes)

    # ---- ClusterWriter --------------------------------------------------------------------------------------------

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        key = f"{namespace}/{name}"
        dep = self.deployments.get(key)
        if dep is None:
            raise PortError(f"scale deployment {key}: not found")
        if replicas < 0:
            raise PortError(f"scale deployment {key}: replicas {replicas} < 0")
        self.writes.append((self.now, "scale_deployment", (namespace, name, replicas)))
        if dep.replicas != replicas:
            dep.replicas = replicas
            self._reconcile(dep)

    def evict_pod(self, namespace: str, name: str) -> EvictionOutcome:
        pod = self.pods.pop((namespace, name), None)
        self.writes.append((self.now, "evict_pod", (namespace, name)))
        if pod is None:
            return EvictionOutcome.GONE
        self._dirty = True
        self._removed(pod)
        return EvictionOutcome.EVICTED

    def suspend_workload(self, kind: str, namespace: str, name: str) -> None:
        self.writes.append((self.now, "suspend_workload", (kind, namespace, name)))
        for key, pod in list(self.pods.items()):
            if pod.gang is not None and pod.gang.rsplit("/", 2)[-2:] == [namespace, name]:
                del self.pods[key]
                self._dirty = True
                self._removed(pod)

    def emit_event(
        self, kind: str, namespace: str, name: str, reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        self.events.append((self.now, kind, namespace, name, reason, message, event_type))

    # ---- NodePoolScaler -------------------------------------------------------------------------------------------

    def node_count(self, pool: str) -> int:
        return len(self._pool(pool).nodes)

    def scale(self, pool: str, nodes: int) -> None:
        spec = self._pool(pool)
        wanted = max(spec.min_nodes, min(spec.max_nodes, nodes))
        self.writes.append((self.now, "scale", (pool, wanted)))
        self._dirty = True
        while len(spec.nodes) < wanted:
            self._new_pool_node(spec, ready_at=self.now + spec.boot_s)
        while len(spec.nodes) > wanted:
            emptiest = min(spec.nodes, key=lambda n: (self.nodes[n].gpus - self.free_gpus(n), _desc(n)))
            spec.nodes.remove(emptiest)
            # Node and pods go first, then the ReplicaSets replace the pods: not on this node again.
            del self.nodes[emptiest]
            doomed = [key for key, pod in self.pods.items() if pod.node == emptiest]
            removed = [self.pods.pop(key) for key in doomed]
            for pod in removed:
                self._removed(pod)

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
            # the ReplicaSet controller's order: unscheduled, then not ready, then the newest
            doomed = sorted(owned, key=lambda p: (p.node is not None, p.ready(self.now), -p.created_at, _desc(p.name)))[
                : len(owned) - dep.replicas
            ]
            for pod in doomed:
                del self.pods[(pod.namespace, pod.name)]
        self._dirty = True
        self.schedule()


def _desc(name: str) -> tuple[int, ...]:
    """Ties broken towards the smaller name when maximising: the key of a name, negated."""
    return tuple(-ord(c) for c in name)
