"""A thin fault-injecting HTTPS reverse proxy in front of the real kube-apiserver (issue 13, item 6).

The real apiserver does not answer 409 storms, 429, 500/503, slow answers or dropped connections on demand; this
proxy does, for the requests a rule matches, and forwards everything else to the apiserver untouched (method, path,
query, headers with the bearer token, body; the answer's status, headers and body, streamed chunk by chunk, so a
``watch`` streams through too).

TLS stays on the client's side: the proxy serves HTTPS on 127.0.0.1 with the apiserver's own serving certificate
(its SANs include 127.0.0.1), so the client under test loads a kubeconfig with the same CA and token as it would
for the apiserver and runs the same TLS code path; the proxy opens its own TLS connection to the apiserver, one per
request (no pooling: a dropped client connection never leaves a half-read upstream behind).

A rule (``FaultProxy.inject``) matches the method (or ``*``), a regular expression searched in the path (decoded,
without the query) and optionally one searched in the raw query string. What it does, in order:

- ``delay_s``: hold the request that long first (longer than the client's timeout = a timeout; with nothing else,
  the request is then forwarded: a slow server, the write still happens);
- ``status``: answer that HTTP status with a ``kind: Status`` body as the apiserver writes it (reason, message,
  details; ``Retry-After`` and ``details.retryAfterSeconds`` with ``retry_after``) without forwarding;
- ``drop="before"``: close the connection without an answer (a reset: the client cannot know whether a write
  happened; here it did not, the request is not forwarded);
- ``drop="mid"``: forward, send the answer's status, headers and the first ``drop_after_bytes`` bytes of the body
  (or whatever arrived within ``drop_after_s`` for a stream), then cut the connection (a dropped watch, a list cut
  mid-body; the upstream request did happen).

``times`` (None = until ``clear``) counts the requests a rule affects, after ``skip`` matching ones went through.
Every request is recorded (method, path, query, status, whether a rule touched it, whether it was forwarded).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own business on each side; the rest is passed through.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_RESOURCE = re.compile(
    r"^/(?:api/[^/]+|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/[^/]+)?/(?P<kind>[^/]+)(?:/(?P<name>[^/]+))?"
)

Drop = Literal["before", "mid"]


@dataclass
class Rule:
    method: str = "*"
    path: str = ""
    query: str | None = None
    status: int | None = None
    retry_after: int | None = None
    reason: str | None = None
    message: str | None = None
    delay_s: float = 0.0
    drop: Drop | None = None
    drop_after_bytes: int = 0
    drop_after_s: float | None = None
    times: int | None = None
    skip: int = 0
    hits: int = 0  # requests this rule affected

    def matches(self, method: str, path: str, query: str) -> bool:
        if self.method not in ("*", method):
            return False
        if re.search(self.path, path) is None:
            return False
        return self.query is None or re.search(self.query, query) is not None


@dataclass
class Record:
    """One request, recorded when it arrives and completed as it is answered."""

    method: str
    path: str
    query: str
    faulted: bool  # a rule touched it
    status: int = -1  # -1: not answered yet (held, or in flight); 0: no answer (dropped before one)
    forwarded: bool = False  # it reached the apiserver
    time: float = field(default_factory=time.monotonic)


def status_body(code: int, path: str, reason: str | None, message: str | None, retry_after: int | None) -> bytes:
    """The ``kind: Status`` the apiserver answers with (``apimachinery/pkg/api/errors``), details from the path."""
    reason = reason or _REASONS.get(code, "InternalError")
    details: dict[str, Any] = {}
    m = _RESOURCE.match(path)
    if m:
        details["kind"] = m.group("kind")
        if m.group("group"):
            details["group"] = m.group("group")
        if m.group("name"):
            details["name"] = m.group("name")
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    if message is None:
        name = details.get("name", "")
        message = {
            409: f'Operation cannot be fulfilled on {details.get("kind", "resource")} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            429: "Too many requests, please try again later.",
            500: "Internal error occurred: injected by the fault proxy",
            503: "the server is currently unable to handle the request",
            504: "the server was unable to return a response in the time allotted",
        }.get(code, f"injected by the fault proxy: {code}")
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


class FaultProxy:
    """``FaultProxy(upstream, ca_file, cert_file, key_file).start()``; ``url`` is what a kubeconfig points at."""

    def __init__(self, upstream: str, ca_file: Path, cert_file: Path, key_file: Path, upstream_timeout_s: float = 60):
        parts = urlsplit(upstream)
        if parts.scheme != "https" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be https://host:port, not {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.upstream_timeout_s = upstream_timeout_s
        self._client_ctx = ssl.create_default_context(cafile=str(ca_file))
        self._server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_ctx.load_cert_chain(str(cert_file), str(key_file))
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.rules: list[Rule] = []
        self.records: list[Record] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_control_plane(cls, cp: Any) -> FaultProxy:
        """In front of a ``tests.realkube.control_plane.ControlPlane``, serving with the apiserver's certificate."""
        return cls(cp.server, cp.ca_file, cp.pki / "apiserver.crt", cp.pki / "apiserver.key")

    # -- lifecycle --

    def start(self) -> FaultProxy:
        handler = type("_BoundHandler", (_Handler,), {"proxy": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        httpd.socket = self._server_ctx.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # held requests wake up and drop
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("proxy not started")
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def write_kubeconfig(self, path: Path, token: str, ca_file: Path, namespace: str = "default") -> Path:
        """A kubeconfig like the apiserver's (same CA, same token) with the proxy as the server."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxied", "cluster": {"server": self.url, "certificate-authority": str(ca_file)}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [
                {"name": "proxied", "context": {"cluster": "proxied", "user": "user", "namespace": namespace}}
            ],
            "current-context": "proxied",
        }
        path.write_text(json.dumps(doc, indent=2))
        path.chmod(0o600)
        return path

    # -- rules --

    def inject(
        self,
        method: str = "*",
        path: str = "",
        status: int | None = None,
        *,
        query: str | None = None,
        retry_after: int | None = None,
        reason: str | None = None,
        message: str | None = None,
        delay_s: float = 0.0,
        drop: Drop | None = None,
        drop_after_bytes: int = 0,
        drop_after_s: float | None = None,
        times: int | None = None,
        skip: int = 0,
    ) -> Rule:
        if status is None and drop is None and not delay_s:
            raise ValueError("a rule needs a status, a drop or a delay")
        if status is not None and drop is not None:
            raise ValueError("a rule answers a status or drops the connection, not both")
        rule = Rule(
            method.upper(), path, query, status, retry_after, reason, message, delay_s, drop, drop_after_bytes,
            drop_after_s, times, skip,
        )  # fmt: skip
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _take(self, method: str, path: str, query: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.times is not None and rule.times <= 0:
                    continue
                if not rule.matches(method, path, query):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                if rule.times is not None:
                    rule.times -= 1
                rule.hits += 1
                return rule
        return None

    # -- the request log --

    def _record(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    def count(
        self,
        method: str | None = None,
        path: str | None = None,
        *,
        forwarded: bool | None = None,
        faulted: bool | None = None,
        ok: bool | None = None,
    ) -> int:
        """Requests seen so far (answered or not), by method, path regex, and whether they reached the apiserver /
        a rule touched them / got a 2xx."""
        with self._lock:
            return sum(
                1
                for r in self.records
                if (method is None or r.method == method.upper())
                and (path is None or re.search(path, r.path))
                and (forwarded is None or r.forwarded == forwarded)
                and (faulted is None or r.faulted == faulted)
                and (ok is None or (200 <= r.status < 300) == ok)
            )


class _Handler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's urllib3 pool expects

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self._write_lock = threading.Lock()  # the stream pump's writes against the cut
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        # The TLS handshake happens here, in the connection's own thread, not in the accept loop.
        try:
            self.connection.do_handshake()
        except (ssl.SSLError, OSError):
            return
        with contextlib.suppress(ssl.SSLError, ConnectionError, TimeoutError):
            super().handle()

    def _abort(self, reset: bool = True) -> None:
        """Cut the connection without a TLS close_notify: with a TCP reset (nothing more reaches the client), or
        with a FIN after what was sent (``reset=False``: the client reads it all, then an unexpected end)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            if reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            raw = socket.socket(fileno=self.connection.detach())
            raw.close()

    def _read_body(self) -> bytes:
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        proxy = self.proxy
        method = self.command
        split = urlsplit(self.path)
        path, query = unquote(split.path), split.query
        body = self._read_body()
        rule = proxy._take(method, path, query)
        entry = Record(method, path, query, rule is not None)
        proxy._record(entry)

        def record(status: int, forwarded: bool) -> None:
            with proxy._lock:
                entry.status, entry.forwarded = status, forwarded

        if rule is not None:
            if rule.delay_s and proxy._stopping.wait(rule.delay_s):
                record(0, False)
                self._abort()
                return
            if rule.drop == "before":
                record(0, False)
                self._abort()
                return
            if rule.status is not None:
                data = status_body(rule.status, path, rule.reason, rule.message, rule.retry_after)
                record(rule.status, False)
                with contextlib.suppress(OSError):
                    self.send_response(rule.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if rule.retry_after is not None:
                        self.send_header("Retry-After", str(rule.retry_after))
                    self.end_headers()
                    self.wfile.write(data)
                return
        self._forward(method, body, rule, record)

    def _forward(self, method: str, body: bytes, rule: Rule | None, record: Any) -> None:
        proxy = self.proxy
        conn = http.client.HTTPSConnection(
            proxy.upstream_host, proxy.upstream_port, context=proxy._client_ctx, timeout=proxy.upstream_timeout_s
        )
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP and k.lower() != "host"}
            if body or method in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            try:
                conn.request(method, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                data = status_body(502, "", "InternalError", f"fault proxy: upstream failed: {exc}", None)
                record(502, False)
                with contextlib.suppress(OSError):
                    self.send_response(502)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                return
            record(resp.status, True)
            self._relay(method, conn, resp, rule if rule is not None and rule.drop == "mid" else None)
        finally:
            conn.close()

    def _relay(
        self, method: str, conn: http.client.HTTPSConnection, resp: http.client.HTTPResponse, cut: Rule | None
    ) -> None:
        length = resp.getheader("Content-Length")
        no_body = method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        chunked = length is None and not no_body
        try:
            self.send_response_only(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            if no_body:
                return
            if cut is None:
                if not self._pump(resp, chunked, None, threading.Event()):
                    self._abort(reset=False)  # the apiserver's answer broke off: so does ours
                return
            if not cut.drop_after_s:
                self._pump(resp, chunked, cut.drop_after_bytes, threading.Event())
            else:
                # A stream: relay what arrives for drop_after_s in a thread of its own, then cut.
                stop = threading.Event()
                pump = threading.Thread(target=self._pump, args=(resp, chunked, None, stop), daemon=True)
                pump.start()
                pump.join(cut.drop_after_s)
                with self._write_lock:
                    stop.set()
                with contextlib.suppress(OSError):
                    if conn.sock is not None:
                        conn.sock.shutdown(socket.SHUT_RDWR)  # ends the pump's blocked read
                pump.join(5)
            self._abort(reset=False)
        except (OSError, http.client.HTTPException):
            self.close_connection = True  # the client went away (timeout), or the apiserver did

    def _pump(self, resp: http.client.HTTPResponse, chunked: bool, budget: int | None, stop: threading.Event) -> bool:
        """Copy the answer's body to the client (the first ``budget`` bytes only when given) until it ends or
        ``stop`` is set; a chunked answer is re-chunked as it arrives, so a watch streams event by event. True when
        the whole answer was relayed."""
        try:
            while budget is None or budget > 0:
                data = resp.read1(65536 if budget is None else min(65536, budget))
                with self._write_lock:
                    if stop.is_set():
                        return False
                    if not data:
                        if chunked and budget is None:
                            self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                        return True
                    if budget is not None:
                        budget -= len(data)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data)
                    self.wfile.flush()
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            return False  # AttributeError: http.client's reader, its socket shut down under it by the cut
        return False  # the budget ran out first

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve
