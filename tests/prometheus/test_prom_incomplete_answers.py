"""Answers that look complete but are not must never let a service scale down: Prometheus/Thanos/Mimir warnings
(HTTP 200, status success, a partial result), a NaN latency while requests wait, and ready replicas that report
nothing (time-sliced or MIG GPUs, absent from the cluster snapshot). Canned answers over real HTTP."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from canned import HEALTHY, NOW, P0, P1, Answer, CannedPrometheus, app, gpu, series, vector

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import ControllerState, MetricKind, Observation, ServicePolicy
from autoscaler.policy import QueriesSpec

WARNING = "No StoreAPIs matched for this query; partial response: store 10.0.3.7:10901 unavailable"
RS = P0.rsplit("-", 1)[0]


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def observe(
    canned: CannedPrometheus,
    answers: dict[str, Any],
    policy: ServicePolicy,
    cluster: ClusterSnapshot | None = None,
    queries: QueriesSpec | None = None,
) -> Observation:
    canned.answers = {k: v if isinstance(v, Answer) else Answer(v) for k, v in answers.items()}
    source = PrometheusMetricsSource(
        PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5),
        service_queries={policy.key: queries} if queries else None,
    )
    return source.observe([policy], NOW, cluster=cluster)


def desired_after_window(obs: Observation, policy: ServicePolicy) -> int:
    """The replicas decided once the scale-down stabilisation window has passed."""
    state = ControllerState()
    for t in (NOW - 400, NOW):
        plan, state = decide(obs, state, {policy.key: policy}, t)
    return plan.decisions[0].desired_replicas


def snapshot(*pods: str, ready_replicas: int = 2) -> ClusterSnapshot:
    return ClusterSnapshot(
        time=NOW,
        deployments=(DeploymentInfo("ml", "chat", 2, ready_replicas),),
        pods=tuple(
            PodInfo("ml", p, "node-a", 1, 0, "Running", True, owner_kind="ReplicaSet", owner_name=RS) for p in pods
        ),
    )


def with_warning(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "warnings": [WARNING]}


# ---- warnings: a successful answer that says it may be partial ----------------------------------------------------


def test_warning_on_an_override_makes_its_service_partial(canned: CannedPrometheus) -> None:
    answers = copy.deepcopy(HEALTHY)
    answers["override"] = with_warning(vector(series({"autoscaler_service": "ml/chat"}, "3")))
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=1.0)
    override = 'sum(rate(vllm:request_success_total{namespace="{namespace}",pod=~"{name}-.*"}[2m]))'
    seen = observe(canned, answers, policy, queries=QueriesSpec(requestRate=override)).services[policy.key]
    assert seen.metric_total == 3.0 and seen.stale_reasons == ()
    assert any("warning" in r and "10.0.3.7" in r for r in seen.partial_reasons), seen


@pytest.mark.parametrize(
    ("family", "metric"),
    [
        ("util", MetricKind.GPU_UTILIZATION),
        ("rate", MetricKind.REQUEST_RATE),
        ("queue", MetricKind.QUEUE_DEPTH),
    ],
)
def test_warning_on_the_scaling_family_forbids_scale_down(
    canned: CannedPrometheus, family: str, metric: MetricKind
) -> None:
    answers = copy.deepcopy(HEALTHY)
    answers[family] = with_warning(answers[family])
    policy = ServicePolicy("ml", "chat", metric=metric, target=1000.0, min_replicas=1)
    obs = observe(canned, answers, policy, cluster=snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert seen.stale_reasons == () and any(WARNING[:20] in r for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) == 2


def test_warning_on_the_latency_of_a_guarded_service_is_partial(canned: CannedPrometheus) -> None:
    answers = copy.deepcopy(HEALTHY)
    answers["latency"] = with_warning(answers["latency"])
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0)
    seen = observe(canned, answers, policy, cluster=snapshot(P0, P1)).services[policy.key]
    assert any(r.startswith("latency:") and "warning" in r for r in seen.partial_reasons), seen


def test_answer_without_warnings_is_complete(canned: CannedPrometheus) -> None:
    answers = {k: {**v, "warnings": []} for k, v in copy.deepcopy(HEALTHY).items()}
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0)
    seen = observe(canned, answers, policy, cluster=snapshot(P0, P1)).services[policy.key]
    assert (seen.stale_reasons, seen.partial_reasons) == ((), ()), seen


# ---- NaN latency: "no traffic" only when nothing waits -----------------------------------------------------------


def _nan_latency(queue: dict[str, Any]) -> dict[str, Any]:
    answers = copy.deepcopy(HEALTHY)
    answers.update(
        util=vector(series(gpu(0), "10"), series(gpu(1), "10")),
        rate=vector(series(app(P0), "0"), series(app(P1), "0")),  # nothing finished in the rate window
        queue=queue,
        latency=vector(series({"namespace": "ml", "deployment": "chat"}, "NaN")),
    )
    return answers


def test_nan_latency_with_requests_waiting_keeps_the_guard_armed(canned: CannedPrometheus) -> None:
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, min_replicas=1)
    queue = vector(series(app(P0), "12"), series(app(P1), "9"))  # 21 requests waiting
    obs = observe(canned, _nan_latency(queue), policy, cluster=snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert any("latency" in r and "21 requests waiting" in r for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) >= 2


def test_nan_latency_with_queue_unknown_keeps_the_guard_armed(canned: CannedPrometheus) -> None:
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, min_replicas=1)
    obs = observe(canned, _nan_latency(vector()), policy, cluster=snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert any("latency" in r and "queue depth unknown" in r for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) >= 2


def test_nan_latency_with_empty_queue_is_idle(canned: CannedPrometheus) -> None:
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, min_replicas=1)
    queue = vector(series(app(P0), "0"), series(app(P1), "0"))
    obs = observe(canned, _nan_latency(queue), policy, cluster=snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert (seen.stale_reasons, seen.partial_reasons) == ((), ()), seen
    assert desired_after_window(obs, policy) == 1


# ---- ready replicas that report nothing (shared or MIG GPUs, not in the snapshot) --------------------------------


def test_ready_replica_without_gpu_series_is_not_dropped(canned: CannedPrometheus) -> None:
    answers = copy.deepcopy(HEALTHY)
    # GPU-0 is time-sliced between P0 and P1; dcgm-exporter labels it with one pod only (P0). P1 reports nothing.
    for family in ("engine", "fb_used", "fb_free"):
        answers[family] = vector(answers[family]["data"]["result"][0])
    answers["util"] = vector(series(gpu(0), "40"))
    # pods requesting nvidia.com/gpu.shared are not in the snapshot: the Deployment only
    policy = ServicePolicy("ml", "chat", min_replicas=1)
    obs = observe(canned, answers, policy, cluster=snapshot())
    seen = obs.services[policy.key]
    assert seen.stale_reasons == () and any("1 of 2 ready replicas" in r for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) >= 2


@pytest.mark.parametrize(("family", "metric"), [("rate", MetricKind.REQUEST_RATE), ("queue", MetricKind.QUEUE_DEPTH)])
def test_ready_replica_without_app_series_is_not_dropped(
    canned: CannedPrometheus, family: str, metric: MetricKind
) -> None:
    answers = copy.deepcopy(HEALTHY)
    answers["rate"] = vector(series(app(P0), "1"))
    answers["queue"] = vector(series(app(P0), "0"))
    policy = ServicePolicy("ml", "chat", metric=metric, target=1000.0, min_replicas=1)
    obs = observe(canned, answers, policy, cluster=snapshot())
    seen = obs.services[policy.key]
    assert seen.stale_reasons == () and any("1 of 2 ready replicas" in r for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) >= 2


def test_every_ready_replica_reporting_is_complete(canned: CannedPrometheus) -> None:
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=1.0)
    seen = observe(canned, copy.deepcopy(HEALTHY), policy, cluster=snapshot()).services[policy.key]
    assert (seen.stale_reasons, seen.partial_reasons) == ((), ()), seen
