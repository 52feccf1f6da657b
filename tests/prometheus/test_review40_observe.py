"""Review 40 of the Prometheus observation adapter (``autoscaler/adapters/prometheus.py``, ``promql.py``,
``prometheus_settings.py``): canned answers over real HTTP(S) (``canned.py``) and the real Prometheus holding the
GenAI trace (``conftest.py``).

Defects found (each first a strict xfail on the code as reviewed):

1. WRONG: ``history`` of the request rate (and of the latency) evaluates ``rate(...[rate_window_seconds])`` at every
   step whatever the step. With a step longer than the window (``forecast.step_seconds: 3600`` beside the 120 s
   window) each point measures only the last 120 s of its hour: the forecaster, whose points each stand for the
   whole step ending at them, fits a sample of two minutes an hour (a burst between the windows is never seen).
   RIGHT: a history point covers at least its step: the window is the larger of ``rate_window_seconds`` and the
   step (as Grafana's ``$__rate_interval`` is never shorter than the step); a step no longer than the window reads
   the tick's query text unchanged (the series' identity, ``history_query``, does not move).
2. WRONG: the tick's and the history's requests (``_instant``, ``_range``, buildinfo) go through the session
   without ``verify``, so requests reads ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` and that bundle wins over the
   session's own: ``ca_bundle`` and ``insecure_skip_verify`` are silently ignored wherever that variable is set
   (some base images and corporate set-ups set it). The start-up check (the client's ``custom_query`` passes
   ``verify``) succeeds, then every tick fails with a TLS error: every service held on stale data, every refit
   without history.
   RIGHT: every request verifies as the settings say, as the client's own requests do.
3. WRONG: a NaN latency with a request rate of 0 and an empty queue is read as "no traffic, nothing to guard" even
   when the rate of 0 is itself partial (an answer flagged with a warning, fewer replicas reporting than are ready)
   or the latency answer is: the SLO guard's partial reasons are dropped and an SLO-guarded service may scale down
   on a zero that may be missing data. RIGHT: idle only when the rate, the queue and the latency answer are all
   complete; otherwise the guard's signal is unknown (a partial reason: no scale-down).
4. WRONG: a TLS failure of the tick (an untrusted certificate) is reported "Prometheus at <url> unreachable:" with
   urllib3's text, which repeats the whole query URL and is cut at 200 characters before the cause: the reason, the
   Event and the log name neither the certificate nor the setting. RIGHT: "TLS error (<cause>); check ca_bundle",
   as the start-up check says it.

All four are fixed in ``prometheus.py``; their tests say "Fixed (was a strict xfail)".

Pinned besides (checked in this review, pinned nowhere else): a history range of more than 11,000 points is asked
of the real Prometheus in chunks it accepts and comes back whole; a 503 with Retry-After on a history chunk is a
``PortError`` after a bounded wait; a Deployment name with regex metacharacters selects only its own pods in a
history query.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from canned import HEALTHY, NOW, P0, P1, Answer, CannedPrometheus, app, gpu, series, vector
from genai_dataset import GRID, RATE_WINDOW_S, GenaiDataset
from prom_helpers import genai_settings
from promserver import PrometheusServer

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import ControllerState, MetricKind, Observation, ServicePolicy
from autoscaler.policy import QueriesSpec
from autoscaler.ports import PortError

RS = P0.rsplit("-", 1)[0]
WARNING = "partial response: store 10.0.3.7:10901 unavailable"


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def settings(url: str, **changes: Any) -> PrometheusSettings:
    return PrometheusSettings(**{"url": url, "retries": 0, "timeout_seconds": 5, **changes})


def snapshot(*pods: str, ready_replicas: int = 2) -> ClusterSnapshot:
    return ClusterSnapshot(
        time=NOW,
        deployments=(DeploymentInfo("ml", "chat", 2, ready_replicas),),
        pods=tuple(
            PodInfo("ml", p, "node-a", 1, 0, "Running", True, owner_kind="ReplicaSet", owner_name=RS) for p in pods
        ),
    )


def observe(
    canned: CannedPrometheus, answers: dict[str, Any], policy: ServicePolicy, cluster: ClusterSnapshot | None = None
) -> Observation:
    canned.answers = {k: v if isinstance(v, Answer) else Answer(v) for k, v in answers.items()}
    return PrometheusMetricsSource(settings(canned.url)).observe([policy], NOW, cluster=cluster)


def desired_after_window(obs: Observation, policy: ServicePolicy) -> int:
    """The replicas decided once the scale-down stabilisation window has passed."""
    state = ControllerState()
    for t in (NOW - 400, NOW):
        plan, state = decide(obs, state, {policy.key: policy}, t)
    return plan.decisions[0].desired_replicas


def range_queries(canned: CannedPrometheus) -> list[str]:
    return [query for _, query in canned.queries]


# ---- 1. history: a point covers its step ---------------------------------------------------------------------------


@pytest.mark.integration
def test_history_points_cover_a_step_longer_than_the_rate_window(
    genai: GenaiDataset, genai_prometheus: PrometheusServer
) -> None:
    """Fixed (was a strict xfail). WRONG: with a step of 8 trace intervals and a rate window of 4, each point was
    the mean request rate of the last 4 intervals only. RIGHT: the mean of the 8 intervals of its step (computed
    in Python from the trace), the window widened to the step."""
    service = ServicePolicy("genai", "sd-xl")
    step = 8 * GRID
    assert step > RATE_WINDOW_S
    start, end = genai.grid[20], genai.end
    source = PrometheusMetricsSource(genai_settings(genai_prometheus.url))
    got = source.history(service, MetricKind.REQUEST_RATE.value, start, end, step)
    by_time = dict(zip(got.times, got.values, strict=True))
    pods = genai.pods_of("sd-xl")

    def mean_over_step(t: float) -> float:
        return sum(sum(genai.qps_at(p.name, t - k * GRID) for k in range(8)) / 8 for p in pods)

    def mean_over_window(t: float) -> float:
        return sum(sum(genai.qps_at(p.name, t - k * GRID) for k in range(4)) / 4 for p in pods)

    checked = [t for t in by_time if start + step <= t <= end and t - step >= genai.start]
    assert len(checked) > 10
    differing = [t for t in checked if not math.isclose(mean_over_step(t), mean_over_window(t), rel_tol=1e-3)]
    assert differing, "the trace must tell the two readings apart"
    for t in checked:
        assert by_time[t] == pytest.approx(mean_over_step(t), rel=1e-6, abs=1e-9), t


def test_history_window_is_the_step_when_longer_and_the_tick_window_otherwise(canned: CannedPrometheus) -> None:
    """Fixed (was a strict xfail). The default request-rate and latency queries and a ``{window}`` override are
    asked over ``[3600s]`` with an hourly step; with a step shorter than the window, the text is the tick's own
    (``history_query``, the series' identity for the forecaster)."""
    source = PrometheusMetricsSource(settings(canned.url))
    service = ServicePolicy("ml", "chat")
    overridden = ServicePolicy("ml", "tokens")
    override = 'sum(rate(vllm:generation_tokens_total{namespace="{namespace}"}[{window}]))'
    source.set_service_queries({overridden.key: QueriesSpec(requestRate=override)})
    for who, signal in ((service, "request_rate"), (service, "latency"), (overridden, "request_rate")):
        canned.queries.clear()
        source.history(who, signal, NOW - 86_400, NOW, 3600.0)
        assert canned.queries and all("[3600s]" in q and "[120s]" not in q for q in range_queries(canned)), (
            who.key,
            signal,
            canned.queries,
        )
        canned.queries.clear()
        source.history(who, signal, NOW - 3600, NOW, 60.0)
        assert range_queries(canned) == [source.history_query(who, signal)], (who.key, signal)
        assert "[120s]" in source.history_query(who, signal)


# ---- 2. TLS: the settings' verification, whatever the environment says ---------------------------------------------


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not on PATH")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class TlsCannedPrometheus(CannedPrometheus):
    """The canned answers over HTTPS, with a throwaway self-signed certificate for 127.0.0.1."""

    def serve_tls(self, cert: Path, key: Path) -> TlsCannedPrometheus:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        server = self._http._server
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return self

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture
def tls_canned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TlsCannedPrometheus, Path]]:
    """A HTTPS canned Prometheus, its certificate, and ``REQUESTS_CA_BUNDLE`` naming another CA (as an image may)."""
    cert, key = _self_signed(tmp_path, "prometheus")
    other, _ = _self_signed(tmp_path, "corporate-ca")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
    server = TlsCannedPrometheus().serve_tls(cert, key).start()
    yield server, cert
    server.stop()


def _tls_source(server: TlsCannedPrometheus, **changes: Any) -> PrometheusMetricsSource:
    server.answers = {k: Answer(v) for k, v in copy.deepcopy(HEALTHY).items()}
    return PrometheusMetricsSource(settings(server.url, **changes))


def test_ca_bundle_is_used_although_requests_ca_bundle_is_set(
    tls_canned: tuple[TlsCannedPrometheus, Path],
) -> None:
    """Fixed (was a strict xfail). WRONG: the start-up check passed (the client passes ``verify``) and every query
    of the tick then failed to verify against the environment's bundle. RIGHT: ``ca_bundle`` verifies the tick's,
    the history's and the buildinfo request alike."""
    server, cert = tls_canned
    source = _tls_source(server, ca_bundle=cert)
    assert source.check().version == "canned"
    seen = source.observe([ServicePolicy("ml", "chat")], NOW, cluster=snapshot(P0, P1)).services["ml/chat"]
    assert seen.stale_reasons == () and seen.pods is not None and seen.pods.ready_with_metric == 2, seen
    matrix = {"resultType": "matrix", "result": [{"metric": {}, "values": [[NOW, "3"]]}]}
    server.answers["rate"] = Answer({"status": "success", "data": matrix})
    assert source.history(ServicePolicy("ml", "chat"), "request_rate", NOW - 600, NOW, 60.0).values == (3.0,)


def test_insecure_skip_verify_is_used_although_requests_ca_bundle_is_set(
    tls_canned: tuple[TlsCannedPrometheus, Path],
) -> None:
    """Fixed (was a strict xfail): ``insecure_skip_verify`` (tests only) is what the tick does too."""
    server, _ = tls_canned
    source = _tls_source(server, insecure_skip_verify=True)
    with pytest.warns(Warning):  # urllib3's InsecureRequestWarning: the setting is insecure, and says so
        seen = source.observe([ServicePolicy("ml", "chat")], NOW).services["ml/chat"]
    assert seen.stale_reasons == (), seen


def test_tls_failure_says_so_and_why(
    tls_canned: tuple[TlsCannedPrometheus, Path],
) -> None:
    """Fixed (was a strict xfail). No ``ca_bundle``: requests' own rule (the environment's bundle, else the
    system's) stays, and a server it does not trust is stale, never zero. WRONG: the reason said "unreachable" and
    was cut inside the URL before the cause (an SSLError is a ConnectionError, whose text repeats the whole URL).
    RIGHT: a TLS error, its cause and the setting to check, as the start-up check says it."""
    server, _ = tls_canned
    seen = _tls_source(server).observe([ServicePolicy("ml", "chat")], NOW).services["ml/chat"]
    assert seen.pods is None and seen.stale_reasons, seen
    reason = seen.stale_reasons[0]
    assert "TLS error" in reason and "certificate verify failed" in reason and "ca_bundle" in reason, reason
    assert "unreachable" not in reason and "/api/v1/query" not in reason, reason


# ---- 3. a NaN latency is "idle" only on complete answers -----------------------------------------------------------


def _idle_but(rate: dict[str, Any], latency: dict[str, Any] | None = None) -> dict[str, Any]:
    answers = copy.deepcopy(HEALTHY)
    answers.update(
        util=vector(series(gpu(0), "10"), series(gpu(1), "10")),
        rate=rate,
        queue=vector(series(app(P0), "0"), series(app(P1), "0")),
        latency=latency or vector(series({"namespace": "ml", "deployment": "chat"}, "NaN")),
    )
    return answers


def test_nan_latency_with_a_partial_zero_rate_keeps_the_guard_armed(canned: CannedPrometheus) -> None:
    """Fixed (was a strict xfail). WRONG: the rate of 0 came with a warning (the answer may be partial), the queue
    was empty and the latency NaN: read as idle, the guarded service scaled down to 1. RIGHT: a partial reason."""
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, min_replicas=1)
    rate = {**vector(series(app(P0), "0"), series(app(P1), "0")), "warnings": [WARNING]}
    obs = observe(canned, _idle_but(rate), policy, cluster=snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert any(r.startswith("latency:") for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) >= 2


def test_nan_latency_answer_flagged_partial_keeps_the_guard_armed(canned: CannedPrometheus) -> None:
    """Fixed (was a strict xfail): the latency answer's own warning was dropped with the NaN."""
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, min_replicas=1)
    latency = {**vector(series({"namespace": "ml", "deployment": "chat"}, "NaN")), "warnings": [WARNING]}
    rate = vector(series(app(P0), "0"), series(app(P1), "0"))
    obs = observe(canned, _idle_but(rate, latency), policy, cluster=snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert any(r.startswith("latency:") and "warning" in r for r in seen.partial_reasons), seen
    assert desired_after_window(obs, policy) >= 2


def test_nan_latency_on_complete_zero_answers_is_still_idle(canned: CannedPrometheus) -> None:
    """The idle case itself is unchanged: complete zeros and a NaN latency scale the guarded service down."""
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, min_replicas=1)
    obs = observe(canned, _idle_but(vector(series(app(P0), "0"), series(app(P1), "0"))), policy, snapshot(P0, P1))
    seen = obs.services[policy.key]
    assert (seen.stale_reasons, seen.partial_reasons) == ((), ()), seen
    assert desired_after_window(obs, policy) == 1


# ---- pins ------------------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_history_of_more_than_11000_points_is_asked_in_accepted_chunks(
    genai: GenaiDataset, genai_prometheus: PrometheusServer
) -> None:
    """Prometheus refuses a range of more than 11,000 points; with the default limit the real server accepts every
    chunk, and the points come back whole, once each, on the grid."""
    source = PrometheusMetricsSource(genai_settings(genai_prometheus.url))
    step = 1.0
    start = genai.end - 25_000 * step
    got = source.history(ServicePolicy("genai", "sd-xl"), "gpu_utilization", start, genai.end, step)
    assert got.times == tuple(sorted(set(got.times)))
    assert all(((t - start) / step).is_integer() for t in got.times)
    assert got.times[-1] == genai.end
    covered = [t for t in got.times if t >= genai.start + 300]
    assert len(covered) > 11_000  # more than one chunk's worth actually read


class BusyPrometheus(CannedPrometheus):
    """Every request answered 503 with ``Retry-After: 30``."""

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        self.queries.append(("any", req.path))
        body = json.dumps({"status": "error", "errorType": "unavailable", "error": "busy"}).encode()
        req.send_response(503)
        req.send_header("Retry-After", "30")
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)


def test_history_retry_after_is_a_bounded_wait_then_a_port_error() -> None:
    server = BusyPrometheus().start()
    try:
        source = PrometheusMetricsSource(settings(server.url, retries=1, retry_backoff_seconds=0.1, timeout_seconds=2))
        started = time.monotonic()
        with pytest.raises(PortError, match="HTTP Status Code 503"):
            source.history(ServicePolicy("ml", "chat"), "request_rate", NOW - 3600, NOW, 60.0)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert len(server.queries) == 2 and elapsed < 6, (server.queries, elapsed)


def test_history_selects_a_dotted_deployment_name_literally(canned: CannedPrometheus) -> None:
    """Deployment names may hold dots (DNS subdomains): in the pod regex a dot is escaped, so ``chat.v2`` never
    selects the pods of ``chatxv2``."""
    source = PrometheusMetricsSource(settings(canned.url))
    query = source.history_query(ServicePolicy("ml", "chat.v2"), "request_rate")
    assert 'pod=~"chat\\\\.v2-' in query and 'namespace="ml"' in query, query
