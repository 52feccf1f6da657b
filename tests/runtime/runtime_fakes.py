"""Small in-memory ports for the controller tests (the shared fakes in ``autoscaler/fakes`` cover the simulator;
these add the knobs the runtime tests need: failing reads and writes, call logs)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from autoscaler.adapters.kubernetes.status import StatusUpdate, merge_status
from autoscaler.controller import Controller
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, HpaInfo, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import Observation, PodMetrics, ServiceObservation, ServicePolicy
from autoscaler.fakes.cluster import FakeCluster as SharedFakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import EvictionOutcome, PolicyObject, PortError, Series, WriteGuard, WriteNotAllowed
from autoscaler.telemetry import Telemetry


class FakeMetrics:
    """Per-service average GPU utilisation over the cluster's ready pods; ``fail`` makes observe() raise."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.util: dict[str, float] = {}
        self.stale: dict[str, tuple[str, ...]] = {}
        self.fail: Exception | None = None
        self.calls = 0

    def observe(
        self, services: Sequence[ServicePolicy], now: float, *, cluster: ClusterSnapshot | None = None
    ) -> Observation:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        out: dict[str, ServiceObservation] = {}
        for s in services:
            if s.key in self.stale:
                out[s.key] = ServiceObservation(s.key, 0, 0, stale_reasons=self.stale[s.key])
            elif s.key in self.util:
                # every ready pod reports the same utilisation; replicas are filled in by the controller
                ready = self.cluster.deployments[s.key][1]
                out[s.key] = ServiceObservation(s.key, 0, 0, pods=PodMetrics(ready, self.util[s.key] * ready))
        return Observation(now, out)

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        return Series((), ())

    def set_service_queries(self, service_queries: Mapping[str, Any]) -> None:
        pass  # no queries: utilisation is set by the test


@dataclass
class Write:
    op: str
    args: tuple[Any, ...]


@dataclass
class FakeCluster:
    """Reader and writer over a dict of Deployments; every write is logged in ``writes``."""

    deployments: dict[str, list[int]] = field(default_factory=dict)  # key -> [spec, ready]
    fail_reads: Exception | None = None
    fail_writes: int = 0  # the next N scale/evict/suspend writes raise PortError
    fail_events: bool = False
    writes: list[Write] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    evictions_blocked: bool = False
    hpas: list[HpaInfo] = field(default_factory=list)  # HorizontalPodAutoscalers in the cluster

    def snapshot(self, now: float) -> ClusterSnapshot:
        if self.fail_reads is not None:
            raise self.fail_reads
        deps = tuple(
            DeploymentInfo(k.split("/")[0], k.split("/")[1], spec, ready)
            for k, (spec, ready) in self.deployments.items()
        )
        return ClusterSnapshot(time=now, deployments=deps, hpas=tuple(self.hpas))

    def _maybe_fail(self, what: str) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise PortError(f"{what}: HTTP 500 Internal Server Error")

    def scale_deployment(self, namespace: str, name: str, replicas: int, **guards: object) -> None:
        self._maybe_fail("scale")
        self.writes.append(Write("scale", (namespace, name, replicas)))
        dep = self.deployments[f"{namespace}/{name}"]
        dep[0] = replicas
        dep[1] = replicas  # pods become ready at once in this fake

    def evict_pod(self, namespace: str, name: str, *, dry_run: bool = False, **guards: object) -> EvictionOutcome:
        self._maybe_fail("evict")
        if dry_run:
            return EvictionOutcome.BLOCKED if self.evictions_blocked else EvictionOutcome.EVICTED
        self.writes.append(Write("evict", (namespace, name)))
        return EvictionOutcome.BLOCKED if self.evictions_blocked else EvictionOutcome.EVICTED

    def suspend_workload(self, kind: str, namespace: str, name: str, **guards: object) -> None:
        self._maybe_fail("suspend")
        self.writes.append(Write("suspend", (kind, namespace, name)))

    def resume_workload(self, kind: str, namespace: str, name: str, **guards: object) -> None:
        self._maybe_fail("resume")
        self.writes.append(Write("resume", (kind, namespace, name)))

    def emit_event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        event_type: str = "Normal",
        **guards: object,
    ) -> None:
        if self.fail_events:
            raise PortError("events: HTTP 500")
        self.events.append(
            {
                "kind": kind,
                "namespace": namespace,
                "name": name,
                "reason": reason,
                "message": message,
                "type": event_type,
            }
        )


class FakePolicies:
    def __init__(self, objects: Sequence[PolicyObject] = ()) -> None:
        self.objects = list(objects)
        self.fail: Exception | None = None

    def list_policies(self) -> Sequence[PolicyObject]:
        if self.fail is not None:
            raise self.fail
        return list(self.objects)


class FakeStatus:
    """Status subresources, merged like the real writer does (``merge_status``).

    ``uids``: the metadata.uid of the object stored under a name, when a test sets one (``recreate`` does); a write
    that names another uid (meant for a deleted incarnation) is skipped like the real writer skips it: nothing
    written, no error, counted in ``skipped``. Without an entry, or without a ``uid`` argument: written as always."""

    def __init__(self) -> None:
        self.status: dict[tuple[str, str], dict[str, Any]] = {}
        self.uids: dict[tuple[str, str], str] = {}
        self.writes = 0
        self.refused = 0  # writes the guard refused (nothing written)
        self.skipped = 0  # writes meant for another incarnation of the object (its uid differs): nothing written
        self.fail = False

    def recreate(self, namespace: str, name: str, uid: str) -> None:
        """The object deleted and created again under its name: a new uid and an empty status."""
        self.status.pop((namespace, name), None)
        self.uids[(namespace, name)] = uid

    def update_policy_status(
        self,
        namespace: str,
        name: str,
        update: StatusUpdate,
        *,
        now: float,
        generation: int | None = None,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> None:
        if self.fail:
            raise PortError("status: HTTP 500")
        live_uid = self.uids.get((namespace, name))
        if uid is not None and live_uid is not None and live_uid != uid:
            self.skipped += 1
            return
        if can_write is not None and not can_write():
            self.refused += 1
            raise WriteNotAllowed(f"status of {namespace}/{name}: not written: the write guard refused")
        self.writes += 1
        observed = generation if generation is not None else 1
        self.status[(namespace, name)] = merge_status(
            self.status.get((namespace, name)), update, generation=observed, now=now
        )


def policy_object(policy: ServicePolicy, name: str | None = None) -> PolicyObject:
    return PolicyObject(policy.namespace, name or f"{policy.name}-policy", policy, generation=1)


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll until ``condition``; the deadline is generous (a loaded machine), a condition met returns at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET ``path`` on 127.0.0.1:``port``: (status, body), an HTTP error status included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def controller_on(cluster: Any, policy: ServicePolicy, metrics: Any, capacity: Any, start: float) -> Any:
    """A Controller whose reader, writer and node pools are one in-memory cluster (``autoscaler.fakes.cluster``),
    for one policy, with capacity arbitration, and past the takeover grace at ``start``."""
    from autoscaler.controller import Controller
    from autoscaler.telemetry import Telemetry

    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        node_pools=cluster,
        policies=FakePolicies([policy_object(policy)]),
        telemetry=Telemetry(),
        capacity=capacity,
    )
    controller.acting_since = start - 3600
    return controller


def add_serving_pods(cluster: Any, policy: ServicePolicy, node: str, count: int, created_at: float) -> None:
    """``count`` running 1-GPU replicas of ``policy``'s Deployment on ``node``."""
    from autoscaler.core.cluster import PodInfo

    for i in range(count):
        cluster.add_pod(
            PodInfo(policy.namespace, f"{policy.name}-{i}", node, 1, policy.priority, "Running", True, "Deployment",
                    policy.name, created_at=created_at)
        )  # fmt: skip


ClusterT = TypeVar("ClusterT", bound=SharedFakeCluster)


def full_cluster_with_training(
    cluster_type: type[ClusterT],
    now: float,
    *,
    extra: Sequence[PolicyObject] = (),
    dry_run: bool = False,
    node_pools: bool = False,
) -> tuple[Controller, ClusterT, FakeMetricsSource]:
    """chat (priority 1000) fills n1 with 8 one-GPU replicas at 105 % of its 70 % target: it wants 12, and the only
    GPUs for them are n2's, held by a low-priority training Job (a one-pod gang). Capacity arbitration on; past the
    takeover grace (acting since an hour before ``now``). ``cluster_type``: the shared fake cluster or a subclass;
    ``extra``: more policy objects; ``node_pools``: the cluster is the controller's node-pool scaler too."""
    chat = ServicePolicy("inference", "chat", min_replicas=1, max_replicas=40, target=70.0, priority=1000)
    cluster = cluster_type(nodes=[NodeInfo("n1", 8, "A100", "onprem", True), NodeInfo("n2", 8, "A100", "onprem", True)])
    cluster.add_deployment("inference", "chat", 8)
    for i in range(8):
        cluster.add_pod(
            PodInfo("inference", f"chat-{i}", "n1", 1, 1000, "Running", True, "Deployment", "chat",
                    created_at=now - 3600)
        )  # fmt: skip
    cluster.add_pod(
        PodInfo("ml", "train-0", "n2", 8, 100, "Running", True, "Job", "train", gang="job/ml/train",
                created_at=now - 7200, last_checkpoint_at=now - 60)
    )  # fmt: skip
    cluster.add_workload(WorkloadInfo("Job", "ml", "train", "job/ml/train", False, 100, (8,), None, None))
    metrics = FakeMetricsSource()
    metrics.set_service(chat.key, spec_replicas=8, ready_replicas=8, pods=PodMetrics(8, 8 * 105.0))
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        node_pools=cluster if node_pools else None,
        policies=FakePolicies([PolicyObject("inference", "chat-policy", chat, generation=1), *extra]),
        telemetry=Telemetry(),
        capacity=CapacityConfig(),
        dry_run=dry_run,
    )
    controller.acting_since = now - 3600
    return controller, cluster, metrics
