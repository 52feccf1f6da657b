"""A 429/503 with Retry-After (Mimir/Cortex query-frontend, an ingress rate limit) must cost one tick a bounded
wait: urllib3 honours the header up to 6 h by default, which would stall the controller for minutes."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest
from canned import NOW, CannedPrometheus

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.model import ServicePolicy

RETRY_AFTER_S = 20


class BusyPrometheus(CannedPrometheus):
    """Every request: the given status with ``Retry-After: 20``."""

    status = 503

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        self.queries.append(("any", req.path))
        body = json.dumps({"status": "error", "errorType": "unavailable", "error": "too many queries"}).encode()
        req.send_response(self.status)
        req.send_header("Retry-After", str(RETRY_AFTER_S))
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_bounded_by_the_request_timeout(status: int) -> None:
    server = BusyPrometheus()
    server.status = status
    server.start()
    try:
        settings = PrometheusSettings(url=server.url, retries=1, retry_backoff_seconds=0.1, timeout_seconds=2)
        source = PrometheusMetricsSource(settings)
        started = time.monotonic()
        obs = source.observe([ServicePolicy("ml", "chat")], NOW)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert any(f"HTTP Status Code {status}" in r for r in obs.services["ml/chat"].stale_reasons), obs
    # the probe query and its one retry; the outage then ends the tick (no other query pays the same wait)
    assert len(server.queries) == 2, server.queries
    assert elapsed < 3 * settings.timeout_seconds, f"observe blocked {elapsed:.1f}s on Retry-After"
