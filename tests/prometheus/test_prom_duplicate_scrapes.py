"""One pod's metrics scraped more than once count once.

A pod's metrics endpoint is often collected twice: a PodMonitor beside a ServiceMonitor, the ``prometheus.io/scrape``
annotation job beside a ServiceMonitor, or two Prometheus replicas read through a Thanos querier that does not
deduplicate. Every series then exists once per scrape configuration, with different ``job``/``service`` (or
``prometheus_replica``) labels and, for the annotation job, labels of its own (the pod's labels, ``node``). Summed
per pod, the request rate and the queue depth doubled and the controller asked for twice the replicas.

The history here is backfilled into a real Prometheus with ``promtool``; every expected value is computed in Python
from the same slopes, independently of PromQL. Each service is scraped in one of the ways above; the control
(``single``) is scraped once. Two targets of one pod in one scrape job (two engines on two ports) are two sources
whose counts add, not copies.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from canned import NOW, CannedPrometheus
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from promserver import OpenMetricsWriter, PrometheusServer, backfill, free_port

from autoscaler.adapters.prometheus import Family, PrometheusMetricsSource, validate_service_query
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.adapters.promql import pod_names_may_be_cut
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.policy import QueriesSpec
from autoscaler.settings import load_settings

NS = "ml"
GRID_S = 15
START = 1_700_000_000
POINTS = 241  # an hour
AT = START + 1800  # on the grid of the first copy of every series
RATE_WINDOW_S = 60
COUNTER_BASE = 100_000.0  # far from zero: rate() never extrapolates a counter back to zero here
HASH = "7d9f8b6c5"
SUFFIXES = ("x2x4b", "qz7kd")
MODEL = "llama-3-8b"

# Per pod: finished requests per second by finished_reason (vLLM's vllm:request_success_total splits its count
# so: each is a series of the pod's own, to be summed), requests waiting, and the latency buckets' rates.
REQUESTS_PER_S = ({"stop": 2.0, "length": 0.5}, {"stop": 1.0, "length": 0.25})
WAITING = (3.0, 5.0)
BUCKETS = ("0.25", "0.5", "1.0", "2.0", "+Inf")
BUCKET_RATES = ((1.0, 2.0, 2.5, 3.0, 3.0), (0.0, 0.5, 1.0, 2.0, 2.0))

SERVICE_RATE = sum(sum(by_reason.values()) for by_reason in REQUESTS_PER_S)  # 3.75
SERVICE_WAITING = sum(WAITING)  # 8


def histogram_quantile(q: float, upper_bounds: tuple[float, ...], cumulative: list[float]) -> float:
    """Prometheus' histogram_quantile for buckets whose last is +Inf and whose quantile is not in it."""
    rank = q * cumulative[-1]
    i = next(i for i, count in enumerate(cumulative) if count >= rank)
    lower, below = (0.0, 0.0) if i == 0 else (upper_bounds[i - 1], cumulative[i - 1])
    return lower + (upper_bounds[i] - lower) * (rank - below) / (cumulative[i] - below)


SERVICE_P95 = histogram_quantile(
    0.95, tuple(float(b) for b in BUCKETS), [sum(rates[i] for rates in BUCKET_RATES) for i in range(len(BUCKETS))]
)


@dataclass(frozen=True)
class Copy:
    """One collection of a pod's endpoint: the labels the scrape adds, when it samples, which share it carries."""

    labels: dict[str, str]
    offset_s: int = 0  # another scrape samples at other times
    share: float = 1.0  # of the pod's counts: 1 for a copy, a part for one of the pod's own targets


def service_monitor(service: str, ip: str, **extra: str) -> dict[str, str]:
    # what prometheus-operator adds for a ServiceMonitor endpoint (job: the Service's name)
    labels = {"job": service, "service": service, "endpoint": "http", "container": "vllm", "instance": f"{ip}:8000"}
    return {**labels, **extra}


def copies_of(scenario: str, service: str, pod_index: int) -> list[Copy]:
    ip = f"10.0.{len(service)}.{pod_index + 10}"
    if scenario == "single":
        return [Copy(service_monitor(service, ip))]
    if scenario == "operator":  # a PodMonitor (job: <namespace>/<name>, no service label) beside a ServiceMonitor
        pod_monitor = {"job": f"{NS}/{service}", "endpoint": "http", "container": "vllm", "instance": f"{ip}:8000"}
        return [Copy(service_monitor(service, ip)), Copy(pod_monitor, offset_s=4)]
    if scenario == "annotated":  # the prometheus.io/scrape job: the pod's own labels mapped, a node label
        annotation_job = {
            "job": "kubernetes-pods",
            "instance": f"{ip}:8000",
            "app": service,
            "pod_template_hash": HASH,
            "node": "gpu-node-1",
        }
        return [Copy(service_monitor(service, ip)), Copy(annotation_job, offset_s=7)]
    if scenario == "replicas":  # two Prometheus replicas read through Thanos without deduplication
        external = [{"prometheus": "monitoring/k8s", "prometheus_replica": f"prometheus-k8s-{r}"} for r in (0, 1)]
        return [Copy(service_monitor(service, ip, **labels), offset_s=5 * r) for r, labels in enumerate(external)]
    if scenario == "two-ports":  # two engines in one pod, one target each in one job: their counts add
        return [
            Copy({**service_monitor(service, ip), "instance": f"{ip}:{port}", "endpoint": name}, share=0.5)
            for port, name in ((8000, "http"), (8001, "http-2"))
        ]
    raise AssertionError(scenario)


LONG = "a-deployment-name-long-enough-for-cut-pod-names"  # 47: its latency is asked over its own pods
# service name -> how its pods are scraped
SCENARIOS = {name: name for name in ("single", "operator", "annotated", "replicas", "two-ports")} | {LONG: "operator"}


def pods_of(service: str) -> list[str]:
    return [f"{service}-{HASH}-{suffix}" for suffix in SUFFIXES]


def write_history(path: Path) -> None:
    writer = OpenMetricsWriter(path)
    grid = [START + k * GRID_S for k in range(POINTS)]

    def each_copy() -> Iterator[tuple[int, dict[str, str], Copy]]:
        for service, scenario in SCENARIOS.items():
            for i, pod in enumerate(pods_of(service)):
                for copy in copies_of(scenario, service, i):
                    yield i, {"namespace": NS, "pod": pod, **copy.labels}, copy

    writer.family("vllm:request_success", "counter")
    for i, labels, copy in each_copy():
        for reason, per_s in REQUESTS_PER_S[i].items():
            slope = per_s * copy.share
            points = [(t + copy.offset_s, COUNTER_BASE + slope * (t + copy.offset_s - START)) for t in grid]
            series_labels = {**labels, "finished_reason": reason, "model_name": MODEL}
            writer.series("vllm:request_success_total", series_labels, points)
    writer.family("vllm:num_requests_waiting", "gauge")
    for i, labels, copy in each_copy():
        points = [(t + copy.offset_s, WAITING[i] * copy.share) for t in grid]
        writer.series("vllm:num_requests_waiting", {**labels, "model_name": MODEL}, points)
    writer.family("vllm:e2e_request_latency_seconds", "histogram")
    for i, labels, copy in each_copy():
        for le, per_s in zip(BUCKETS, BUCKET_RATES[i], strict=True):
            slope = per_s * copy.share
            points = [(t + copy.offset_s, COUNTER_BASE + slope * (t + copy.offset_s - START)) for t in grid]
            series_labels = {**labels, "le": le, "model_name": MODEL}
            writer.series("vllm:e2e_request_latency_seconds_bucket", series_labels, points)
    writer.close()


@pytest.fixture(scope="module")
def copies_prometheus(prom_binaries: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("copies")
    write_history(root / "copies.om")
    backfill(prom_binaries[1], root / "copies.om", root / "data")
    server = PrometheusServer(prom_binaries[0], root / "data").start()
    yield server.url
    server.stop()


def source_for(url: str, **changes: Any) -> PrometheusMetricsSource:
    values: dict[str, Any] = {"url": url, "rate_window_seconds": RATE_WINDOW_S, "retries": 0, "timeout_seconds": 5}
    values.update(changes)
    return PrometheusMetricsSource(PrometheusSettings(**values))


def policy(name: str) -> ServicePolicy:
    return ServicePolicy(NS, name, metric=MetricKind.REQUEST_RATE, target=1.0, latency_slo_s=10.0)


def test_the_expected_values_are_what_the_slopes_say() -> None:
    assert SERVICE_RATE == 3.75 and SERVICE_WAITING == 8.0
    assert math.isclose(SERVICE_P95, 1 + (4.75 - 3.5) / (5.0 - 3.5))
    assert len(LONG) == 47 and pod_names_may_be_cut(LONG)


# ---- the queries ---------------------------------------------------------------------------------------------------

DEDUPED_RATE = (
    "max by (namespace, pod) (sum by (namespace, pod, job, service, prometheus, prometheus_replica) "
    "(rate(vllm:request_success_total[120s])))"
)
DEDUPED_QUEUE = (
    "max by (namespace, pod) (sum by (namespace, pod, job, service, prometheus, prometheus_replica) "
    "(last_over_time(vllm:num_requests_waiting[120s])))"
)


def test_the_default_queries_take_each_pods_largest_copy() -> None:
    source = source_for("http://127.0.0.1:9", rate_window_seconds=120)
    assert source.family_query(Family.REQUEST_RATE) == DEDUPED_RATE
    assert source.family_query(Family.QUEUE_DEPTH) == DEDUPED_QUEUE


def test_the_history_queries_are_the_same_per_pod_aggregation_summed() -> None:
    source = source_for("http://127.0.0.1:9", rate_window_seconds=120)
    own = 'namespace="ml",pod=~"chat-[bcdfghjklmnpqrstvwxz2456789]{1,10}-[bcdfghjklmnpqrstvwxz2456789]{5}"'
    rate = DEDUPED_RATE.replace("vllm:request_success_total", f"vllm:request_success_total{{{own}}}")
    queue = DEDUPED_QUEUE.replace("vllm:num_requests_waiting", f"vllm:num_requests_waiting{{{own}}}")
    assert source.history_query(ServicePolicy(NS, "chat"), "request_rate") == f"sum({rate})"
    assert source.history_query(ServicePolicy(NS, "chat"), "queue_depth") == f"sum({queue})"


def test_the_copy_labels_are_a_setting_and_follow_the_label_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_SCRAPE_COPY_LABELS", " job ,prometheus_replica,, ")
    settings = PrometheusSettings(app_namespace_label="exported_namespace", app_pod_label="exported_pod")
    assert settings.scrape_copy_labels == "job, prometheus_replica"
    assert PrometheusMetricsSource(settings).family_query(Family.REQUEST_RATE) == (
        "max by (exported_namespace, exported_pod) (sum by (exported_namespace, exported_pod, job, "
        "prometheus_replica) (rate(vllm:request_success_total[120s])))"
    )
    # a list in the settings file works as well; an empty setting sums every copy (what the queries did before)
    assert PrometheusSettings(scrape_copy_labels=["job", "service"]).scrape_copy_labels == "job, service"
    monkeypatch.delenv("AUTOSCALER_PROMETHEUS_SCRAPE_COPY_LABELS")
    (tmp_path / "settings.yaml").write_text("prometheus:\n  scrape_copy_labels: [job, prometheus_replica]\n")
    assert load_settings(tmp_path / "settings.yaml").prometheus.scrape_copy_labels == "job, prometheus_replica"
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_SCRAPE_COPY_LABELS", "")
    empty = PrometheusMetricsSource(PrometheusSettings()).family_query(Family.QUEUE_DEPTH)
    assert empty.startswith("max by (namespace, pod) (sum by (namespace, pod, ) (last_over_time(")


@pytest.mark.parametrize("value", ["job instance", "job,kubernetes-pod", 'job") or vector(1', "1job"])
def test_the_copy_labels_must_be_label_names(value: str) -> None:
    with pytest.raises(ValueError, match=r"scrape_copy_labels(.|\n)*not a Prometheus label name"):
        PrometheusSettings(scrape_copy_labels=value)


def test_templates_of_the_operator_still_work_with_and_without_the_new_placeholder() -> None:
    old_default = "sum by ({namespace_label}, {pod_label}) (rate({metric}{selector}[{window}]))"
    mine = "max by (namespace, pod) (sum by (namespace, pod, {scrape_copy_labels}) (rate(my_requests_total[1m])))"
    settings = PrometheusSettings(request_rate_query=old_default, queue_depth_query=mine)
    source = PrometheusMetricsSource(settings)
    assert source.family_query(Family.REQUEST_RATE) == (
        "sum by (namespace, pod) (rate(vllm:request_success_total[120s]))"
    )
    assert source.family_query(Family.QUEUE_DEPTH) == (
        "max by (namespace, pod) (sum by (namespace, pod, job, service, prometheus, prometheus_replica) "
        "(rate(my_requests_total[1m])))"
    )
    with pytest.raises(ValueError, match=r"unknown placeholder \{scrape_copy_label\}"):
        PrometheusSettings(request_rate_query="sum by ({scrape_copy_label}) (x)")
    # a policy's own query may name the copy labels too
    validate_service_query(
        'max(sum by (job) (rate(x{namespace="{namespace}"}[1m]))) or sum by ({scrape_copy_labels}) (y)'
    )


def test_the_adapter_sends_the_deduplicating_queries_and_renders_overrides_with_the_copy_labels() -> None:
    canned = CannedPrometheus().start()
    try:
        override = 'max(sum by ({scrape_copy_labels}) (rate(vllm:request_success_total{namespace="{namespace}"}[1m])))'
        source = PrometheusMetricsSource(
            PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5, rate_window_seconds=120),
            service_queries={"ml/embed": QueriesSpec(requestRate=override)},
        )
        source.observe([ServicePolicy(NS, "chat"), ServicePolicy(NS, "embed")], NOW)
    finally:
        canned.stop()
    sent = dict(canned.queries)
    assert sent["rate"] == DEDUPED_RATE and sent["queue"] == DEDUPED_QUEUE
    assert "max(sum by (job, service, prometheus, prometheus_replica) (rate(" in sent["override"]


# ---- a real Prometheus holding the copies -------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("service", list(SCENARIOS))
def test_each_pod_counts_once_however_often_it_was_scraped(copies_prometheus: str, service: str) -> None:
    source = source_for(copies_prometheus)
    got = source.observe([policy(service)], AT).services[f"{NS}/{service}"]
    assert got.stale_reasons == () and got.partial_reasons == ()
    assert got.metric_total == pytest.approx(SERVICE_RATE, rel=1e-9)
    assert got.request_rate == pytest.approx(SERVICE_RATE, rel=1e-9)
    assert got.queue_depth == pytest.approx(SERVICE_WAITING, rel=1e-9)
    # Copies of every pod double (or halve) every bucket alike: the quantile is the single copy's, unchanged by
    # the fix, in the batched query and in the per-service one of a Deployment whose pods' names may be cut
    # (asked in a query of its own: the eighth).
    assert got.latency_s == pytest.approx(SERVICE_P95, rel=1e-9)
    assert source.last_stats.queries == (8 if pod_names_may_be_cut(service) else 7)


@pytest.mark.integration
@pytest.mark.parametrize("service", ["operator", "annotated", "replicas", "two-ports", LONG])
def test_history_counts_each_pod_once(copies_prometheus: str, service: str) -> None:
    source = source_for(copies_prometheus)
    start, step = AT - 1200, 60.0
    expected = {"request_rate": SERVICE_RATE, "queue_depth": SERVICE_WAITING, "latency": SERVICE_P95}
    for signal, value in expected.items():
        series = source.history(policy(service), signal, start, AT, step)
        assert len(series.values) == 21, (signal, series)
        assert list(series.values) == pytest.approx([value] * 21, rel=1e-9), signal


@pytest.mark.integration
def test_a_per_deployment_query_counts_each_pod_once(copies_prometheus: str) -> None:
    """The per-Deployment variant: the deployment label in place of the pod label (here derived from the pod name,
    as the default latency query derives it)."""
    per_deployment = (
        "max by ({namespace_label}, {deployment_label}) (sum by ({namespace_label}, {deployment_label}, "
        '{scrape_copy_labels}) (label_replace(rate({metric}{selector}[{window}]), "{deployment_label}", "$1", '
        '"{pod_label}", "{pod_regex}")))'
    )
    source = source_for(copies_prometheus, request_rate_query=per_deployment)
    services = [policy(name) for name in SCENARIOS]
    observation = source.observe(services, AT)
    for service in services:
        got = observation.services[service.key]
        assert got.request_rate == pytest.approx(SERVICE_RATE, rel=1e-9), service.key
        assert got.stale_reasons == (), service.key


@pytest.mark.integration
def test_without_copy_labels_every_copy_is_summed(copies_prometheus: str) -> None:
    """The opt-out (an empty setting) is valid PromQL and the old sum: a copy adds its counts."""
    source = source_for(copies_prometheus, scrape_copy_labels="")
    observation = source.observe([policy("single"), policy("operator")], AT)
    assert observation.services[f"{NS}/single"].request_rate == pytest.approx(SERVICE_RATE, rel=1e-9)
    assert observation.services[f"{NS}/operator"].request_rate == pytest.approx(2 * SERVICE_RATE, rel=1e-9)


# ---- live: one exporter scraped by two jobs, as a PodMonitor beside a ServiceMonitor ---------------------------------

LIVE_PODS = ("chat-5c8d7f9b4-x2x4b", "chat-5c8d7f9b4-qz7kd")
LIVE_WINDOW_S = 10


@pytest.mark.integration
def test_live_two_scrape_jobs_of_one_exporter_count_once(prom_binaries: tuple[str, str], tmp_path: Path) -> None:
    registry = CollectorRegistry()
    # no colons: prometheus-client writes them as '_' in OpenMetrics (see test_prom_live)
    finished = Counter("app_requests", "finished requests", ["namespace", "pod", "finished_reason"], registry=registry)
    waiting = Gauge("app_waiting", "requests waiting", ["namespace", "pod"], registry=registry)
    for pod, queued in zip(LIVE_PODS, (3, 4), strict=True):
        waiting.labels(namespace=NS, pod=pod).set(queued)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.wait(0.05):
            for pod in LIVE_PODS:
                finished.labels(namespace=NS, pod=pod, finished_reason="stop").inc(2)
                finished.labels(namespace=NS, pod=pod, finished_reason="length").inc()

    load = threading.Thread(target=traffic, daemon=True)
    load.start()
    jobs = ("servicemonitor", "podmonitor")
    config = "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + "".join(
        f"  - job_name: {job}\n    honor_labels: true\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        for job in jobs
    )
    prometheus = PrometheusServer(prom_binaries[0], tmp_path / "data", config)
    try:
        url = prometheus.start().url

        def instant(query: str, at: float) -> list[dict[str, Any]]:
            answer = requests.get(f"{url}/api/v1/query", params={"query": query, "time": at}, timeout=5).json()
            result: list[dict[str, Any]] = answer["data"]["result"]
            return result

        # both jobs have scraped long enough for a rate over the window
        deadline = time.monotonic() + 60
        while len(instant(f"count by (job) (count_over_time(app_waiting[{LIVE_WINDOW_S}s]) > 6)", time.time())) < 2:
            assert time.monotonic() < deadline, prometheus.log_tail()
            time.sleep(0.25)
        source = source_for(
            url,
            rate_window_seconds=LIVE_WINDOW_S,
            staleness_seconds=10,
            request_count_metric="app_requests_total",
            queue_depth_metric="app_waiting",
        )
        at = time.time()
        got = source.observe([policy("chat")], at).services[f"{NS}/chat"]
        assert got.queue_depth == 7
        one_job = instant(f'sum(rate(app_requests_total{{job="servicemonitor"}}[{LIVE_WINDOW_S}s]))', at)
        single = float(one_job[0]["value"][1])
        assert single > 0 and got.request_rate is not None
        # the two copies are sampled at other instants, so their rates differ a little; their sum would be 2x
        assert 0.7 < got.request_rate / single < 1.4, (got.request_rate, single)
    finally:
        prometheus.stop()
        stop.set()
        load.join(timeout=5)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
