"""An in-memory cluster: ``ClusterReader``, ``ClusterWriter`` and ``NodePoolScaler`` in one object.

For the core, runtime and simulator tests. It keeps the semantics that matter to the controller the way the API
server has them: evictions honour PodDisruptionBudgets (one budget is spent per eviction; zero left -> BLOCKED;
two budgets on one pod -> error) and skip them for pending or finished pods; a missing pod is GONE; every write is
idempotent (same target twice = once); suspending a workload removes its pods (resuming it does not bring them back:
there is no Job controller here; add the new pods yourself); node pools grow and shrink by whole nodes within their
bounds, and new nodes can take a boot time before they count as ready. Workloads added with ``add_workload`` are
listed in the snapshot and follow suspend / resume (``suspended``, ``suspended_by_us_at``), as the real reader shows
them from the objects' spec and our annotations; one suspended by someone else (``suspended`` without
``suspended_by_us_at``) is not resumed (``ChangedSinceRead``, as the real writer). A workload never added is taken to
exist (suspend and resume work on it); one removed with ``delete_workload`` is gone (404).

Every write says what it did, as the real writer: ``WriteOutcome.WROTE`` / ``EvictionOutcome.EVICTED`` for a change,
``ALREADY`` for an object already as wanted (the same target twice), ``GONE`` for an object that is not there (a
missing Deployment or pod, or a pod of that name with another uid; a deleted workload). Events keep the uid they were
given (``FakeEvent.uid``).

Faults on demand: ``fail("evict_pod", times=2)`` makes the next two evictions raise ``PortError``;
``block_evictions(...)`` makes evictions BLOCKED whatever the budgets say. Everything written is in ``writes`` and
``events``, in order.

The writes take the real writer's optional keywords: ``expected_replicas`` (a Deployment whose replicas are not
those any more is not written: ``ChangedSinceRead``, outcome ``changed``) and ``can_write`` (asked just before the
change; False: ``WriteNotAllowed``, outcome ``not_allowed``, nothing changed); a node-pool ``scale`` takes
``expected`` and ``can_write`` the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.core.cluster import (
    DELETION_COST_BY_US,
    SUSPENDABLE_KINDS,
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodDisruptionBudgetInfo,
    PodInfo,
    WorkloadInfo,
)
from autoscaler.ports import (
    ChangedSinceRead,
    EvictionOutcome,
    PortError,
    WriteGuard,
    WriteNotAllowed,
    WriteOutcome,
    refuse_pool_size_changed,
    refuse_replicas_changed,
)

OPS = (
    "snapshot",
    "scale_deployment",
    "evict_pod",
    "suspend_workload",
    "resume_workload",
    "set_pod_deletion_cost",
    "emit_event",
    "node_count",
    "bounds",
    "scale",
)


@dataclass(frozen=True, slots=True)
class FakeWrite:
    op: str  # scale_deployment | evict_pod | suspend_workload | resume_workload | scale (node pool)
    args: tuple[Any, ...]
    outcome: str  # applied | unchanged | evicted | blocked | gone | failed | changed (since read) | not_allowed


@dataclass(slots=True)
class FakeEvent:
    kind: str
    namespace: str
    name: str
    reason: str
    message: str
    type: str = "Normal"
    count: int = 1  # repeats of the same event are counted, like the real writer's event series
    uid: str | None = None  # the object's uid the writer was given (part of the Event's identity, as in the real one)


@dataclass(slots=True)
class NodePool:
    size: int
    gpus_per_node: int = 8
    gpu_product: str | None = None
    boot_s: float = 0.0  # seconds from scale-up until a new node is ready (needs ``clock``)
    min_size: int | None = None
    max_size: int | None = None
    next_index: int = 0
    nodes: list[str] = field(default_factory=list)  # oldest first
    # nodes counted in ``size`` that never registered as Nodes (a quota, a stock-out): ``add_unregistered``
    unregistered: int = 0


@dataclass(slots=True)
class _Fault:
    error: Exception
    times: int | None


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class FakeCluster:
    """In-memory cluster state. ``clock`` (Unix seconds) is needed for node boot times; a suspension is stamped with
    it, else with the time of the last snapshot."""

    def __init__(
        self,
        *,
        deployments: Iterable[DeploymentInfo] = (),
        pods: Iterable[PodInfo] = (),
        nodes: Iterable[NodeInfo] = (),
        pdbs: Iterable[PodDisruptionBudgetInfo] = (),
        priority_classes: Mapping[str, int] | None = None,
        workloads: Iterable[WorkloadInfo] = (),
        ready_follows_spec: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self.deployments: dict[str, DeploymentInfo] = {_key(d.namespace, d.name): d for d in deployments}
        self.pods: dict[str, PodInfo] = {_key(p.namespace, p.name): p for p in pods}
        self.nodes: dict[str, NodeInfo] = {n.name: n for n in nodes}
        self.pdbs: dict[str, PodDisruptionBudgetInfo] = {_key(p.namespace, p.name): p for p in pdbs}
        self.priority_classes: dict[str, int] = dict(priority_classes or {})
        self.pools: dict[str, NodePool] = {}
        self.ready_follows_spec = ready_follows_spec
        self.clock = clock
        self._node_ready_at: dict[str, float] = {}
        self.suspended: set[tuple[str, str, str]] = set()
        self.workloads: dict[tuple[str, str, str], WorkloadInfo] = {}
        self.deleted_workloads: set[tuple[str, str, str]] = set()  # suspend / resume of these: GONE
        self._last_snapshot = 0.0
        self.writes: list[FakeWrite] = []
        self.events: list[FakeEvent] = []
        self.snapshots = 0
        self._faults: dict[str, list[_Fault]] = {}
        self._blocked: set[tuple[str, str | None]] = set()
        for workload in workloads:
            self.add_workload(workload)

    # ---- building the state ---------------------------------------------------------------------------------------

    def add_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        ready: int | None = None,
        selector: Mapping[str, str] | None = None,
        created: int | None = None,
    ) -> DeploymentInfo:
        """``created``: its pods that exist and are not terminating (status.replicas); default ``replicas``."""
        dep = DeploymentInfo(
            namespace, name, replicas, replicas if ready is None else ready, dict(selector or {}),
            status_replicas=replicas if created is None else created,
        )
        with self._lock:
            self.deployments[_key(namespace, name)] = dep
        return dep

    def add_pod(self, pod: PodInfo) -> PodInfo:
        with self._lock:
            self.pods[_key(pod.namespace, pod.name)] = pod
        return pod

    def add_node(self, node: NodeInfo) -> NodeInfo:
        with self._lock:
            self.nodes[node.name] = node
        return node

    def add_pdb(self, namespace: str, name: str, selector: Mapping[str, str], disruptions_allowed: int) -> None:
        with self._lock:
            self.pdbs[_key(namespace, name)] = PodDisruptionBudgetInfo(
                namespace, name, dict(selector), disruptions_allowed
            )

    def add_workload(self, workload: WorkloadInfo) -> WorkloadInfo:
        """A suspendable workload (Job, JobSet...), listed in the snapshot; ``suspended`` as given."""
        key = (workload.kind, workload.namespace, workload.name)
        with self._lock:
            self.deleted_workloads.discard(key)
            self.workloads[key] = workload
            if workload.suspended:
                self.suspended.add(key)
            else:
                self.suspended.discard(key)
        return workload

    def delete_workload(self, kind: str, namespace: str, name: str) -> None:
        """The workload is deleted (its pods with it): a suspend or resume of it is ``GONE``."""
        key = (kind, namespace, name)
        with self._lock:
            self.workloads.pop(key, None)
            self.suspended.discard(key)
            self.deleted_workloads.add(key)
            for pod_key, pod in list(self.pods.items()):
                if pod.namespace == namespace and self._owned_by(pod, kind, name):
                    del self.pods[pod_key]

    @staticmethod
    def _owned_by(pod: PodInfo, kind: str, name: str) -> bool:
        in_gang = pod.gang is not None and pod.gang.rsplit("/", 2)[-2:] == [pod.namespace, name]
        return (pod.owner_kind == kind and pod.owner_name == name) or in_gang

    def add_pool(
        self,
        pool: str,
        nodes: int = 0,
        *,
        gpus_per_node: int = 8,
        gpu_product: str | None = None,
        boot_s: float = 0.0,
        min_size: int | None = None,
        max_size: int | None = None,
    ) -> NodePool:
        """A resizable pool; its initial ``nodes`` are ready at once."""
        with self._lock:
            state = NodePool(0, gpus_per_node, gpu_product, boot_s, min_size, max_size)
            self.pools[pool] = state
            self._resize(pool, state, nodes, boot=False)
            return state

    def add_unregistered(self, pool: str, count: int = 1) -> None:
        """The provider counts ``count`` more nodes in ``pool`` that never register as Nodes."""
        with self._lock:
            state = self._pool(pool)
            state.size += count
            state.unregistered += count

    # ---- faults ---------------------------------------------------------------------------------------------------

    def fail(self, op: str, error: Exception | None = None, *, times: int | None = 1) -> None:
        """The next ``times`` calls of ``op`` raise ``error`` (default a PortError); ``times=None``: until cleared."""
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r} (one of {', '.join(OPS)})")
        with self._lock:
            self._faults.setdefault(op, []).append(
                _Fault(error or PortError(f"{op}: injected failure (HTTP 500)"), times)
            )

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._blocked.clear()

    def block_evictions(self, namespace: str, name: str | None = None) -> None:
        """Evictions of this pod (or of every pod in the namespace) are BLOCKED, as by a PDB that never allows."""
        with self._lock:
            self._blocked.add((namespace, name))

    def _check_fault(self, op: str) -> None:
        faults = self._faults.get(op)
        if not faults:
            return
        fault = faults[0]
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                faults.pop(0)
        raise fault.error

    # ---- ClusterReader --------------------------------------------------------------------------------------------

    def snapshot(self, now: float) -> ClusterSnapshot:
        with self._lock:
            self._check_fault("snapshot")
            self.snapshots += 1
            self._last_snapshot = now
            nodes = []
            for node in self.nodes.values():
                ready_at = self._node_ready_at.get(node.name)
                if ready_at is not None and now >= ready_at:
                    node = replace(node, ready=True, allocatable_gpus=self._pool_gpus(node))
                    self.nodes[node.name] = node
                    del self._node_ready_at[node.name]
                nodes.append(node)
            return ClusterSnapshot(
                time=now,
                deployments=tuple(self.deployments.values()),
                pods=tuple(self.pods.values()),
                nodes=tuple(nodes),
                priority_classes=dict(self.priority_classes),
                pdbs=tuple(self.pdbs.values()),
                workloads=tuple(self.workloads.values()),
            )

    def _pool_gpus(self, node: NodeInfo) -> int:
        pool = self.pools.get(node.pool or "")
        return pool.gpus_per_node if pool else node.allocatable_gpus

    # ---- ClusterWriter --------------------------------------------------------------------------------------------

    def _record(self, op: str, args: tuple[Any, ...], outcome: str) -> None:
        self.writes.append(FakeWrite(op, args, outcome))

    def _may_write(self, op: str, args: tuple[Any, ...], can_write: WriteGuard | None) -> None:
        if can_write is not None and not can_write():
            self._record(op, args, "not_allowed")
            raise WriteNotAllowed(f"{op} {args}: not written: the write guard refused")

    def scale_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        expected_replicas: int | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        with self._lock:
            args = (namespace, name, replicas)
            try:
                self._check_fault("scale_deployment")
            except Exception:
                self._record("scale_deployment", args, "failed")
                raise
            key = _key(namespace, name)
            dep = self.deployments.get(key)
            if dep is None:
                self._record("scale_deployment", args, "gone")  # as the real writer: 404, nothing to scale
                return WriteOutcome.GONE
            if dep.spec_replicas == replicas:
                self._record("scale_deployment", args, "unchanged")
                return WriteOutcome.ALREADY
            try:
                refuse_replicas_changed(f"scale deployment {key} to {replicas}", dep.spec_replicas, expected_replicas)
            except ChangedSinceRead:
                self._record("scale_deployment", args, "changed")
                raise
            self._may_write("scale_deployment", args, can_write)
            ready = replicas if self.ready_follows_spec else min(dep.ready_replicas, replicas)
            # the ReplicaSet creates (or deletes) the pods at once; they may take their time to become ready
            created = None if dep.status_replicas is None else replicas
            self.deployments[key] = replace(dep, spec_replicas=replicas, ready_replicas=ready, status_replicas=created)
            self._record("scale_deployment", args, "applied")
            return WriteOutcome.WROTE

    def disruptions_allowed(self, namespace: str) -> dict[str, int]:
        with self._lock:
            return {p.name: p.disruptions_allowed for p in self.pdbs.values() if p.namespace == namespace}

    def evict_pod(
        self,
        namespace: str,
        name: str,
        *,
        dry_run: bool = False,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> EvictionOutcome:
        with self._lock:
            args = (namespace, name, "dry-run") if dry_run else (namespace, name)
            self._may_write("evict_pod", args, can_write)
            try:
                self._check_fault("evict_pod")
            except Exception:
                self._record("evict_pod", args, "failed")
                raise
            key = _key(namespace, name)
            pod = self.pods.get(key)
            if pod is None or (uid is not None and pod.uid is not None and pod.uid != uid):
                self._record("evict_pod", args, "gone")  # gone, or a successor of the same name: not the one meant
                return EvictionOutcome.GONE
            if (namespace, name) in self._blocked or (namespace, None) in self._blocked:
                self._record("evict_pod", args, "blocked")
                return EvictionOutcome.BLOCKED
            # Pending and finished pods cause no new disruption: the API server deletes them without a PDB check.
            if pod.phase not in ("Pending", "Succeeded", "Failed"):
                budgets = [
                    pdb
                    for pdb in self.pdbs.values()
                    if pdb.namespace == namespace
                    and pdb.selector
                    and all(pod.labels.get(k) == v for k, v in pdb.selector.items())
                ]
                if len(budgets) > 1:
                    self._record("evict_pod", args, "failed")
                    raise PortError(
                        f"evict pod {key}: HTTP 500: This pod has more than one PodDisruptionBudget, which the "
                        "eviction subresource does not support."
                    )
                if budgets:
                    pdb = budgets[0]
                    if pdb.disruptions_allowed <= 0:
                        self._record("evict_pod", args, "blocked")
                        return EvictionOutcome.BLOCKED
                    if not dry_run:
                        self.pdbs[_key(pdb.namespace, pdb.name)] = replace(
                            pdb, disruptions_allowed=pdb.disruptions_allowed - 1
                        )
            if dry_run:  # the API server's dryRun: checked, nothing changed
                self._record("evict_pod", args, "allowed")
                return EvictionOutcome.EVICTED
            del self.pods[key]
            self._record("evict_pod", args, "evicted")
            return EvictionOutcome.EVICTED

    def set_pod_deletion_cost(
        self,
        namespace: str,
        name: str,
        cost: int | None,
        *,
        uid: str | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """As the real writer: the cost and our mark set on the pod (``PodInfo.deletion_cost``/``deletion_cost_by``,
        what the reader would read back), or both removed; a cost somebody else set is ``ChangedSinceRead``."""
        with self._lock:
            args = (namespace, name, cost)
            try:
                self._check_fault("set_pod_deletion_cost")
            except Exception:
                self._record("set_pod_deletion_cost", args, "failed")
                raise
            key = _key(namespace, name)
            pod = self.pods.get(key)
            if pod is None or (uid is not None and pod.uid is not None and pod.uid != uid):
                self._record("set_pod_deletion_cost", args, "gone")
                return WriteOutcome.GONE
            if pod.deletion_cost_by is not None and pod.deletion_cost_by != DELETION_COST_BY_US:
                self._record("set_pod_deletion_cost", args, "skipped")
                raise ChangedSinceRead(f"pod {namespace}/{name}: a deletion cost somebody else set: not touched")
            wanted = (cost, DELETION_COST_BY_US) if cost is not None else (0, None)
            if (pod.deletion_cost, pod.deletion_cost_by) == wanted:
                self._record("set_pod_deletion_cost", args, "unchanged")
                return WriteOutcome.ALREADY
            self._may_write("set_pod_deletion_cost", args, can_write)
            self.pods[key] = replace(pod, deletion_cost=wanted[0], deletion_cost_by=wanted[1])
            self._record("set_pod_deletion_cost", args, "applied")
            return WriteOutcome.WROTE

    def suspend_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        with self._lock:
            args = (kind, namespace, name)
            try:
                self._check_fault("suspend_workload")
            except Exception:
                self._record("suspend_workload", args, "failed")
                raise
            if kind not in SUSPENDABLE_KINDS:
                self._record("suspend_workload", args, "failed")
                raise PortError(f"suspend {kind} {namespace}/{name}: not suspendable through its spec")
            if (kind, namespace, name) in self.deleted_workloads:
                self._record("suspend_workload", args, "gone")
                return WriteOutcome.GONE
            if (kind, namespace, name) in self.suspended:
                self._record("suspend_workload", args, "unchanged")
                return WriteOutcome.ALREADY
            self._may_write("suspend_workload", args, can_write)
            self.suspended.add((kind, namespace, name))
            workload = self.workloads.get((kind, namespace, name))
            if workload is not None:
                # the real writer marks what it suspends (annotations), and the reader reports it
                at = self.clock() if self.clock is not None else self._last_snapshot
                self.workloads[(kind, namespace, name)] = replace(workload, suspended=True, suspended_by_us_at=at)
            # The workload's controller deletes its pods when suspended.
            for key, pod in list(self.pods.items()):
                if pod.namespace == namespace and self._owned_by(pod, kind, name):
                    del self.pods[key]
            self._record("suspend_workload", args, "applied")
            return WriteOutcome.WROTE

    def resume_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        """Undo ``suspend_workload``: no longer suspended, our mark removed. Its pods are not recreated here. A
        workload added as suspended by someone else is not resumed (``ChangedSinceRead``, outcome ``changed``)."""
        with self._lock:
            args = (kind, namespace, name)
            try:
                self._check_fault("resume_workload")
            except Exception:
                self._record("resume_workload", args, "failed")
                raise
            if kind not in SUSPENDABLE_KINDS:
                self._record("resume_workload", args, "failed")
                raise PortError(f"resume {kind} {namespace}/{name}: not suspendable through its spec")
            key = (kind, namespace, name)
            if key in self.deleted_workloads:
                self._record("resume_workload", args, "gone")
                return WriteOutcome.GONE
            workload = self.workloads.get(key)
            marked = workload is not None and workload.suspended_by_us_at is not None
            if key not in self.suspended:
                # running: a stale mark of ours is removed (as the real writer does), the resume itself changed nothing
                if workload is not None and marked:
                    self._may_write("resume_workload", args, can_write)
                    self.workloads[key] = replace(workload, suspended=False, suspended_by_us_at=None)
                self._record("resume_workload", args, "unchanged")
                return WriteOutcome.ALREADY
            if workload is not None and not marked:
                self._record("resume_workload", args, "changed")
                raise ChangedSinceRead(
                    f"resume {kind} {namespace}/{name}: not resumed: it is suspended, not by this controller now"
                )
            self._may_write("resume_workload", args, can_write)
            self.suspended.discard(key)
            if workload is not None:
                self.workloads[key] = replace(workload, suspended=False, suspended_by_us_at=None)
            self._record("resume_workload", args, "applied")
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
        uid: str | None = None,
        **_: Any,  # accepts the real writer's keyword extras (action=...)
    ) -> None:
        with self._lock:
            self._check_fault("emit_event")
            if can_write is not None and not can_write():
                raise WriteNotAllowed(f"event {reason} on {kind} {namespace}/{name}: not written: the guard refused")
            for event in self.events:
                if (event.kind, event.namespace, event.name, event.reason, event.message, event.type, event.uid) == (
                    kind,
                    namespace,
                    name,
                    reason,
                    message,
                    event_type,
                    uid,
                ):
                    event.count += 1
                    return
            self.events.append(FakeEvent(kind, namespace, name, reason, message, event_type, uid=uid))

    # ---- NodePoolScaler -------------------------------------------------------------------------------------------

    def node_count(self, pool: str) -> int:
        with self._lock:
            self._check_fault("node_count")
            return self._pool(pool).size

    def bounds(self, pool: str) -> tuple[int | None, int | None]:
        """(min, max) the pool's writes are clamped to, as the Cluster API adapter's annotations."""
        with self._lock:
            self._check_fault("bounds")
            state = self._pool(pool)
            return state.min_size, state.max_size

    def scale(
        self,
        pool: str,
        nodes: int,
        expected: int | None = None,
        remove_node: str | None = None,
        *,
        can_write: WriteGuard | None = None,
        remove_unregistered: bool = False,
        unregistered_min_age_s: float = 0.0,  # the fake's unregistered nodes have no age: all taken as old enough
    ) -> WriteOutcome:
        with self._lock:
            args = (pool, nodes)
            try:
                self._check_fault("scale")
                state = self._pool(pool)
            except Exception:
                self._record("scale", args, "failed")
                raise
            if state.size != nodes:  # already there is fine whatever the plan saw
                try:
                    refuse_pool_size_changed(f"scale pool {pool} to {nodes}", state.size, expected)
                except ChangedSinceRead:
                    self._record("scale", args, "changed")
                    raise
            # clamped towards the live size only, as the Cluster API adapter (and Cluster Autoscaler): a pool above
            # a lowered max is never shrunk for it, one below a raised min never grown for it
            target = nodes
            if target > state.size and state.max_size is not None and target > state.max_size:
                target = max(state.max_size, state.size)
            if target < state.size and state.min_size is not None and target < state.min_size:
                target = min(state.min_size, state.size)
            if target == state.size:
                self._record("scale", args, "unchanged")
                return WriteOutcome.ALREADY
            if target < state.size and remove_node is not None and remove_node not in state.nodes:
                # as the Cluster API adapter: a node it cannot name to the provider is not removed by chance
                self._record("scale", args, "failed")
                raise PortError(f"scale pool {pool} to {nodes}: node {remove_node!r} is not in the pool")
            if target < state.size and remove_unregistered and state.size - target > state.unregistered:
                # as the Cluster API adapter: only Machines without a Node go, never a registered node by chance
                self._record("scale", args, "failed")
                raise PortError(
                    f"scale pool {pool} to {nodes}: {state.unregistered} node(s) never registered, "
                    f"{state.size - target} to remove"
                )
            self._may_write("scale", args, can_write)
            if target < state.size and remove_unregistered:
                state.unregistered -= state.size - target
                state.size = target
                self._record("scale", args, "applied")
                return WriteOutcome.WROTE
            if target < state.size and remove_node is not None:
                state.nodes.remove(remove_node)
                state.nodes.append(remove_node)  # _resize removes from the end
            self._resize(pool, state, target, boot=True)
            self._record("scale", args, "applied")
            return WriteOutcome.WROTE

    def _pool(self, pool: str) -> NodePool:
        try:
            return self.pools[pool]
        except KeyError:
            raise PortError(f"node pool {pool!r}: HTTP 404 NotFound") from None

    def _resize(self, pool: str, state: NodePool, target: int, *, boot: bool) -> None:
        while state.size < target:
            name = f"{pool}-{state.next_index}"
            state.next_index += 1
            booting = boot and state.boot_s > 0 and self.clock is not None
            self.nodes[name] = NodeInfo(
                name=name,
                allocatable_gpus=0 if booting else state.gpus_per_node,
                gpu_product=state.gpu_product,
                pool=pool,
                ready=not booting,
            )
            if booting:
                assert self.clock is not None
                self._node_ready_at[name] = self.clock() + state.boot_s
            state.nodes.append(name)
            state.size += 1
        while state.size > target:
            if not state.nodes:  # only nodes that never registered are left
                state.unregistered -= 1
                state.size -= 1
                continue
            # Newest first: like a MachineSet's "Newest" delete policy, and the nodes least likely to hold work.
            name = state.nodes.pop()
            self.nodes.pop(name, None)
            self._node_ready_at.pop(name, None)
            for key, pod in list(self.pods.items()):
                if pod.node == name:
                    del self.pods[key]
            state.size -= 1
