"""Faults between the adapter and a real Prometheus: it stops, answers slowly, answers 5xx or garbage, or leaves
series out. Each one gives stale observations with the reason (a hold), never an exception or a zero."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faultproxy import Fault, FaultProxy
from genai_dataset import NAMESPACE, SERVICES, GenaiDataset
from prom_helpers import genai_services, genai_settings
from promserver import PrometheusServer

from autoscaler.adapters.prometheus import PrometheusMetricsSource, connect
from autoscaler.core.model import Observation
from autoscaler.ports import PortError

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(genai_prometheus: PrometheusServer) -> Iterator[FaultProxy]:
    p = FaultProxy(genai_prometheus.port).start()
    yield p
    p.stop()


def all_stale_with(obs: Observation, text: str) -> None:
    assert set(obs.services) == {f"{NAMESPACE}/{s}" for s in SERVICES}
    for key, service in obs.services.items():
        assert service.pods is None and service.metric_total is None and service.request_rate is None, key
        assert any(text in r for r in service.stale_reasons), (key, service.stale_reasons)


def test_prometheus_stopped_mid_test(
    genai: GenaiDataset, genai_blocks: Path, start_prometheus: Callable[..., PrometheusServer]
) -> None:
    server = start_prometheus(genai_blocks)
    source = connect(genai_settings(server.url, retries=1, retry_backoff_seconds=0.05))
    t = genai.active_times()[0]
    assert all(not o.stale_reasons for o in source.observe(genai_services(), t).services.values())

    server.stop()
    started = time.monotonic()
    obs = source.observe(genai_services(), t)  # must not raise
    assert time.monotonic() - started < 3
    all_stale_with(obs, "Connection refused")
    assert obs.gpus == ()
    assert source.last_stats.queries == 1  # the first refusal skips the tick's other queries
    with pytest.raises(PortError, match="cannot reach Prometheus"):
        source.check()
    with pytest.raises(PortError, match="history of genai/sd-xl"):
        source.history(genai_services()[0], "request_rate", t - 3600, t, 60)


def test_slow_answers_time_out_once_per_tick(genai: GenaiDataset, proxy: FaultProxy) -> None:
    # answers 6 s late; two attempts of 1 s and a 0.5 s backoff take 2.5 s (the bound leaves 2 s for a loaded
    # machine; a 0.3 s timeout, 0.9 s in all, against a 1.5 s bound did not leave enough), waiting for one answer 6 s
    proxy.fault = Fault(delay_s=6.0)
    source = PrometheusMetricsSource(genai_settings(proxy.url, timeout_seconds=1.0, retries=1))
    started = time.monotonic()
    obs = source.observe(genai_services(), genai.active_times()[0])
    elapsed = time.monotonic() - started
    all_stale_with(obs, "did not answer within 1s")
    assert len(proxy.seen) == 2  # one query, retried once, then the tick gives up on Prometheus
    assert elapsed < 4.5, elapsed


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_answers_make_everything_stale(genai: GenaiDataset, proxy: FaultProxy, status: int) -> None:
    proxy.fault = Fault(status=status)
    source = PrometheusMetricsSource(genai_settings(proxy.url, retries=0))
    obs = source.observe(genai_services(latency_slo_s=1.0), genai.active_times()[0])
    all_stale_with(obs, f"HTTP Status Code {status}")
    assert obs.gpus == ()
    # 502/503 (like 429/504) still failing after the retries is an outage: it ends the tick like a connection
    # failure (the other queries would each pay the same retries and Retry-After waits); 500 is one query's error.
    expected = 1 if status in (502, 503) else 7
    assert source.last_stats.failed_queries == source.last_stats.queries == expected


def test_transient_503_is_retried_with_backoff(genai: GenaiDataset, proxy: FaultProxy) -> None:
    proxy.fault = Fault(status=503, fail_first=2)
    source = PrometheusMetricsSource(genai_settings(proxy.url, retries=2, retry_backoff_seconds=0.05))
    obs = source.observe(genai_services(), genai.active_times()[0])
    assert all(not o.stale_reasons for o in obs.services.values())
    assert len(proxy.seen) == 7 + 2


def test_garbage_answer(genai: GenaiDataset, proxy: FaultProxy) -> None:
    proxy.fault = Fault(garbage=b"<html><body>login required</body></html>")
    source = PrometheusMetricsSource(genai_settings(proxy.url))
    all_stale_with(source.observe(genai_services(), genai.active_times()[0]), "not the query API's JSON")


def test_partial_series_make_only_their_service_partial(genai: GenaiDataset, proxy: FaultProxy) -> None:
    victim = genai.pods_of("sd-turbo")[2].name
    proxy.fault = Fault(drop=lambda query, labels: "DCGM_FI_DEV_GPU_UTIL" in query and labels.get("pod") == victim)
    source = PrometheusMetricsSource(genai_settings(proxy.url))
    obs = source.observe(genai_services(), genai.active_times()[0])
    turbo = obs.services[f"{NAMESPACE}/sd-turbo"]
    assert turbo.pods is not None and (turbo.pods.ready_with_metric, turbo.pods.missing) == (3, 1)
    assert turbo.stale_reasons == (), turbo.stale_reasons  # 3 of 4 pods reported: partial, not stale
    assert any(victim in r and "no sample (partial answer)" in r for r in turbo.partial_reasons), turbo.partial_reasons
    assert not obs.services[f"{NAMESPACE}/sd-xl"].stale_reasons
    assert not obs.services[f"{NAMESPACE}/sd-lora"].stale_reasons
    gpu = next(g for g in obs.gpus if g.pod == victim)
    assert gpu.utilization is None and gpu.fb_used_mib is not None
    assert gpu.stale_reasons == ("DCGM_FI_DEV_GPU_UTIL: no sample (partial answer)",)


def test_bearer_token_file_is_sent_and_reread(genai: GenaiDataset, proxy: FaultProxy, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    source = connect(genai_settings(proxy.url, bearer_token_file=token))
    source.observe(genai_services(), genai.active_times()[0])
    assert {s.headers.get("Authorization") for s in proxy.seen} == {"Bearer first-token"}
    token.write_text("rotated-token")
    proxy.seen.clear()
    source.observe(genai_services(), genai.active_times()[0])
    assert {s.headers.get("Authorization") for s in proxy.seen} == {"Bearer rotated-token"}
    token.unlink()
    all_stale_with(source.observe(genai_services(), genai.active_times()[0]), "bearer_token_file: cannot read")
    with pytest.raises(PortError, match=r"bearer_token_file: .* does not exist"):
        connect(genai_settings(proxy.url, bearer_token_file=token))


def test_basic_auth_from_a_password_file(genai: GenaiDataset, proxy: FaultProxy, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret")
    source = connect(genai_settings(proxy.url, basic_auth_username="autoscaler", basic_auth_password_file=password))
    source.observe(genai_services(), genai.active_times()[0])
    assert len(proxy.seen) == 2 + 7  # start-up check (query + buildinfo), then one tick
    expected = "Basic " + base64.b64encode(b"autoscaler:s3cret").decode()
    assert {s.headers.get("Authorization") for s in proxy.seen} == {expected}


def test_start_up_check_names_the_problem(proxy: FaultProxy) -> None:
    proxy.fault = Fault(status=401)
    with pytest.raises(PortError, match=r"refused the credentials \(HTTP 401\)"):
        connect(genai_settings(proxy.url))
    proxy.fault = Fault(garbage=b"<html>not prometheus</html>")
    with pytest.raises(PortError, match="does not look like the Prometheus HTTP API"):
        connect(genai_settings(proxy.url))
