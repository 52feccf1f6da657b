"""Defects found reviewing the Prometheus adapter, each kept as its reproduction (canned answers over real HTTP).

* a 200 whose body says ``"status": "error"`` was read as a success when it also carried ``data``;
* PromQL *info* annotations (Prometheus 2.47-2.53 and Thanos put them under ``warnings``: "metric might not be a
  counter", "histogram_quantile needed to be fixed for monotonicity") were read as a partial answer, which forbade
  every scale-down of a Triton service (its counter has no ``_total``) or of an SLO-guarded one;
* one GPU reported by two dcgm-exporters that name the node differently (``Hostname``: the node vs the exporter
  pod) was two GPUs: counted twice in its pod's mean, and standing in for a GPU of the pod that did not report;
* an instant answer evaluated later than the time asked for (a proxy or cache ignoring ``?time=``) was used.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from canned import HEALTHY, NOW, P0, P1, Answer, CannedPrometheus, gpu, series, vector

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import ControllerState, MetricKind, Observation, ServicePolicy

RS = P0.rsplit("-", 1)[0]
THANOS_PARTIAL = "No StoreAPIs matched for this query; partial response: store 10.0.3.7:10901 unavailable"
INFO_COUNTER = (
    "PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: "
    '"vllm:request_success" (1:52)'
)
INFO_MONOTONIC = (
    "PromQL info: input to histogram_quantile needed to be fixed for monotonicity (see "
    "https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile) for metric name "
    '"vllm:e2e_request_latency_seconds_bucket"'
)


@pytest.fixture(scope="module")
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def observe(
    canned: CannedPrometheus,
    answers: dict[str, Any],
    policy: ServicePolicy,
    cluster: ClusterSnapshot | None = None,
    now: float = NOW,
) -> Observation:
    canned.answers = {
        family: body if isinstance(body, Answer) else Answer(body)
        for family, body in {**copy.deepcopy(HEALTHY), **answers}.items()
    }
    source = PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))
    try:
        return source.observe([policy], now, cluster=cluster)
    finally:
        source.close()


def desired_after_window(obs: Observation, policy: ServicePolicy) -> int:
    state = ControllerState()
    for t in (NOW - 400, NOW):  # past the scale-down stabilisation window
        plan, state = decide(obs, state, {policy.key: policy}, t)
    return plan.decisions[0].desired_replicas


def snapshot(gpus_per_pod: int = 1) -> ClusterSnapshot:
    pods = tuple(
        PodInfo("ml", p, "node-a", gpus_per_pod, 0, "Running", True, owner_kind="ReplicaSet", owner_name=RS)
        for p in (P0, P1)
    )
    return ClusterSnapshot(time=NOW, deployments=(DeploymentInfo("ml", "chat", 2, 2),), pods=pods)


def with_warnings(body: dict[str, Any], *warnings: str) -> dict[str, Any]:
    return {**copy.deepcopy(body), "warnings": list(warnings)}


# ---- a 200 with status "error" -------------------------------------------------------------------------------------


def test_a_200_with_status_error_and_data_is_not_a_success(canned: CannedPrometheus) -> None:
    body = {
        "status": "error",
        "errorType": "timeout",
        "error": "query timed out in expression evaluation",
        "data": copy.deepcopy(HEALTHY["util"]["data"]),  # a half-built answer a proxy passed on
    }
    policy = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=70.0, min_replicas=1)
    obs = observe(canned, {"util": body}, policy, snapshot())
    chat = obs.services["ml/chat"]
    assert chat.pods is None, chat
    assert any("query timed out in expression evaluation" in r for r in chat.stale_reasons), chat.stale_reasons
    assert all(g.utilization is None for g in obs.gpus)
    assert desired_after_window(obs, policy) == 2


def test_a_200_with_status_error_names_the_error(canned: CannedPrometheus) -> None:
    body = {"status": "error", "errorType": "execution", "error": "expanding series: context canceled"}
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=1.0)
    chat = observe(canned, {"rate": body}, policy).services["ml/chat"]
    assert chat.metric_total is None
    assert any("execution: expanding series: context canceled" in r for r in chat.stale_reasons), chat.stale_reasons


# ---- PromQL info annotations are not a partial answer -------------------------------------------------------------


def test_a_promql_info_annotation_does_not_forbid_a_scale_down(canned: CannedPrometheus) -> None:
    # Triton's counter has no _total suffix: Prometheus 2.47-2.53 (and Thanos) add this info to every rate() answer
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=10.0, min_replicas=1)
    obs = observe(canned, {"rate": with_warnings(HEALTHY["rate"], INFO_COUNTER)}, policy, snapshot())
    chat = obs.services["ml/chat"]
    assert (chat.stale_reasons, chat.partial_reasons) == ((), ()), chat
    assert chat.metric_total == 3.0
    assert desired_after_window(obs, policy) == 1


def test_a_histogram_monotonicity_info_does_not_block_the_slo_guard(canned: CannedPrometheus) -> None:
    policy = ServicePolicy(
        "ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=90.0, min_replicas=1, latency_slo_s=1.0
    )
    answers = {
        "util": vector(series(gpu(0), "20"), series(gpu(1), "20")),
        "latency": with_warnings(HEALTHY["latency"], INFO_MONOTONIC),
    }
    obs = observe(canned, answers, policy, snapshot())
    chat = obs.services["ml/chat"]
    assert (chat.stale_reasons, chat.partial_reasons) == ((), ()), chat
    assert chat.latency_s == 0.25
    assert desired_after_window(obs, policy) == 1


@pytest.mark.parametrize(
    "warnings",
    [
        (THANOS_PARTIAL,),
        (INFO_COUNTER, THANOS_PARTIAL),  # a real warning next to an info still makes the answer partial
        ('PromQL warning: bucket label "le" is missing or has a malformed value of "x"',),
    ],
    ids=["partial response", "info and partial response", "PromQL warning"],
)
def test_warnings_other_than_infos_still_forbid_a_scale_down(
    canned: CannedPrometheus, warnings: tuple[str, ...]
) -> None:
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=10.0, min_replicas=1)
    obs = observe(canned, {"rate": with_warnings(HEALTHY["rate"], *warnings)}, policy, snapshot())
    chat = obs.services["ml/chat"]
    assert chat.stale_reasons == () and chat.partial_reasons, chat
    assert all("PromQL info" not in r for r in chat.partial_reasons), chat.partial_reasons
    assert desired_after_window(obs, policy) == 2


# ---- one GPU, two exporters naming the node differently -----------------------------------------------------------


def dcgm(pod: str, index: int, metric: str, **extra: str) -> dict[str, str]:
    return gpu(0, __name__=metric, pod=pod, gpu=str(index % 2), UUID=f"GPU-{index}", **extra)


FAMILIES = {
    "util": ("DCGM_FI_DEV_GPU_UTIL", "20"),
    "engine": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.2"),
    "fb_used": ("DCGM_FI_DEV_FB_USED", "1000"),
    "fb_free": ("DCGM_FI_DEV_FB_FREE", "79000"),
}


def two_exporters(gpus: dict[str, tuple[int, ...]], doubled: int, util: dict[int, str] | None = None) -> dict[str, Any]:
    """Every family for ``gpus`` (pod -> GPU indexes), GPU ``doubled`` also from a second exporter whose Hostname is
    its own pod's name (dcgm-exporter without NODE_NAME) and whose instance and job differ."""
    out: dict[str, Any] = {}
    for family, (metric, value) in FAMILIES.items():
        items = []
        for pod, indexes in gpus.items():
            for i in indexes:
                v = (util or {}).get(i, value) if family == "util" else value
                items.append(series(dcgm(pod, i, metric), v))
                if i == doubled:
                    other = {"Hostname": "nvidia-dcgm-exporter-7x2kq", "instance": "10.0.9.9:9400", "job": "gpu"}
                    items.append(series(dcgm(pod, i, metric, **other), v))
        out[family] = vector(*items)
    return out


def test_one_gpu_from_two_exporters_does_not_stand_in_for_a_missing_gpu(canned: CannedPrometheus) -> None:
    # P1 requests 2 GPUs; GPU-3 is absent, GPU-2 arrives twice: the pod must not look complete at 20 %
    answers = two_exporters({P0: (0, 1), P1: (2,)}, doubled=2)
    policy = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=70.0, min_replicas=1)
    obs = observe(canned, answers, policy, snapshot(gpus_per_pod=2))
    chat = obs.services["ml/chat"]
    assert chat.stale_reasons == (), chat.stale_reasons
    assert any(P1 in r and "series for only 1 of its 2 GPUs" in r for r in chat.partial_reasons), chat
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.missing) == (1, 1)
    assert desired_after_window(obs, policy) == 2


def test_one_gpu_from_two_exporters_is_one_gpu_not_counted_twice(canned: CannedPrometheus) -> None:
    # P0's GPU-0 at 90 % is doubled, GPU-1 at 10 %: the pod's mean is (90 + 10) / 2, not (90 + 90 + 10) / 3
    answers = two_exporters({P0: (0, 1), P1: (2, 3)}, doubled=0, util={0: "90", 1: "10"})
    policy = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=70.0, min_replicas=1)
    obs = observe(canned, answers, policy, snapshot(gpus_per_pod=2))
    assert sorted(g.uuid for g in obs.gpus) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    gpu0 = next(g for g in obs.gpus if g.uuid == "GPU-0")
    assert gpu0.utilization == 90 and gpu0.stale_reasons == (), gpu0
    chat = obs.services["ml/chat"]
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.metric_sum) == (2, 70.0)
    assert chat.pods.missing == 0


def test_gpus_without_uuid_are_still_told_apart_by_node(canned: CannedPrometheus) -> None:
    util = vector(
        series(gpu(0, UUID=""), "40"),
        series(gpu(0, UUID="", Hostname="node-b", pod="chat-7d9f8b6c5-zzzzz"), "60"),
    )
    obs = observe(canned, {"util": util, "engine": vector(), "fb_used": vector(), "fb_free": vector()},
                  ServicePolicy("ml", "chat"))  # fmt: skip
    assert sorted((g.node, g.utilization) for g in obs.gpus) == [("node-a", 40.0), ("node-b", 60.0)]


# ---- an instant answer for another time than asked ----------------------------------------------------------------


def test_an_answer_evaluated_after_the_tick_is_not_used(canned: CannedPrometheus) -> None:
    # `autoscaler plan --time T` an hour ago, through a cache that ignores ?time=: the answer is about now, not T
    later = NOW + 3600
    util = vector(series(gpu(0), "40", ts=later), series(gpu(1), "60", ts=later))
    policy = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=70.0)
    chat = observe(canned, {"util": util}, policy).services["ml/chat"]
    assert chat.pods is None
    assert any("after the time asked for" in r for r in chat.stale_reasons), chat.stale_reasons


def test_an_answer_stamped_at_the_tick_to_the_millisecond_is_used(canned: CannedPrometheus) -> None:
    util = vector(series(gpu(0), "40", ts=NOW + 0.0004), series(gpu(1), "60", ts=NOW - 0.0004))
    chat = observe(canned, {"util": util}, ServicePolicy("ml", "chat"), now=NOW).services["ml/chat"]
    assert (chat.stale_reasons, chat.partial_reasons) == ((), ()), chat


# ---- override batches must fit a proxy's URL limit once URL-encoded ----------------------------------------------

URL_LIMIT = 8192  # nginx's default large_client_header_buffers (8k), the request line included


class UrlLimitedPrometheus(CannedPrometheus):
    """Canned answers behind a proxy that refuses a request line longer than ``URL_LIMIT`` with 414."""

    rejected: int = 0

    def _handle(self, req: Any) -> None:
        if len(f"GET {req.path} HTTP/1.1") > URL_LIMIT:
            self.rejected += 1
            self._reply(req, Answer(b"<html>414 Request-URI Too Large</html>", status=414))
            return
        super()._handle(req)


def test_override_batches_fit_the_url_limit_they_are_sized_for() -> None:
    from autoscaler.adapters.prometheus import SERVICE_TAG
    from autoscaler.policy import QueriesSpec

    override = 'sum(rate(vllm:request_success_total{namespace="{namespace}",pod=~"{name}-.*"}[{window}]))'
    services = [
        ServicePolicy("inference-team", f"chat-model-{i:03d}", metric=MetricKind.REQUEST_RATE, target=1.0)
        for i in range(80)
    ]
    server = UrlLimitedPrometheus().start()
    try:
        server.answers = {k: Answer(v) for k, v in copy.deepcopy(HEALTHY).items()}
        server.answers["override"] = Answer(
            vector(*(series({SERVICE_TAG: s.key}, str(i)) for i, s in enumerate(services)))
        )
        source = PrometheusMetricsSource(
            PrometheusSettings(url=server.url, retries=0, timeout_seconds=5),
            service_queries={s.key: QueriesSpec(requestRate=override) for s in services},
        )
        obs = source.observe(services, NOW)
        source.close()
        assert [obs.services[s.key].metric_total for s in services] == [float(i) for i in range(80)]
        overrides = [q for family, q in server.queries if family == "override"]
        assert server.rejected == 0, f"{server.rejected} of {len(overrides)} override requests refused (414)"
        assert len(overrides) < 10  # batched, not one per service
    finally:
        server.stop()


# ---- history range queries: a partial or failed answer is no history ------------------------------------------------


def _matrix(points: list[tuple[float, str]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[t, v] for t, v in points]}]},
    }
    body.update(extra)
    return body


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # Thanos with a store down: part of the demand; fitted, the forecast came out too low
        (Answer(_matrix([(NOW - 120, "3"), (NOW - 60, "3")], warnings=[THANOS_PARTIAL])), "may be partial"),
        # a proxy passing a failed evaluation on under HTTP 200, with a half-built result
        (
            Answer({"status": "error", "errorType": "timeout", "error": "query timed out",
                    "data": {"resultType": "matrix", "result": []}}),
            "timeout: query timed out",
        ),
        (Answer(b"<html>bad gateway</html>", status=502), "HTTP Status Code 502"),
        (Answer(b"{not json"), "not the query API's JSON"),
    ],
)
def test_a_partial_or_failed_range_answer_is_no_history(
    canned: CannedPrometheus, answer: Answer, expected: str
) -> None:
    """``history`` went through the client's custom_query_range, which returns only ``data.result``: an answer
    flagged partial, or a 200 whose body says error, was fitted as the service's whole history."""
    from autoscaler.ports import PortError

    canned.answers = {"rate": answer}
    source = PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=3.0)
    try:
        with pytest.raises(PortError, match=expected):
            source.history(policy, "request_rate", NOW - 120, NOW - 60, 60.0)
    finally:
        source.close()


def test_a_range_answer_with_only_infos_is_history(canned: CannedPrometheus) -> None:
    canned.answers = {"rate": Answer(_matrix([(NOW - 120, "3"), (NOW - 60, "4")], infos=[INFO_COUNTER],
                                             warnings=[INFO_COUNTER]))}  # fmt: skip
    source = PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=3.0)
    try:
        series = source.history(policy, "request_rate", NOW - 120, NOW - 60, 60.0)
    finally:
        source.close()
    assert series.times == (NOW - 120, NOW - 60) and series.values == (3.0, 4.0)


@pytest.mark.parametrize("field", ["rate_window_seconds", "staleness_seconds"])
def test_a_duration_below_a_millisecond_is_refused_not_rendered_as_0ms(field: str) -> None:
    """PromQL has no duration below 1ms: 0.0004 s was rendered "0ms" into every query, which Prometheus refused at
    each tick with an error naming no setting."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=field):
        PrometheusSettings(url="http://127.0.0.1:9", **{field: 0.0004})
    assert PrometheusSettings(url="http://127.0.0.1:9", **{field: 0.001}).template_values()
