"""Table-driven parsing tests over canned Prometheus API answers, served over real HTTP on 127.0.0.1.

One healthy world (service ml/chat: two pods, one GPU each), then one family's answer replaced per case. Each case
says which reason must appear (or that none may), and what the values must be: never a zero where data is missing.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from canned import HEALTHY, NOW, P0, P1, Answer, CannedPrometheus, app, gpu, series, vector

from autoscaler.adapters.prometheus import AGE_TAG, PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import (
    ControllerState,
    GpuSample,
    MetricKind,
    Observation,
    ServiceObservation,
    ServicePolicy,
)


@dataclass
class Case:
    name: str
    answers: dict[str, Any]  # family -> body (JSON-able or bytes), or Answer for a status code
    reason: str | None  # a substring of one of the service's stale reasons; None = must not be stale
    policy: dict[str, Any] = field(default_factory=dict)
    check: Callable[[ServiceObservation, Observation], None] | None = None


def util_with(*items: dict[str, Any]) -> dict[str, Any]:
    return {"util": vector(*items)}


def expect_pods(ok: int, total: float | None, missing: int = 0) -> Callable[[ServiceObservation, Observation], None]:
    def check(s: ServiceObservation, _: Observation) -> None:
        assert s.pods is not None
        assert (s.pods.ready_with_metric, s.pods.missing, s.pods.unready) == (ok, missing, 0)
        if total is not None:
            assert s.pods.metric_sum == pytest.approx(total)

    return check


def expect_no_pods(s: ServiceObservation, _: Observation) -> None:
    assert s.pods is None and s.metric_total is None


def expect_gpu(index: int, reason: str) -> Callable[[ServiceObservation, Observation], None]:
    def check(_: ServiceObservation, obs: Observation) -> None:
        sample: GpuSample = next(g for g in obs.gpus if g.uuid == f"GPU-{index}")
        assert any(reason in r for r in sample.stale_reasons), sample.stale_reasons

    return check


def expect_total(value: float | None) -> Callable[[ServiceObservation, Observation], None]:
    def check(s: ServiceObservation, _: Observation) -> None:
        assert s.metric_total == (pytest.approx(value) if value is not None else None)

    return check


REQUEST_RATE = {"metric": MetricKind.REQUEST_RATE, "target": 1.0}
QUEUE = {"metric": MetricKind.QUEUE_DEPTH, "target": 1.0}
ENGINE = {"metric": MetricKind.ENGINE_ACTIVE, "target": 0.5}
SLO = {"latency_slo_s": 1.0}

CASES = [
    Case("healthy", {}, None, check=expect_pods(2, 100.0)),
    Case(
        "util empty (memory series still show the GPUs)",
        util_with(),
        "2 of 2 ready pods without a valid sample: chat-7d9f8b6c5-qz7kd (GPU 1 of node node-a: no sample (partial",
        check=expect_no_pods,
    ),
    Case(
        "every DCGM family empty",
        {"util": vector(), "engine": vector(), "fb_used": vector(), "fb_free": vector()},
        "no DCGM_FI_DEV_GPU_UTIL series for any pod of ml/chat",
        check=expect_no_pods,
    ),
    Case(
        "util NaN", util_with(series(gpu(0), "40"), series(gpu(1), "NaN")), "value is NaN", check=expect_pods(1, 40, 1)
    ),
    Case(
        "util +Inf",
        util_with(series(gpu(0), "40"), series(gpu(1), "+Inf")),
        "value is +Inf",
        check=expect_pods(1, 40, 1),
    ),
    Case(
        "util -Inf",
        util_with(series(gpu(0), "-Inf"), series(gpu(1), "60")),
        "value is -Inf",
        check=expect_pods(1, 60, 1),
    ),
    Case("util above 100", util_with(series(gpu(0), "40"), series(gpu(1), "100.5")), "value 100.5 outside 0..100"),
    Case("util negative", util_with(series(gpu(0), "-3"), series(gpu(1), "60")), "value -3 outside 0..100"),
    Case(
        "two copies of one GPU's series (scraped twice): one GPU, the larger reading",
        util_with(series(gpu(0), "40"), series(gpu(0, instance="10.0.0.2:9400"), "41"), series(gpu(1), "60")),
        None,
        check=expect_pods(2, 101.0),
    ),
    Case("value not a number", util_with(series(gpu(0), "abc"), series(gpu(1), "60")), "value 'abc' is not a number"),
    Case("value null", util_with(series(gpu(0), None), series(gpu(1), "60")), "value of type NoneType is not a number"),
    Case("value a list", util_with(series(gpu(0), [1]), series(gpu(1), "60")), "value of type list is not a number"),
    Case("value a bool", util_with(series(gpu(0), True), series(gpu(1), "60")), "value of type bool is not a number"),
    Case(
        "range vector instead of instant",
        util_with({"metric": gpu(0), "values": [[NOW, "1"]]}, series(gpu(1), "60")),
        "unexpected sample shape (a range vector)",
    ),
    Case(
        "timestamp not a number",
        util_with({"metric": gpu(0), "value": ["now", "40"]}, series(gpu(1), "60")),
        "timestamp 'now' is not a number",
    ),
    Case(
        "scalar result",
        {"util": {"status": "success", "data": {"resultType": "scalar", "result": [NOW, "1"]}}},
        "result items are not series",
        check=expect_no_pods,
    ),
    Case(
        "result is an object",
        {"util": {"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}},
        "result is dict, not a vector",
    ),
    Case("no data key", {"util": {"status": "success"}}, "not the query API's JSON", check=expect_no_pods),
    Case("HTML body", {"util": b"<html>proxy login</html>"}, "not the query API's JSON"),
    Case("HTTP 503", {"util": Answer(vector(), 503)}, "HTTP Status Code 503", check=expect_no_pods),
    Case("HTTP 422", {"util": Answer({"status": "error", "error": "boom"}, 422)}, "HTTP Status Code 422"),
    Case(
        "sample older than the bound",
        util_with(series(gpu(0), "40"), series(gpu(1), "60"), series({**gpu(1), AGE_TAG: "x"}, "300")),
        "last sample 300s old (> staleness_seconds 120)",
        check=expect_pods(1, 40, 1),
    ),
    Case(
        "answer evaluated long before the tick",
        util_with(series(gpu(0), "40", ts=NOW - 1000), series(gpu(1), "60")),
        "answer evaluated 1000s before the tick",
    ),
    Case(
        "pod mapping absent",
        util_with(series({k: v for k, v in gpu(0).items() if k not in ("namespace", "pod")}, "40")),
        "no sample (partial answer)",
    ),
    Case(
        "utilisation missing for one GPU, memory present",
        util_with(series(gpu(0), "40")),
        "no sample (partial answer)",
        check=expect_pods(1, 40, 1),
    ),
    Case(
        "engine out of range",
        {"engine": vector(series(gpu(0), "0.4"), series(gpu(1), "1.5"))},
        "value 1.5 outside 0..1",
        policy=ENGINE,
        check=expect_pods(1, 0.4, 1),
    ),
    Case("engine family absent, not used", {"engine": vector()}, None, check=expect_pods(2, 100.0)),
    Case(
        "engine family absent, used",
        {"engine": vector()},
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE: 2 of 2 ready pods without a valid sample",
        policy=ENGINE,
        check=expect_no_pods,
    ),
    Case(
        "framebuffer missing for one GPU: the GPU is stale, the util-scaled service is not",
        {"fb_free": vector(series(gpu(0), "51559"))},
        None,
        check=expect_gpu(1, "DCGM_FI_DEV_FB_FREE: no sample (partial answer)"),
    ),
    Case(
        "framebuffer negative",
        {"fb_used": vector(series(gpu(0), "-1"), series(gpu(1), "50000"))},
        None,
        check=expect_gpu(0, "DCGM_FI_DEV_FB_USED: value -1 outside >= 0"),
    ),
    Case("request rate healthy", {}, None, policy=REQUEST_RATE, check=expect_total(3.0)),
    Case(
        "request rate NaN",
        {"rate": vector(series(app(P0), "1"), series(app(P1), "NaN"))},
        f"request rate: pod {P1}: value is NaN",
        policy=REQUEST_RATE,
        check=expect_total(None),
    ),
    Case(
        "request rate +Inf",
        {"rate": vector(series(app(P0), "+Inf"), series(app(P1), "2"))},
        "value is +Inf",
        policy=REQUEST_RATE,
        check=expect_total(None),
    ),
    Case(
        "request rate partial (the queue family shows both pods)",
        {"rate": vector(series(app(P0), "1"))},
        f"request rate: pod {P1}: no sample",
        policy=REQUEST_RATE,
        check=expect_total(None),
    ),
    Case(
        "request rate and queue both empty",
        {"rate": vector(), "queue": vector()},
        "request rate: no series for ml/chat",
        policy=REQUEST_RATE,
        check=expect_total(None),
    ),
    Case(
        "request rate duplicated for one pod",
        {"rate": vector(series(app(P0), "1"), series({**app(P0), "job": "b"}, "1"), series(app(P1), "2"))},
        "2 series (differing in job)",
        policy=REQUEST_RATE,
    ),
    Case(
        "request rate 500",
        {"rate": Answer(vector(), 500)},
        "request rate: Prometheus query failed",
        policy=REQUEST_RATE,
    ),
    Case(
        "request rate 500 while scaling on GPU: not used, not stale",
        {"rate": Answer(vector(), 500)},
        None,
        check=lambda s, _: expect_pods(2, 100.0)(s, _) or (s.request_rate is None or pytest.fail("rate not None")),
    ),
    Case(
        "queue negative", {"queue": vector(series(app(P0), "-1"), series(app(P1), "3"))}, "outside >= 0", policy=QUEUE
    ),
    Case("queue healthy", {}, None, policy=QUEUE, check=expect_total(3.0)),
    Case(
        "latency NaN with traffic and an SLO",
        {"latency": vector(series({"namespace": "ml", "deployment": "chat"}, "NaN"))},
        "latency: value is NaN",
        policy=SLO,
    ),
    Case(
        "latency NaN without traffic: nothing to guard",
        {
            "latency": vector(series({"namespace": "ml", "deployment": "chat"}, "NaN")),
            "rate": vector(series(app(P0), "0"), series(app(P1), "0")),
            "queue": vector(series(app(P0), "0"), series(app(P1), "0")),  # idle only when nothing waits either
        },
        None,
        policy=SLO,
        check=lambda s, _: (s.latency_s is None and s.request_rate == 0) or pytest.fail(repr(s)),
    ),
    Case(
        "latency per pod instead of per service",
        {"latency": vector(series(app(P0), "0.2"), series(app(P1), "0.3"))},
        "latency: 2 series for one service",
        policy=SLO,
    ),
    Case(
        "latency missing without an SLO: not used",
        {"latency": vector()},
        None,
        check=lambda s, _: s.latency_s is None or pytest.fail("latency"),
    ),
    Case("latency missing with an SLO", {"latency": vector()}, "latency: no series for ml/chat", policy=SLO),
]


# Cases whose problem leaves the scaling metric usable but incomplete: one of two pods still reports (or only the SLO
# guard's latency is bad). Their reason goes to ``partial_reasons`` (no scale-down, scale-up allowed), the others'
# to ``stale_reasons`` (hold).
PARTIAL = {
    "util NaN",
    "util +Inf",
    "util -Inf",
    "util above 100",
    "util negative",
    "value not a number",
    "value null",
    "value a list",
    "value a bool",
    "range vector instead of instant",
    "timestamp not a number",
    "sample older than the bound",
    "answer evaluated long before the tick",
    "utilisation missing for one GPU, memory present",
    "engine out of range",
    "latency NaN with traffic and an SLO",
    "latency per pod instead of per service",
    "latency missing with an SLO",
}
assert {c.name for c in CASES} >= PARTIAL


@pytest.fixture(scope="module")
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def observe(canned: CannedPrometheus, answers: dict[str, Any], policy: dict[str, Any]) -> Observation:
    canned.answers = {
        family: body if isinstance(body, Answer) else Answer(body)
        for family, body in {**copy.deepcopy(HEALTHY), **answers}.items()
    }
    source = PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))
    return source.observe([ServicePolicy("ml", "chat", **policy)], NOW)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_canned_answer(canned: CannedPrometheus, case: Case) -> None:
    obs = observe(canned, case.answers, case.policy)
    service = obs.services["ml/chat"]
    if case.reason is None:
        assert (service.stale_reasons, service.partial_reasons) == ((), ()), service
    elif case.name in PARTIAL:
        assert service.stale_reasons == (), service.stale_reasons
        assert any(case.reason in r for r in service.partial_reasons), service.partial_reasons
    else:
        assert any(case.reason in r for r in service.stale_reasons), service.stale_reasons
    if case.check is not None:
        case.check(service, obs)
    # whatever happened, nothing unknown was turned into a number that could read as "idle"
    for value in (service.metric_total, service.request_rate, service.queue_depth, service.latency_s):
        assert value is None or math.isfinite(value)
    if service.pods is not None:
        assert math.isfinite(service.pods.metric_sum)


def test_healthy_world_values(canned: CannedPrometheus) -> None:
    obs = observe(canned, {}, {})
    service = obs.services["ml/chat"]
    assert (service.request_rate, service.queue_depth, service.latency_s) == (3.0, 3.0, 0.25)
    assert [(g.uuid, g.utilization, g.engine_active, g.fb_used_mib, g.fb_free_mib) for g in obs.gpus] == [
        ("GPU-0", 40.0, 0.4, 30000.0, 51559.0),
        ("GPU-1", 60.0, 0.6, 50000.0, 31559.0),
    ]
    assert {(g.node, g.model_name, g.namespace, g.pod) for g in obs.gpus} == {
        ("node-a", "NVIDIA H100 80GB HBM3", "ml", P0),
        ("node-a", "NVIDIA H100 80GB HBM3", "ml", P1),
    }
    families = [f for f, _ in canned.queries[-7:]]
    assert families[0] == "util"  # alone first, as the probe; the others concurrently, in any order
    assert sorted(families[1:]) == ["engine", "fb_free", "fb_used", "latency", "queue", "rate"]
    # the DCGM queries ask for the ages of old samples in the same request
    util_query = canned.queries[-7][1]
    assert "timestamp(DCGM_FI_DEV_GPU_UTIL)" in util_query and "> 120" in util_query


def test_other_deployments_and_non_deployment_pods_are_not_mixed_in(canned: CannedPrometheus) -> None:
    util = vector(
        series(gpu(0), "40"),
        series(gpu(1), "60"),
        series(gpu(0, pod="chat-v2-7d9f8b6c5-x2x4b", UUID="GPU-2"), "99"),  # another Deployment, same prefix
        series(gpu(0, pod="chat-0", UUID="GPU-3"), "99"),  # a StatefulSet pod
        series(gpu(0, namespace="other", UUID="GPU-4"), "99"),  # same pod name, other namespace
    )
    obs = observe(canned, {"util": util}, {})
    pods = obs.services["ml/chat"].pods
    assert pods is not None and (pods.ready_with_metric, pods.metric_sum) == (2, 100.0)
    assert len(obs.gpus) == 5


def test_an_internal_error_holds_every_service(canned: CannedPrometheus, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(PrometheusMetricsSource, "_assemble_gpus", boom)
    obs = observe(canned, {}, {})
    assert obs.services["ml/chat"].stale_reasons == ("metrics adapter error: bug",)


# ---- multi-GPU pods: each pod must report every GPU it requests ------------------------------------------------
#
# Service ml/chat with two ready pods of two GPUs each (the cluster snapshot says so), every GPU at 20 % against a
# 70 % target: a complete answer scales 2 -> 1. dcgm-exporter leaves a GPU it cannot read out of its answer
# altogether, so a pod that reports fewer GPUs than it requests is a pod without a valid sample: the answer is
# partial (no scale-down), never the mean of the GPUs that happened to answer.

MULTI_GPUS = {P0: (0, 1), P1: (2, 3)}  # pod -> its GPU indexes
DCGM_METRICS = {
    "util": ("DCGM_FI_DEV_GPU_UTIL", "20"),
    "engine": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.2"),
    "fb_used": ("DCGM_FI_DEV_FB_USED", "1000"),
    "fb_free": ("DCGM_FI_DEV_FB_FREE", "79000"),
}


def multi_gpu(pod: str, index: int, metric: str) -> dict[str, str]:
    return gpu(0, __name__=metric, pod=pod, gpu=str(index % 2), UUID=f"GPU-{index}")


def multi_gpu_answers(absent: Collection[int] = (), util: dict[int, Any] | None = None) -> dict[str, Any]:
    """Every DCGM family for every GPU but those in ``absent`` (missing from every family); ``util`` overrides."""
    out: dict[str, Any] = {}
    for family, (metric, value) in DCGM_METRICS.items():
        items = [
            series(multi_gpu(pod, index, metric), (util or {}).get(index, value) if family == "util" else value)
            for pod, indexes in MULTI_GPUS.items()
            for index in indexes
            if index not in absent
        ]
        out[family] = vector(*items)
    return out


def multi_gpu_snapshot(gpus_per_pod: int = 2) -> ClusterSnapshot:
    rs = P0.rsplit("-", 1)[0]
    pods = tuple(
        PodInfo("ml", pod, "node-a", gpus_per_pod, 0, "Running", True, owner_kind="ReplicaSet", owner_name=rs)
        for pod in MULTI_GPUS
    )
    return ClusterSnapshot(time=NOW, deployments=(DeploymentInfo("ml", "chat", 2, 2),), pods=pods)


@dataclass
class MultiGpuCase:
    name: str
    answers: dict[str, Any]
    kind: str  # "complete" | "partial" | "stale": where the problem goes
    reason: str | None  # a substring of a partial/stale reason
    pods: tuple[int, float, int] | None  # (ready_with_metric, metric_sum, missing), None = no PodMetrics
    desired: int  # replicas after a scale-down window with this observation (2 now)
    gpus_per_pod: int = 2


MULTI_GPU_CASES = [
    MultiGpuCase("every GPU reports", multi_gpu_answers(), "complete", None, (2, 40.0, 0), 1),
    MultiGpuCase(
        "one GPU of a 2-GPU pod absent from every family",
        multi_gpu_answers(absent={3}),
        "partial",
        f"1 of 2 ready pods without a valid sample: {P1} (series for only 1 of its 2 GPUs)",
        (1, 20.0, 1),
        2,
    ),
    MultiGpuCase(
        "one GPU of every pod absent from every family",
        multi_gpu_answers(absent={1, 3}),
        "stale",
        "2 of 2 ready pods without a valid sample",
        None,
        2,
    ),
    MultiGpuCase(
        "one GPU of a pod reports NaN",
        multi_gpu_answers(util={3: "NaN"}),
        "partial",
        f"{P1} (GPU 1 of node node-a: value is NaN)",
        (1, 20.0, 1),
        2,
    ),
    MultiGpuCase(
        "one GPU of a pod reports +Inf",
        multi_gpu_answers(util={3: "+Inf"}),
        "partial",
        f"{P1} (GPU 1 of node node-a: value is +Inf)",
        (1, 20.0, 1),
        2,
    ),
    MultiGpuCase(
        "utilisation absent for one GPU, its memory series present",
        {**multi_gpu_answers(), "util": multi_gpu_answers(absent={3})["util"]},
        "partial",
        "no sample (partial answer)",
        (1, 20.0, 1),
        2,
    ),
    # A GPU request the snapshot does not count (0: a MIG profile resource, say) cannot be checked: as before.
    MultiGpuCase("GPU count unknown", multi_gpu_answers(absent={3}), "complete", None, (2, 40.0, 0), 1, gpus_per_pod=0),
]


@pytest.mark.parametrize("case", MULTI_GPU_CASES, ids=[c.name for c in MULTI_GPU_CASES])
def test_multi_gpu_pods(canned: CannedPrometheus, case: MultiGpuCase) -> None:
    canned.answers = {family: Answer(body) for family, body in {**copy.deepcopy(HEALTHY), **case.answers}.items()}
    source = PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))
    policy = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=70.0, min_replicas=1)
    obs = source.observe([policy], NOW, cluster=multi_gpu_snapshot(case.gpus_per_pod))
    service = obs.services["ml/chat"]
    found = {"complete": (), "partial": service.partial_reasons, "stale": service.stale_reasons}[case.kind]
    other = {"complete": (), "partial": service.stale_reasons, "stale": service.partial_reasons}[case.kind]
    assert other == (), service
    if case.kind == "complete":
        assert (service.stale_reasons, service.partial_reasons) == ((), ()), service
    else:
        assert case.reason is not None and any(case.reason in r for r in found), found
    if case.pods is None:
        assert service.pods is None
    else:
        assert service.pods is not None
        ok, total, missing = case.pods
        assert (service.pods.ready_with_metric, service.pods.missing, service.pods.unready) == (ok, missing, 0)
        assert service.pods.metric_sum == pytest.approx(total)
    state = ControllerState()
    for t in (NOW - 400, NOW):  # past the scale-down stabilisation window
        plan, state = decide(obs, state, {policy.key: policy}, t)
    assert (plan.decisions[0].current_replicas, plan.decisions[0].desired_replicas) == (2, case.desired)
