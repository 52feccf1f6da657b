"""Review 47: reads that fail in part, through the real Kubernetes reader and the fake API server.

- The HorizontalPodAutoscaler list refused (403) after it had answered -- an authorization webhook that is down, a
  ClusterRole being re-applied -- read as "no HPA": a Deployment an HPA scales, recommend-only while its HPA was
  seen, was scaled down by this controller the tick the list failed (two controllers writing one scale
  subresource, and a scale-down caused by an API error). The reader now keeps the HPAs it last read while the list
  is refused; a list never readable since the start is still skipped (an upgrade without the RBAC keeps scaling).
- A suspendable workload kind's list (batch Jobs here; JobSets, Kueue Workloads... alike) refused after it had
  answered read as "none of that kind": a training Job annotated with its own minimum runtime (two hours, 20 minutes
  in) fell back to the default ten minutes and was evicted for an inference shortfall it was protected from. A kind
  that answered before and is refused now is named in the snapshot (``ClusterSnapshot.training_unread``) and no
  training is stopped while it lasts; the scaling goes on (review 47b held the whole tick instead: a permission
  revoked for good stopped every scale-up until a restart). A kind never readable is still skipped as documented.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from runtime_fakes import FakeCluster, FakePolicies, FakeStatus, policy_object

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.workloads import MIN_RUNTIME_ANNOTATION
from autoscaler.controller import Controller
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import Observation, PodMetrics, ServiceObservation, ServicePolicy
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import Series
from autoscaler.telemetry import Telemetry
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

T0 = 1_800_000_000.0
CHAT = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0)


class _LowUtilisation:
    """Every ready replica of each service at ``util`` % GPU utilisation (the replicas come from the snapshot)."""

    def __init__(self, util: float) -> None:
        self.util = util

    def observe(
        self, services: Sequence[ServicePolicy], now: float, *, cluster: ClusterSnapshot | None = None
    ) -> Observation:
        ready = {f"{d.namespace}/{d.name}": d.ready_replicas for d in (cluster.deployments if cluster else ())}
        return Observation(
            now,
            {
                s.key: ServiceObservation(s.key, 0, 0, pods=PodMetrics(ready[s.key], self.util * ready[s.key]))
                for s in services
                if s.key in ready
            },
        )

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        return Series((), ())

    def set_service_queries(self, service_queries: Any) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, client.ApiClient]]:
    server = FakeApiServer().start()
    api_client = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        yield server, api_client
    finally:
        api_client.close()
        server.stop()


def _hpa(name: str, namespace: str, target: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}, "maxReplicas": 10},
        "status": {"currentReplicas": 6, "desiredReplicas": 6},
    }


def _refused(*args: Any, **kwargs: Any) -> Any:
    """A list the authorizer refuses (an authorization webhook down, a ClusterRole being re-applied)."""
    raise client.ApiException(status=403, reason="Forbidden")


def test_an_hpa_list_refused_after_it_answered_scales_down_no_deployment_the_hpa_scales(
    api: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api_client = api
    server.seed(o.deployment("chat", "ml", replicas=6), _hpa("chat-hpa", "ml", "chat"))
    reader = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None)
    writer = FakeCluster(deployments={"ml/chat": [6, 6]})  # records the scale writes
    c = Controller(
        metrics=_LowUtilisation(20.0),
        cluster=reader,
        writer=writer,
        policies=FakePolicies([policy_object(CHAT)]),
        status_writer=FakeStatus(),
        telemetry=Telemetry(identity="test"),
    )
    now = T0
    for _ in range(30):  # 7.5 minutes at 20 % of a 70 % target: 2 replicas recommended, the HPA's to write
        plan = c.run_once(now)
        now += 15
    assert [d.recommend_only for d in plan.decisions] == [True] and plan.decisions[0].recommended_replicas == 2
    assert writer.writes == []

    # the HPA is still there; only its list is refused for a while
    reader._autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces = _refused  # type: ignore[method-assign]
    for _ in range(3):
        plan = c.run_once(now)
        now += 15
    assert writer.writes == [], "a refused HPA list scaled down a Deployment the HPA scales"
    assert [d.recommend_only for d in plan.decisions] == [True]


def test_an_hpa_list_never_readable_leaves_the_scaling_on(api: tuple[FakeApiServer, client.ApiClient]) -> None:
    """Pin of the fix's other edge: without the RBAC from the start (an upgrade whose ClusterRole lacks HPAs) the
    controller scales as before, as the reader's docstring promises -- the HPAs kept are only those read."""
    server, api_client = api
    server.seed(o.deployment("chat", "ml", replicas=6), _hpa("chat-hpa", "ml", "chat"))
    reader = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None)
    reader._autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces = _refused  # type: ignore[method-assign]
    assert reader.snapshot(T0).hpas == ()


# ---- a workload kind's list refused: its own minimum runtime is lost ---------------------------------------------


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _training_world(
    server: FakeApiServer, api_client: client.ApiClient, now: float
) -> tuple[Controller, KubeClusterReader, FakeCluster]:
    """chat (priority 1000) fills n1 with 8 one-GPU replicas at 105 % of its 70 % target: it wants 12; n2 is held by
    the 8-GPU training Job ``ml/train`` (priority 100), started 20 minutes ago, annotated with its own minimum runtime
    of two hours: never a victim before then, the shortfall waits (capacity arbitration on, no burst pool)."""
    started = _iso(now - 1200)
    server.seed(
        o.node("n1"),
        o.node("n2"),
        o.deployment("chat", "inference", replicas=8),
        [
            o.deployment_pod(
                "chat",
                i,
                "inference",
                node_name="n1",
                priority=1000,
                created=_iso(now - 3600),
                ready_time=_iso(now - 3500),
            )
            for i in range(8)
        ],
        o.job("train", "ml", gpus=8, parallelism=1, annotations={MIN_RUNTIME_ANNOTATION: "7200"}),
        o.pod(
            "train-0",
            "ml",
            gpus=8,
            node_name="n2",
            priority=100,
            owner=("Job", "train"),
            labels={"batch.kubernetes.io/job-name": "train"},
            created=started,
            ready_time=started,
            scheduled_time=started,
        ),
    )
    reader = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None)
    writer = FakeCluster(deployments={"inference/chat": [8, 8]})
    metrics = FakeMetricsSource()
    metrics.set_service("inference/chat", spec_replicas=8, ready_replicas=8, pods=PodMetrics(8, 8 * 105.0))
    chat = ServicePolicy("inference", "chat", min_replicas=1, max_replicas=40, target=70.0, priority=1000)
    c = Controller(
        metrics=metrics,
        cluster=reader,
        writer=writer,
        policies=FakePolicies([policy_object(chat)]),
        status_writer=FakeStatus(),
        telemetry=Telemetry(identity="test"),
        capacity=CapacityConfig(),
    )
    c.acting_since = now - 3600
    return c, reader, writer


def _stops(writer: FakeCluster) -> list[tuple[str, tuple[Any, ...]]]:
    return [(w.op, w.args) for w in writer.writes if w.op in ("evict", "suspend")]


def test_a_job_list_refused_stops_no_training_inside_its_own_minimum_runtime(
    api: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api_client = api
    now = T0
    c, reader, writer = _training_world(server, api_client, now)
    for _ in range(4):
        c.run_once(now)
        now += 15
    assert _stops(writer) == []  # the premise: inside its two hours, ml/train is no victim
    candidates = c.last_report.plan.capacity.candidates  # type: ignore[union-attr]
    assert [v.why_not for v in candidates if v.gang == "job/ml/train"] == ["running 1245s < minimum runtime 7200s"]

    # the Job is still there and still annotated; only the Job list is refused for a while
    list_jobs = reader._batch.list_job_for_all_namespaces
    reader._batch.list_job_for_all_namespaces = _refused  # type: ignore[method-assign]
    for _ in range(8):
        c.run_once(now)
        now += 15
    assert _stops(writer) == [], "a refused Job list stopped training its own minimum runtime protects"
    report = c.last_report
    assert report is not None and report.result == "ok", report.held_because  # the scaling goes on
    capacity = report.plan.capacity
    assert capacity is not None and capacity.shortfalls  # chat is still short: the shortfall is seen, nothing stopped
    assert any("no training stopped" in n and "jobs.batch" in n for n in capacity.notes), capacity.notes

    reader._batch.list_job_for_all_namespaces = list_jobs  # type: ignore[method-assign]
    c.run_once(now)
    assert c.last_report is not None and c.last_report.result == "ok" and _stops(writer) == []
