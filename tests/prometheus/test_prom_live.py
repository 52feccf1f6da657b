"""The live path: a prometheus-client exporter on 127.0.0.1 scraped every second by a real Prometheus; the test
changes what it exports and waits until the adapter sees it (Prometheus' 5 s service-discovery throttle makes the
first scrape slow, so every wait polls with a generous timeout instead of sleeping)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest
from prom_helpers import genai_settings
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from promserver import PrometheusServer, free_port

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.core.model import Observation, ServiceObservation, ServicePolicy

pytestmark = pytest.mark.integration

T = TypeVar("T")
POLL_TIMEOUT_S = 60.0
PODS = ("chat-5c8d7f9b4-x2x4b", "chat-5c8d7f9b4-qz7kd")
SERVICE = ServicePolicy("ml", "chat", latency_slo_s=1.0)


@dataclass
class Exporter:
    registry: CollectorRegistry
    util: Gauge
    fb_used: Gauge
    fb_free: Gauge
    requests: Counter
    latency: Histogram
    port: int
    stop: Callable[[], None]

    def gpu_labels(self, i: int) -> dict[str, str]:
        return {
            "gpu": str(i),
            "UUID": f"GPU-live-{i}",
            "modelName": "NVIDIA L4",
            "Hostname": "live-node",
            "namespace": "ml",
            "pod": PODS[i],
        }


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    registry = CollectorRegistry()
    gpu_labels = ["gpu", "UUID", "modelName", "Hostname", "namespace", "pod"]
    exp_util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", gpu_labels, registry=registry)
    exp_used = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", gpu_labels, registry=registry)
    exp_free = Gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", gpu_labels, registry=registry)
    # No colons in these names: prometheus-client 0.26 rewrites ':' to '_' in its OpenMetrics output, which
    # Prometheus asks for, so 'vllm:...' would arrive as 'vllm_...'. Configurable names cover both.
    requests = Counter("app_requests", "finished requests", ["namespace", "pod"], registry=registry)
    latency = Histogram(
        "app_latency_seconds", "latency", ["namespace", "pod"], registry=registry, buckets=(0.5, 1, 2, 4)
    )
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()

    exp = Exporter(registry, exp_util, exp_used, exp_free, requests, latency, port, stop)
    for i in range(len(PODS)):
        # a vLLM server exports its counter and histogram from the start, at zero: no traffic is not "no data"
        requests.labels(namespace="ml", pod=PODS[i])
        latency.labels(namespace="ml", pod=PODS[i])
        labels = exp.gpu_labels(i)
        exp_util.labels(**labels).set(20)
        exp_used.labels(**labels).set(1000)
        exp_free.labels(**labels).set(22000)
    yield exp
    stop()
    thread.join(timeout=5)


def wait_for(observe: Callable[[], T], condition: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    last: T | None = None
    while time.monotonic() < deadline:
        last = observe()
        if condition(last):
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {POLL_TIMEOUT_S}s waiting for {what}; last: {last!r}")


def test_live_exporter_changes_are_seen(exporter: Exporter, start_prometheus: Callable[..., PrometheusServer]) -> None:
    config = (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dcgm\n"
        "    honor_labels: true\n"  # keep the exporter's namespace/pod (what the GPU Operator's ServiceMonitor does)
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    server = start_prometheus(config=config)
    settings = genai_settings(
        server.url,
        staleness_seconds=10,
        rate_window_seconds=4,
        request_count_metric="app_requests_total",
        latency_bucket_metric="app_latency_seconds_bucket",
    )
    source = PrometheusMetricsSource(settings)

    def chat() -> ServiceObservation:
        return source.observe([SERVICE], time.time()).services[SERVICE.key]

    def observe() -> Observation:
        return source.observe([SERVICE], time.time())

    first = wait_for(chat, lambda o: o.pods is not None and o.pods.ready_with_metric == 2, "the first scrape")
    assert first.pods is not None and first.pods.metric_sum == 40

    exporter.util.labels(**exporter.gpu_labels(1)).set(80)
    seen = wait_for(chat, lambda o: o.pods is not None and o.pods.metric_sum == 100, "util 20 -> 80 on one GPU")
    assert seen.stale_reasons == ()

    for _ in range(50):
        exporter.requests.labels(namespace="ml", pod=PODS[0]).inc()
        exporter.latency.labels(namespace="ml", pod=PODS[0]).observe(0.75)
    busy = wait_for(chat, lambda o: (o.request_rate or 0) > 0 and o.latency_s is not None, "requests and latency")
    assert 0.5 < (busy.latency_s or 0) <= 1.0

    # Partial answer: one GPU's utilisation disappears (its memory series stay): the service is partial (no
    # scale-down), not lower.
    exporter.util.remove(*exporter.gpu_labels(1).values())
    partial = wait_for(chat, lambda o: bool(o.partial_reasons), "the removed series to be noticed")
    assert partial.pods is not None and (partial.pods.ready_with_metric, partial.pods.missing) == (1, 1)
    assert "no sample (partial answer)" in partial.partial_reasons[0] and not partial.stale_reasons

    # The exporter goes away: Prometheus marks its series stale; the adapter holds, with the reason.
    exporter.stop()
    gone = wait_for(observe, lambda o: not o.gpus, "the exporter's series to go stale")
    service = gone.services[SERVICE.key]
    assert service.pods is None and service.stale_reasons
    assert "no DCGM_FI_DEV_GPU_UTIL series for any pod" in service.stale_reasons[0]
