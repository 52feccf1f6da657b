"""Partial pod coverage through the real adapters: a snapshot read by the Kubernetes reader from the REST-faithful API
server, GPU samples served over HTTP by canned Prometheus answers, then the core's decision.

This is the path ``autoscaler run`` takes. It caught issue 17's first defect: the reader resolves a pod's owner to
its Deployment, the metrics adapter only counted ReplicaSet owners, so with the real reader the ready pods without a
sample went uncounted and 1 sample of 6 at 10 % scaled a Deployment from 6 to 1.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from canned import NOW, Answer, CannedPrometheus, series, vector

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.decide import decide
from autoscaler.core.model import ControllerState, MetricKind, Observation, ServicePolicy
from autoscaler.core.reasons import Reason
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

PODS = 6
POLICY = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=70.0, min_replicas=1, max_replicas=20)


def pod_name(index: int) -> str:
    return o.deployment_pod("chat", index, "ml")["metadata"]["name"]


def util(index: int, percent: float) -> dict[str, object]:
    labels = {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "gpu": "0",
        "UUID": f"GPU-{index}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": f"gpu-{index}",
        "namespace": "ml",
        "pod": pod_name(index),
        "container": "server",
    }
    return series(labels, str(percent))


@pytest.fixture(scope="module")
def snapshot() -> Iterator[ClusterSnapshot]:
    """Six Running, Ready pods of ml/chat (one GPU each, owned by the Deployment's ReplicaSet), read for real."""
    server = FakeApiServer().start()
    try:
        server.seed(
            [o.node(f"gpu-{i}") for i in range(PODS)],
            [o.deployment_pod("chat", i, "ml", node_name=f"gpu-{i}") for i in range(PODS)],
            o.deployment("chat", "ml", replicas=PODS),
        )
        with tempfile.TemporaryDirectory() as tmp:
            api = load_api_client("kubeconfig", server.write_kubeconfig(Path(tmp) / "kubeconfig.yaml"))
            try:
                yield KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
            finally:
                api.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def observe(canned: CannedPrometheus, snapshot: ClusterSnapshot, samples: list[dict[str, object]]) -> Observation:
    canned.answers = {"util": Answer(vector(*samples))}
    source = PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))
    try:
        return source.observe([POLICY], NOW, cluster=snapshot)
    finally:
        source.close()


def test_the_reader_names_the_deployment_and_the_adapter_counts_its_pods(
    canned: CannedPrometheus, snapshot: ClusterSnapshot
) -> None:
    assert {(p.owner_kind, p.owner_name) for p in snapshot.pods} == {("Deployment", "chat")}
    obs = observe(canned, snapshot, [util(i, 10) for i in range(PODS)])
    chat = obs.services["ml/chat"]
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.missing, chat.pods.unready) == (6, 0, 0)


@pytest.mark.parametrize("reporting", [1, 3, 5])
def test_k_of_n_pods_reporting_low_never_scales_down(
    canned: CannedPrometheus, snapshot: ClusterSnapshot, reporting: int
) -> None:
    obs = observe(canned, snapshot, [util(i, 10) for i in range(reporting)])
    chat = obs.services["ml/chat"]
    assert chat.pods is not None
    assert (chat.pods.ready_with_metric, chat.pods.missing) == (reporting, PODS - reporting)
    assert chat.stale_reasons == ()
    assert any(f"{PODS - reporting} of {PODS} ready pods without a valid sample" in r for r in chat.partial_reasons)
    plan, _ = decide(obs, ControllerState(), {POLICY.key: POLICY}, NOW)
    (decision,) = plan.decisions
    assert (decision.current_replicas, decision.desired_replicas, decision.reason) == (6, 6, Reason.METRICS_PARTIAL)
    assert plan.actions == ()


@pytest.mark.parametrize("reporting", [3, 5])
def test_k_of_n_pods_reporting_busy_still_scales_up(
    canned: CannedPrometheus, snapshot: ClusterSnapshot, reporting: int
) -> None:
    """The HPA's rule on a scale-up: a pod without a sample counts as idle, so the step is smaller, not blocked."""
    obs = observe(canned, snapshot, [util(i, 100) for i in range(reporting)])
    plan, _ = decide(obs, ControllerState(), {POLICY.key: POLICY}, NOW)
    (decision,) = plan.decisions
    # 3 of 6 at 100 % (missing as 0): ratio 300/420 = 0.71, a scale-down by the samples alone: held at 6
    # 5 of 6 at 100 %: ratio 500/420 = 1.19 -> ceil(6 * 1.19) = 8
    expected = {3: 6, 5: 8}[reporting]
    assert decision.desired_replicas == expected
    assert decision.reason is (Reason.METRIC_ABOVE_TARGET if expected > 6 else Reason.METRICS_PARTIAL)
