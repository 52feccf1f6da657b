"""The adapter against a real Prometheus holding history generated from the Alibaba GenAI 2026 trace.

Every expected value is computed in Python from the trace (``genai_dataset``), independently of PromQL.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
from genai_dataset import (
    HOSTILE_DECOYS,
    HOSTILE_VALUES,
    MODEL,
    NAMESPACE,
    SERVICES,
    TEMPLATE_HASH,
    GenaiDataset,
    fb_used,
)
from prom_helpers import genai_services, genai_settings
from promserver import PrometheusServer

from autoscaler.adapters.prometheus import PrometheusMetricsSource, connect
from autoscaler.adapters.promql import render
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.policy import QueriesSpec

pytestmark = pytest.mark.integration

REL = 1e-9


def test_check_reports_the_server(genai_prometheus: PrometheusServer) -> None:
    source = connect(genai_settings(genai_prometheus.url))
    info = source.check()
    assert info.url == genai_prometheus.url
    assert info.version and info.version.startswith("2.")


def test_observation_matches_the_trace(genai: GenaiDataset, genai_source: PrometheusMetricsSource) -> None:
    times = genai.active_times()
    for t in (times[0], times[len(times) // 2], times[-1]):
        obs = genai_source.observe(genai_services(latency_slo_s=10.0), t)
        assert genai_source.last_stats.queries == 7  # one per family
        for service in SERVICES:
            got = obs.services[f"{NAMESPACE}/{service}"]
            assert got.stale_reasons == (), got.stale_reasons
            pods = genai.pods_of(service)
            expected_sum = sum(genai.util_at(p.name, t) or 0.0 for p in pods)
            assert got.pods is not None
            assert (got.pods.ready_with_metric, got.pods.missing, got.pods.unready) == (len(pods), 0, 0)
            assert got.pods.metric_sum == pytest.approx(expected_sum, rel=REL, abs=1e-9)
            assert got.request_rate == pytest.approx(genai.request_rate(service, t), rel=1e-6)
            assert got.queue_depth == pytest.approx(sum(genai.queue(p.name, t) for p in pods), rel=REL)
            assert got.latency_s == pytest.approx(genai.latency(service, t, 0.95), rel=1e-6)
        by_uuid = {g.uuid: g for g in obs.gpus}
        for pod in genai.pods:
            gpu = by_uuid[pod.uuid]
            util = genai.util_at(pod.name, t)
            assert util is not None
            assert (gpu.node, gpu.gpu, gpu.model_name, gpu.namespace, gpu.pod) == (
                pod.node,
                pod.gpu,
                MODEL,
                NAMESPACE,
                pod.name,
            )
            assert gpu.utilization == pytest.approx(util, rel=REL)
            assert gpu.engine_active == pytest.approx(util / 100, rel=REL)
            assert gpu.fb_used_mib == pytest.approx(fb_used(util), rel=REL)
            assert gpu.fb_used_mib + gpu.fb_free_mib == pytest.approx(81920.0)
            assert gpu.stale_reasons == ()


def test_request_rate_and_queue_services_use_service_totals(
    genai: GenaiDataset, genai_source: PrometheusMetricsSource
) -> None:
    t = genai.active_times()[10]
    services = [
        ServicePolicy(NAMESPACE, "sd-xl", metric=MetricKind.REQUEST_RATE, target=0.1),
        ServicePolicy(NAMESPACE, "sd-turbo", metric=MetricKind.QUEUE_DEPTH, target=1),
        ServicePolicy(NAMESPACE, "sd-lora", metric=MetricKind.ENGINE_ACTIVE, target=0.5),
    ]
    obs = genai_source.observe(services, t)
    xl, turbo, lora = (obs.services[s.key] for s in services)
    assert xl.pods is None and xl.metric_total == pytest.approx(genai.request_rate("sd-xl", t), rel=1e-6)
    assert turbo.metric_total == pytest.approx(sum(genai.queue(p.name, t) for p in genai.pods_of("sd-turbo")))
    assert lora.pods is not None and lora.metric_total is None
    expected = sum((genai.util_at(p.name, t) or 0.0) / 100 for p in genai.pods_of("sd-lora"))
    assert lora.pods.metric_sum == pytest.approx(expected, rel=REL)
    assert all(not o.stale_reasons for o in obs.services.values())


def test_query_count_does_not_grow_with_services(genai: GenaiDataset, genai_source: PrometheusMetricsSource) -> None:
    t = genai.active_times()[0]
    many = [ServicePolicy(NAMESPACE, f"svc-{i}") for i in range(300)] + genai_services()
    genai_source.observe(many[:1], t)
    one = genai_source.last_stats.queries
    genai_source.observe(many, t)
    assert genai_source.last_stats.queries == one == 7


def test_broken_series_on_the_real_server_are_never_read_as_zero(
    genai: GenaiDataset, genai_source: PrometheusMetricsSource
) -> None:
    t = genai.active_times()[0]
    obs = genai_source.observe([ServicePolicy(NAMESPACE, "broken")], t)
    broken = obs.services[f"{NAMESPACE}/broken"]
    # one pod's GPU is scraped twice (two jobs): copies of one reading, so that pod counts; the other two are
    # broken (NaN, out of range): partial, so the service may scale up on the one valid pod but never down
    assert broken.stale_reasons == (), broken.stale_reasons
    text = " ".join(broken.partial_reasons)
    assert "2 of 3 ready pods without a valid sample" in text
    assert "value is NaN" in text
    assert "value 150 outside 0..100" in text
    assert broken.pods is not None and (broken.pods.ready_with_metric, broken.pods.metric_sum) == (1, 42.0)
    idle = next(g for g in obs.gpus if g.uuid == "GPU-node-09-3")
    assert idle.pod is None and idle.namespace is None and idle.utilization == 0.0 and idle.stale_reasons == ()


def test_samples_older_than_the_bound_are_stale_with_their_age(
    genai: GenaiDataset, genai_source: PrometheusMetricsSource
) -> None:
    # 200 s after the last sample: Prometheus still returns it (5 min lookback), the adapter must not use it.
    obs = genai_source.observe(genai_services(), genai.end + 200)
    for service in SERVICES:
        reasons = " ".join(obs.services[f"{NAMESPACE}/{service}"].stale_reasons)
        assert "last sample 200s old (> staleness_seconds 120)" in reasons
    assert all(g.utilization is None for g in obs.gpus)
    # An hour later nothing at all is returned: still stale (never zero), with a different reason.
    later = genai_source.observe(genai_services(), genai.end + 3600)
    for service in SERVICES:
        got = later.services[f"{NAMESPACE}/{service}"]
        assert got.pods is None and got.stale_reasons
        assert "no DCGM_FI_DEV_GPU_UTIL series for any pod" in got.stale_reasons[0]


def test_cluster_snapshot_gives_replicas_readiness_and_missing_pods(
    genai: GenaiDataset, genai_source: PrometheusMetricsSource
) -> None:
    t = genai.active_times()[0]
    pods = genai.pods_of("sd-xl")
    rs = f"sd-xl-{TEMPLATE_HASH['sd-xl']}"

    def pod(name: str, ready: bool) -> PodInfo:
        return PodInfo(NAMESPACE, name, "node-00", 1, 0, "Running", ready, owner_kind="ReplicaSet", owner_name=rs)

    snapshot = ClusterSnapshot(
        time=t,
        deployments=(DeploymentInfo(NAMESPACE, "sd-xl", spec_replicas=6, ready_replicas=4),),
        pods=(
            pod(pods[0].name, True),
            pod(pods[1].name, True),
            pod(pods[2].name, True),
            pod(pods[3].name, False),  # starting: its samples are not used
            pod(f"{rs}-zzzzz", True),  # ready but dcgm-exporter has no series for it
        ),
    )
    obs = genai_source.observe(genai_services(), t, cluster=snapshot)
    xl = obs.services[f"{NAMESPACE}/sd-xl"]
    assert (xl.spec_replicas, xl.ready_replicas) == (6, 4)
    assert xl.pods is not None
    assert (xl.pods.ready_with_metric, xl.pods.missing, xl.pods.unready) == (3, 1, 1)
    assert xl.pods.metric_sum == pytest.approx(sum(genai.util_at(p.name, t) or 0.0 for p in pods[:3]), rel=REL)
    assert any("sd-xl-7d9f8b6c5-zzzzz" in r and "no GPU series" in r for r in xl.partial_reasons)
    # request rate: the ready pod without application metrics makes the total partial, hence stale
    assert xl.request_rate is None


def test_per_service_overrides_are_batched_and_isolated(
    genai: GenaiDataset, genai_prometheus: PrometheusServer
) -> None:
    t = genai.active_times()[5]
    good = 'sum(rate(vllm:request_success_total{namespace="{namespace}",pod=~"{name}-.*"}[{window}]))'
    queries = {
        f"{NAMESPACE}/sd-xl": QueriesSpec(requestRate=good),
        f"{NAMESPACE}/sd-turbo": QueriesSpec(
            requestRate=good,
            latency="histogram_quantile(0.5, sum by (le) ("
            'rate(vllm:e2e_request_latency_seconds_bucket{namespace="{namespace}",'
            'pod=~"{name}-.*"}[{window}])))',
        ),
        f"{NAMESPACE}/sd-lora": QueriesSpec(requestRate="sum(rate(no_such_metric[1m])) +"),  # a parse error
    }
    # Off: the parse error must reach Prometheus (its 400 is what this test is about); on, the confinement check
    # would refuse it before it is sent (tests/prometheus/test_prom_override_confinement.py).
    settings = genai_settings(genai_prometheus.url, confine_overrides_to_namespace=False)
    source = PrometheusMetricsSource(settings, service_queries=queries)
    services = genai_services(metric=MetricKind.REQUEST_RATE, target=0.1, latency_slo_s=30.0)
    obs = source.observe(services, t)
    xl, turbo, lora = (obs.services[s.key] for s in services)
    assert xl.stale_reasons == () and xl.metric_total == pytest.approx(genai.request_rate("sd-xl", t), rel=1e-6)
    assert turbo.stale_reasons == () and turbo.metric_total == pytest.approx(genai.request_rate("sd-turbo", t))
    assert turbo.latency_s == pytest.approx(genai.latency("sd-turbo", t, 0.5), rel=1e-6)
    assert lora.metric_total is None and any("spec.queries.requestRate" in r and "400" in r for r in lora.stale_reasons)
    # 7 family queries + 1 latency batch + 1 request-rate batch that failed and was retried one by one (3)
    assert source.last_stats.queries == 7 + 1 + 1 + 3


def test_hostile_label_values_cannot_change_the_query(
    genai_source: PrometheusMetricsSource, genai: GenaiDataset
) -> None:
    t = genai.active_times()[0]
    for value in HOSTILE_VALUES:
        # equality: exactly the one series whose label is the hostile text
        query = render('probe_metric{name="{name}"}', {}, {"name": value})
        result = genai_source._pc.custom_query(query, params={"time": t})
        assert [r["metric"]["name"] for r in result] == [value], query
        # regex matcher: metacharacters are literal, so the decoys ("aXb|c..." for "a.b|c...", "anything" for ".*")
        # do not match
        query = render('probe_metric{name=~"{name}"}', {}, {"name": value})
        result = genai_source._pc.custom_query(query, params={"time": t})
        assert [r["metric"]["name"] for r in result] == [value], query
        # round trip: Prometheus' own parser reads the literal back as exactly the value
        query = render('label_replace(vector(1), "echo", "{name}", "", "")', {}, {"name": value})
        result = genai_source._pc.custom_query(query, params={"time": t})
        assert result[0]["metric"] == {"echo": value}
    assert set(HOSTILE_DECOYS)  # the decoys exist in the data; the assertions above prove they were not matched


def test_history_is_chunked_and_matches_the_trace(genai: GenaiDataset, genai_prometheus: PrometheusServer) -> None:
    service = ServicePolicy(NAMESPACE, "sd-xl")
    start, end, step = genai.grid[11], genai.end, 57.0  # steps on the trace grid
    whole = PrometheusMetricsSource(genai_settings(genai_prometheus.url))
    chunked = PrometheusMetricsSource(genai_settings(genai_prometheus.url, max_points_per_series=100))
    with mock.patch.object(chunked, "_range", wraps=chunked._range) as spy:
        series = chunked.history(service, "gpu_utilization", start, end, step)
    expected_points = int((end - start) // step) + 1
    assert spy.call_count == math.ceil(expected_points / 100)
    assert len(series.times) == expected_points == len(set(series.times))
    assert list(series.times) == sorted(series.times)
    single = whole.history(service, "gpu_utilization", start, end, step)
    assert series.times == single.times
    assert series.values == pytest.approx(single.values, rel=REL)  # Go sums in map order: last-bit differences
    for t, v in list(zip(series.times, series.values, strict=True))[::50]:
        assert v == pytest.approx(sum(genai.util_at(p.name, t) or 0.0 for p in genai.pods_of("sd-xl")), rel=REL)

    rates = whole.history(service, MetricKind.REQUEST_RATE.value, start, end, step)
    by_time = dict(zip(rates.times, rates.values, strict=True))
    for t in genai.active_times()[::40]:
        assert by_time[t] == pytest.approx(genai.request_rate("sd-xl", t), rel=1e-6)
    latency = whole.history(service, "latency", start, end, step)
    assert latency.times and all(0 < v <= 16 for v in latency.values)  # NaN (no traffic) points are left out
    with pytest.raises(ValueError, match="unknown signal"):
        whole.history(service, "bogus", start, end, step)
