"""A tiny HTTP server on 127.0.0.1 that answers Prometheus API requests with canned bodies, per metric family.

The adapter under test talks real HTTP to it (requests, prometheus-api-client, retries), so parsing is tested
exactly as it runs in production; only the server's answers are made up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from promserver import LoopbackGetServer

NOW = 1_700_000_000.0

# Which family a query belongs to, by the metric name it mentions (first match wins).
FAMILY_MARKERS = (
    ("autoscaler_service", "override"),
    ("DCGM_FI_DEV_GPU_UTIL", "util"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "engine"),
    ("DCGM_FI_DEV_FB_USED", "fb_used"),
    ("DCGM_FI_DEV_FB_FREE", "fb_free"),
    ("request_success_total", "rate"),
    ("num_requests_waiting", "queue"),
    ("latency_seconds_bucket", "latency"),
    ("vector(1)", "check"),
)


def series(labels: dict[str, str], value: Any, ts: float = NOW) -> dict[str, Any]:
    return {"metric": labels, "value": [ts, value]}


def vector(*items: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": list(items)}}


@dataclass
class Answer:
    body: Any  # JSON-able object, or bytes sent as is
    status: int = 200


@dataclass
class CannedPrometheus:
    answers: dict[str, Answer] = field(default_factory=dict)
    queries: list[tuple[str, str]] = field(default_factory=list)  # (family, query)

    def __post_init__(self) -> None:
        self._http = LoopbackGetServer(self._handle)
        self.port = self._http.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CannedPrometheus:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        if parts.path == "/api/v1/status/buildinfo":
            self._reply(req, Answer({"status": "success", "data": {"version": "canned"}}))
            return
        query = parse_qs(parts.query).get("query", [""])[0]
        family = next((name for marker, name in FAMILY_MARKERS if marker in query), "unknown")
        self.queries.append((family, query))
        if family == "check":
            self._reply(req, Answer(vector(series({}, "1"))))
            return
        self._reply(req, self.answers.get(family, Answer(vector())))

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, answer: Answer) -> None:
        body = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
        req.send_response(answer.status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)


# ---- a healthy world: service ml/chat, two pods with one GPU each ----------------------------------------------

P0, P1 = "chat-7d9f8b6c5-x2x4b", "chat-7d9f8b6c5-qz7kd"


def gpu(i: int, **extra: str) -> dict[str, str]:
    pod = (P0, P1)[i]
    labels = {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "gpu": str(i),
        "UUID": f"GPU-{i}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
        "namespace": "ml",
        "pod": pod,
        "container": "server",
        "instance": "10.0.0.1:9400",
        "job": "dcgm-exporter",
    }
    labels.update(extra)
    return labels


def app(pod: str) -> dict[str, str]:
    return {"namespace": "ml", "pod": pod}


HEALTHY: dict[str, Any] = {
    "util": vector(series(gpu(0), "40"), series(gpu(1), "60")),
    "engine": vector(series(gpu(0), "0.4"), series(gpu(1), "0.6")),
    "fb_used": vector(series(gpu(0), "30000"), series(gpu(1), "50000")),
    "fb_free": vector(series(gpu(0), "51559"), series(gpu(1), "31559")),
    "rate": vector(series(app(P0), "1"), series(app(P1), "2")),
    "queue": vector(series(app(P0), "0"), series(app(P1), "3")),
    "latency": vector(series({"namespace": "ml", "deployment": "chat"}, "0.25")),
}
