"""A tiny HTTP proxy in front of a real Prometheus that injects faults: slowness, 5xx, garbage, missing series.

It also records each request's path and headers, so tests can see what the adapter sent (auth, retries).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from promserver import LoopbackGetServer


@dataclass
class Fault:
    delay_s: float = 0.0
    status: int | None = None  # answer with this status (and a Prometheus-style error body) instead of forwarding
    fail_first: int = 0  # only the first N requests get ``status``; later ones pass (a transient outage)
    garbage: bytes | None = None  # answer 200 with this body
    drop: Callable[[str, dict[str, str]], bool] | None = None  # (query, series labels) -> remove from the answer


@dataclass
class Seen:
    path: str
    query: str
    headers: dict[str, str]


@dataclass
class FaultProxy:
    upstream_port: int
    fault: Fault = field(default_factory=Fault)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._http = LoopbackGetServer(self._handle)
        self.port = self._http.port
        self._lock = threading.Lock()
        self._count = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        query = parse_qs(parts.query).get("query", [""])[0]
        with self._lock:
            self.seen.append(Seen(parts.path, query, dict(req.headers.items())))
            self._count += 1
            count = self._count
        fault = self.fault
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.status is not None and (fault.fail_first == 0 or count <= fault.fail_first):
            body = json.dumps({"status": "error", "errorType": "unavailable", "error": "injected fault"}).encode()
            self._reply(req, fault.status, body)
            return
        if fault.garbage is not None:
            self._reply(req, 200, fault.garbage, "text/html")
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        conn.request("GET", req.path)
        answer = conn.getresponse()
        body = answer.read()
        conn.close()
        if fault.drop is not None and answer.status == 200:
            doc = json.loads(body)
            result = doc.get("data", {}).get("result")
            if isinstance(result, list):
                doc["data"]["result"] = [r for r in result if not fault.drop(query, r.get("metric", {}))]
                body = json.dumps(doc).encode()
        self._reply(req, answer.status, body)

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "application/json") -> None:
        try:
            req.send_response(status)
            req.send_header("Content-Type", content_type)
            req.send_header("Content-Length", str(len(body)))
            req.end_headers()
            req.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left; that is the point of the slow mode
