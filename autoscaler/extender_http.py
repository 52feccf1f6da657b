"""kube-scheduler's HTTP extender protocol around ``autoscaler.core.extender``: ``POST <prefix>/filter`` and
``POST <prefix>/prioritize``, answered from the controller's latest cluster snapshot -- never a request to the API.

The protocol (``k8s.io/kube-scheduler/extender/v1``, structs without json tags, so Go writes the field names as
they are spelled and reads them case-insensitively):

- request ``ExtenderArgs``: ``{"Pod": <v1.Pod>, "Nodes": <v1.NodeList> | null, "NodeNames": [<name>] | null}``
  (``NodeNames`` when the extender is configured ``nodeCacheCapable: true``, as ``deploy/`` does);
- filter answer ``ExtenderFilterResult``: ``{"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
  "Error"}`` -- every node passes, in the form it came in (a ``nodeCacheCapable`` answer without ``NodeNames``
  would filter out every node); ``deploy/`` does not configure the verb (``autoscaler.core.extender``);
- prioritize answer ``HostPriorityList``: ``[{"Host": <name>, "Score": 0..10}]``.

A request that is not the protocol (not JSON, nested too deeply, no node list) gets HTTP 400 with the reason in
``Error``; kube-scheduler then skips an ``ignorable`` extender. Everything else is answered 200, failing open when the
snapshot is missing or stale or the pod unreadable -- any field of the wrong JSON type (see the core module). A node of
a ``NodeList`` whose name cannot be read passes as it came (it is never dropped) and is not scored. A client that stops
sending (a body shorter than its ``Content-Length``), or sends it slower than the whole body in :data:`READ_TIMEOUT_S`,
is cut off with a 408. Every request
is counted by verb and result, timed, and a change of fail-open reason is logged once (not per request: the scheduler
calls twice per GPU pod).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from autoscaler.core.cluster import ClusterSnapshot, effective_request
from autoscaler.core.extender import (
    ExtenderConfig,
    FailOpen,
    PlacementView,
    PodRequest,
    Scorer,
    fgd_scores,
    filter_nodes,
    prioritize_nodes,
)
from autoscaler.telemetry import http_server

if TYPE_CHECKING:
    from autoscaler.ports import ClusterReader
    from autoscaler.telemetry import Telemetry

log = logging.getLogger("autoscaler.extender")

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
FILTER_VERB = "filter"
PRIORITIZE_VERB = "prioritize"
#: A request body's limit. With nodeCacheCapable: true (as deploy/ configures) a 5,000-node request is ~150 KB; a
#: full NodeList (nodeCacheCapable: false) of about a thousand nodes fits. Larger bodies are refused (413: the
#: scheduler, with ignorable: true, goes on without the extender): a 32 MiB body cost 1.5 GiB of memory to answer.
MAX_BODY_BYTES = 8 << 20
#: More candidate nodes than any cluster has (Kubernetes supports 5,000): a request beyond it is refused (400).
MAX_NODES = 50_000
#: Seconds a read of a request may wait (request line, headers, body) once its first byte came: a client that stops
#: sending (a Content-Length larger than its body) is cut off instead of holding a handler thread. kube-scheduler's
#: own extender timeout (httpTimeout) defaults to 5 s.
READ_TIMEOUT_S = 5.0
#: Seconds a kept-alive connection may wait for its next request: above kube-scheduler's client's idle-connection
#: timeout (90 s, client-go's SetTransportDefaults), so that the client, not us, ends an idle connection. Closed by
#: us first, a call written as it closes fails (Go does not retry a POST whose body it sent) and that pod is placed
#: without advice. Leadership loss and stop() end idle connections at once anyway.
IDLE_TIMEOUT_S = 120.0


class _HeadReader:
    """A connection's reader whose ``readline`` -- the request line and headers, as ``BaseHTTPRequestHandler`` reads
    them -- ends in TimeoutError at ``deadline`` (``time.monotonic()``; None: no deadline): the socket's timeout
    bounds each read only, and a client dripping a byte per timeout would hold the handler thread for ever."""

    def __init__(self, reader: Any, connection: socket.socket) -> None:
        self._reader = reader
        self._connection = connection
        self.deadline: float | None = None

    def readline(self, limit: int = -1) -> bytes:
        if self.deadline is None:
            return bytes(self._reader.readline(limit))
        line = bytearray()
        while limit < 0 or len(line) < limit:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's head took longer than the read timeout")
            self._connection.settimeout(left)
            buffered = self._reader.peek(1)  # what is buffered, or one read of the socket (b"": closed)
            if not buffered:
                break
            room = len(buffered) if limit < 0 else min(len(buffered), limit - len(line))
            end = buffered.find(b"\n", 0, room)
            line += self._reader.read(room if end < 0 else end + 1)
            if end >= 0:
                break
        return bytes(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class BadRequest(ValueError):
    """Not an ``ExtenderArgs``: answered 400 with the reason."""


class LatestSnapshot:
    """A ``ClusterReader`` that remembers the latest snapshot it returned: the controller's tick reads the cluster
    through it, and the extender answers from ``latest()`` (an attribute read: no lock, no API request)."""

    def __init__(self, reader: ClusterReader) -> None:
        self._reader = reader
        self._latest: ClusterSnapshot | None = None
        self._read_at: float | None = None  # time.monotonic() of the latest read

    def snapshot(self, now: float) -> ClusterSnapshot:
        snapshot = self._reader.snapshot(now)
        self._latest, self._read_at = snapshot, time.monotonic()
        return snapshot

    def latest(self) -> ClusterSnapshot | None:
        return self._latest

    def age_s(self) -> float | None:
        """Seconds since the latest snapshot was read, on the monotonic clock: a wall clock stepped back (NTP, a VM
        restored) must not make an old snapshot look fresh. None when none was read."""
        read_at = self._read_at
        return None if read_at is None else time.monotonic() - read_at

    def forget_pods(self, pods: Collection[tuple[str, str]]) -> None:
        """Drop these pods ("namespace", "name") from the latest snapshot: evicted by a rebalance pass, they are
        leaving, and the extender must place their replacements as if they had gone."""
        latest = self._latest
        if latest is not None and pods:
            kept = tuple(p for p in latest.pods if (p.namespace, p.name) not in pods)
            self._latest = replace(latest, pods=kept)

    def set(self, snapshot: ClusterSnapshot | None) -> None:
        """Replace the latest snapshot (tests, and a standby replica's own refresh)."""
        self._latest, self._read_at = snapshot, (time.monotonic() if snapshot is not None else None)


# ---- reading a v1.Pod -------------------------------------------------------------------------------------------


def _quantity_int(value: Any, where: str) -> int:
    """An extended-resource quantity ("2", 2): whole numbers only, as the API server enforces for them."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: not a quantity: {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise ValueError(f"{where}: {GPU_RESOURCE} must be a whole number, got {value!r}")
    if number < 0:
        raise ValueError(f"{where}: negative {GPU_RESOURCE}")
    return number


def _object(value: Any, where: str) -> Mapping[str, Any]:
    """A JSON object of the pod (absent or null: empty). ValueError for anything else: the pod is unreadable."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _array(value: Any, where: str) -> list[Any]:
    """A JSON array of the pod (absent or null: empty). ValueError for anything else: the pod is unreadable."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _container_gpus(container: Any, where: str) -> int:
    container = _object(container, where)
    resources = _object(container.get("resources"), f"{where}.resources")
    requests = _object(resources.get("requests"), f"{where}.resources.requests")
    limits = _object(resources.get("limits"), f"{where}.resources.limits")
    if GPU_RESOURCE in requests:
        return _quantity_int(requests[GPU_RESOURCE], where)
    if GPU_RESOURCE in limits:  # an extended resource's request defaults to its limit
        return _quantity_int(limits[GPU_RESOURCE], where)
    return 0


def _required_products(spec: Mapping[str, Any]) -> frozenset[str] | None:
    """The GPU types the pod's required node affinity allows (terms are ORed, a term's expressions ANDed); None when
    some term does not constrain the type (or there is no required affinity)."""
    affinity = _object(spec.get("affinity"), "spec.affinity")
    node_affinity = _object(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _object(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), where)
    terms = _array(required.get("nodeSelectorTerms"), f"{where}.nodeSelectorTerms")
    if not terms:
        return None
    allowed: set[str] = set()
    for t, raw_term in enumerate(terms):
        term = _object(raw_term, f"{where}.nodeSelectorTerms[{t}]")
        exprs = _array(term.get("matchExpressions"), f"{where}.nodeSelectorTerms[{t}].matchExpressions")
        term_allowed: set[str] | None = None
        for e, raw_expr in enumerate(exprs):
            expr = _object(raw_expr, f"{where}.nodeSelectorTerms[{t}].matchExpressions[{e}]")
            if expr.get("key") != GPU_PRODUCT_LABEL or expr.get("operator") != "In":
                continue
            values = _array(expr.get("values"), f"{where}.nodeSelectorTerms[{t}].matchExpressions[{e}].values")
            if not all(isinstance(v, str) for v in values):
                raise ValueError(f"{where}.nodeSelectorTerms[{t}].matchExpressions[{e}].values must be strings")
            term_allowed = set(values) if term_allowed is None else term_allowed & set(values)
        if term_allowed is None:
            return None  # this term lets any type through
        allowed |= term_allowed
    return frozenset(allowed)


def parse_pod(pod: Any) -> PodRequest:
    """The extender's view of a ``v1.Pod`` (JSON): its effective ``nvidia.com/gpu`` request (as kube-scheduler counts
    it: ``core.cluster.effective_request``, plus ``spec.overhead``), the GPU types its ``nodeSelector`` and required
    node affinity accept, its priority. ValueError, naming the field, when it cannot be read (a field of the wrong
    JSON type)."""
    if not isinstance(pod, Mapping):
        raise ValueError("the pod is not an object")
    meta = _object(pod.get("metadata"), "metadata")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError("the pod has no spec")
    name, namespace = meta.get("name"), meta.get("namespace")
    name = name if isinstance(name, str) else ""
    namespace = namespace if isinstance(namespace, str) else ""
    containers = _array(spec.get("containers"), "spec.containers")
    init = _array(spec.get("initContainers"), "spec.initContainers")
    app = [_container_gpus(c, f"spec.containers[{i}]") for i, c in enumerate(containers)]
    init_requests = []
    for i, c in enumerate(init):
        where = f"spec.initContainers[{i}]"
        init_requests.append((_container_gpus(c, where), _object(c, where).get("restartPolicy") == "Always"))
    overhead = _object(spec.get("overhead"), "spec.overhead")
    extra = _quantity_int(overhead[GPU_RESOURCE], "spec.overhead") if GPU_RESOURCE in overhead else 0
    gpus = effective_request(app, init_requests, extra)
    selector = _object(spec.get("nodeSelector"), "spec.nodeSelector").get(GPU_PRODUCT_LABEL)
    if selector is not None and not isinstance(selector, str):
        raise ValueError(f"spec.nodeSelector[{GPU_PRODUCT_LABEL}] must be a string, got {type(selector).__name__}")
    products = _required_products(spec)
    if selector is not None:
        products = frozenset({selector}) if products is None else products & {selector}
    if products is not None and not products:
        products = frozenset({""})  # contradictory: no node's type matches (the scheduler will not place it either)
    priority = spec.get("priority") or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"spec.priority must be an integer, got {priority!r}")
    return PodRequest(namespace, name, gpus, products, priority)


# ---- the protocol -----------------------------------------------------------------------------------------------


def _field(args: Mapping[str, Any], name: str) -> Any:
    """A field of a Go struct without json tags: matched case-insensitively, as Go's decoder does."""
    if name in args:
        return args[name]
    lowered = name.lower()
    for key, value in args.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _node_name(item: Any) -> str | None:
    """``metadata.name`` of a ``v1.Node`` of the NodeList; None when it is not a non-empty string (the node is kept
    as it came: failing open, never dropped). BadRequest when the item has no ``metadata.name`` at all."""
    meta = item.get("metadata") if isinstance(item, Mapping) else None
    if not isinstance(meta, Mapping) or "name" not in meta:
        raise BadRequest("a node in Nodes.items has no metadata.name")
    name = meta["name"]
    return name if isinstance(name, str) and name else None


def _decode(body: bytes) -> tuple[Any, list[str], list[Any] | None, list[str | None] | None]:
    """(pod, the readable node names, the NodeList's items and each item's name -- None where unreadable -- or None
    twice when names were sent). BadRequest when not ExtenderArgs."""
    try:
        args = json.loads(body)
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(args, Mapping):
        raise BadRequest("the body is not an ExtenderArgs object")
    names = _field(args, "NodeNames")
    node_list = _field(args, "Nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("NodeNames must be a list of strings")
        if len(names) > MAX_NODES:
            raise BadRequest(f"{len(names)} NodeNames: more than {MAX_NODES:,}")
        return _field(args, "Pod"), list(names), None, None
    if isinstance(node_list, Mapping):
        items = node_list.get("items") or []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items must be a list")
        if len(items) > MAX_NODES:
            raise BadRequest(f"{len(items)} Nodes: more than {MAX_NODES:,}")
        item_names = [_node_name(item) for item in items]
        return _field(args, "Pod"), [n for n in item_names if n is not None], items, item_names
    raise BadRequest("neither NodeNames nor Nodes was sent")


class Extender:
    """The two verbs over the latest snapshot: ``handle(verb, body) -> (HTTP status, JSON body)``. Thread-safe; the
    per-snapshot work (``PlacementView.of``) is done once per snapshot and shared by the requests."""

    def __init__(
        self,
        snapshots: Callable[[], ClusterSnapshot | None],
        config: ExtenderConfig | None = None,
        *,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.time,
        scorer: Scorer = fgd_scores,
        snapshot_age: Callable[[], float | None] | None = None,
    ) -> None:
        self._snapshots = snapshots
        # The snapshot's age, when the source knows it on the monotonic clock (``LatestSnapshot.age_s``); else the
        # wall ``clock`` minus the snapshot's time.
        self._snapshot_age = snapshot_age
        self.config = config if config is not None else ExtenderConfig()
        self._telemetry = telemetry
        self._clock = clock
        self._scorer = scorer
        self._lock = threading.Lock()
        self._view_of: tuple[ClusterSnapshot, PlacementView] | None = None
        self._last_fail_open: FailOpen | None = None
        self._last_refusal: tuple[str, int] | None = None  # the latest refused (verb, status): logged once per change

    def view(self) -> PlacementView | None:
        snapshot = self._snapshots()
        if snapshot is None:
            return None
        cached = self._view_of
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        with self._lock:  # one build per snapshot even when requests arrive together
            cached = self._view_of
            if cached is not None and cached[0] is snapshot:
                return cached[1]
            view = PlacementView.of(snapshot)
            self._view_of = (snapshot, view)
            return view

    def handle(self, verb: str, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        result = "error"
        try:
            status, payload, result = self._handle(verb, body)
        except BadRequest as exc:
            status, payload, result = 400, _error_payload(verb, str(exc)), "bad_request"
        except RecursionError:  # an answer too deep to write back (a NodeList item nested near the limit)
            status, payload, result = 400, _error_payload(verb, "the body is nested too deeply"), "bad_request"
        except Exception as exc:  # a bug answers 500 for this request; the server lives on
            log.exception("extender %s failed", verb)
            status, payload = 500, _error_payload(verb, f"{type(exc).__name__}: {exc}")
        finally:
            if self._telemetry is not None:
                self._telemetry.extender_requests.labels(verb=verb, result=result).inc()
                self._telemetry.extender_duration.labels(verb=verb).observe(time.perf_counter() - started)
        return status, json.dumps(payload, separators=(",", ":")).encode()

    def _handle(self, verb: str, body: bytes) -> tuple[int, Any, str]:
        raw_pod, names, items, item_names = _decode(body)
        try:
            pod: PodRequest | None = parse_pod(raw_pod)
        except (ValueError, TypeError, AttributeError, LookupError) as exc:  # any unreadable pod fails open
            log.debug("extender: unreadable pod, failing open: %s", exc)
            pod = None
        if item_names is not None and None in item_names:
            log.debug("extender: %d node(s) without a readable name, kept", item_names.count(None))
        now = self._clock()
        view = self.view()
        age = self._snapshot_age() if self._snapshot_age is not None else None
        if view is not None and age is not None:
            now = view.time + age  # judged by how long ago it was read, whatever the wall clock did since
        if verb == FILTER_VERB:
            outcome = filter_nodes(view, pod, names, now, self.config)
            self._note(verb, outcome.fail_open, view, now)
            # Every node passes, in the form it came in (core.extender: the scheduler's own filters, on its newer
            # cache, already said what our snapshot could say, and the snapshot could only be behind).
            passed: dict[str, Any] = {"NodeNames": list(outcome.passed), "Nodes": None}
            if items is not None:
                passed = {"NodeNames": None, "Nodes": {"items": list(items)}}
            payload = {**passed, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
            return 200, payload, "ok" if outcome.fail_open is None else "fail_open"
        if verb == PRIORITIZE_VERB:
            scored = prioritize_nodes(view, pod, names, now, self.config, self._scorer)
            self._note(verb, scored.fail_open, view, now)
            hosts = [{"Host": host, "Score": score} for host, score in scored.scores]
            return 200, hosts, "ok" if scored.fail_open is None else "fail_open"
        raise BadRequest(f"unknown verb {verb!r}")

    def refused(self, verb: str, status: int, why: str) -> None:
        """A request to a verb's path answered before it reached ``handle`` (``status``: 413, 408, 411, 503): counted
        as ``result="refused"``, and logged as a warning when the refusal differs from the last one (the scheduler,
        ``ignorable``, places the pod without advice; an extender refusing every call must be visible)."""
        if self._telemetry is not None:
            self._telemetry.extender_requests.labels(verb=verb, result="refused").inc()
        if (verb, status) != self._last_refusal:
            self._last_refusal = (verb, status)
            log.warning("extender: %s request refused, HTTP %d: %s (the scheduler goes on without advice)", verb,
                        status, why)  # fmt: skip

    def _note(self, verb: str, why: FailOpen | None, view: PlacementView | None, now: float) -> None:
        if why is not None and self._telemetry is not None:
            self._telemetry.extender_fail_open.labels(verb=verb, reason=why.value).inc()
        if why == self._last_fail_open:
            return
        self._last_fail_open = why
        if why is None:
            log.info("extender: advising from the snapshot again")
        elif why is FailOpen.STALE_SNAPSHOT and view is not None:
            log.warning(
                "extender: failing open, the snapshot is %.0fs old (max %gs)",
                now - view.time,
                self.config.max_snapshot_age_s,
            )
        else:
            log.warning("extender: failing open, %s", why.value.replace("_", " "))


def _error_payload(verb: str, message: str) -> Any:
    if verb == PRIORITIZE_VERB:
        return {"Error": message}  # any non-200 answer is an error to the scheduler; the body is for humans
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


# ---- the HTTP server --------------------------------------------------------------------------------------------


class ExtenderServer:
    """``POST <prefix>/filter``, ``POST <prefix>/prioritize`` (and ``GET /healthz``) on a threaded stdlib server of
    its own, so that scheduler traffic and the probes on the metrics port never wait for each other. Another method on
    a verb's path is a 405 (``Allow: POST``); a request whose body is not read ends its connection."""

    def __init__(
        self,
        extender: Extender,
        bind_address: str = "",
        port: int = 8081,
        prefix: str = "/scheduler",
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        if not read_timeout_s > 0:
            raise ValueError("read_timeout_s must be > 0")
        if not idle_timeout_s > 0:
            raise ValueError("idle_timeout_s must be > 0")
        self.extender = extender
        routes = {f"{prefix.rstrip('/')}/{verb}": verb for verb in (FILTER_VERB, PRIORITIZE_VERB)}
        # The open connections (the scheduler keeps its connections alive), to close them when this replica stops
        # leading or stops: kube-proxy keeps an established connection on the endpoint it chose, so the leader-only
        # Service alone would leave a former leader advising on it. And a stopping server answers nothing more.
        self._connections: set[socket.socket] = set()
        self._closing: set[socket.socket] = set()  # answer the request being read (if any), then close
        self._connections_lock = threading.Lock()
        self._stopping = threading.Event()
        server_ref = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the scheduler's client reuses its connections
            # The whole answer in one write, sent at once: headers and body in two small writes on a kept-alive
            # connection wait ~40 ms for the peer's delayed ACK (Nagle).
            wbufsize = 1 << 16
            disable_nagle_algorithm = True
            # A timeout on every read of the socket (StreamRequestHandler.setup sets it): a request line or headers
            # that stop coming end in handle_one_request's TimeoutError branch (connection closed), a body that
            # stops coming in the 408 below. The wait for a request's first byte has its own, longer timeout.
            timeout = read_timeout_s

            def handle_one_request(self) -> None:
                try:
                    self.connection.settimeout(idle_timeout_s)
                    waiting = self.rfile.peek(1)  # type: ignore[attr-defined]  # a BufferedReader (rbufsize -1)
                    self.connection.settimeout(read_timeout_s)
                except OSError:  # idle past the timeout, or reset by the client
                    waiting = b""
                if not waiting:  # the client closed it, it stayed idle too long, or close_connections() ended it
                    self.close_connection = True
                    return
                self._head.deadline = time.monotonic() + read_timeout_s
                try:
                    super().handle_one_request()
                finally:
                    self._head.deadline = None
                    with contextlib.suppress(OSError):
                        self.connection.settimeout(read_timeout_s)

            def parse_request(self) -> bool:
                parsed = super().parse_request()  # reads the headers
                self._head.deadline = None  # the head is read: the body has its own deadline (_read_body)
                with contextlib.suppress(OSError):
                    self.connection.settimeout(read_timeout_s)  # not what the head's deadline left of it
                return parsed

            def setup(self) -> None:
                super().setup()
                self._head = _HeadReader(self.rfile, self.connection)
                self.rfile = self._head  # type: ignore[assignment]  # a reader of rfile's interface
                with server_ref._connections_lock:
                    server_ref._connections.add(self.connection)

            def finish(self) -> None:
                with server_ref._connections_lock:
                    server_ref._connections.discard(self.connection)
                    server_ref._closing.discard(self.connection)
                super().finish()

            def _marked_for_closing(self) -> bool:
                with server_ref._connections_lock:
                    return self.connection in server_ref._closing

            def do_POST(self) -> None:
                verb = routes.get(self.path.split("?", 1)[0])
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if server_ref._stopping.is_set():
                    self.close_connection = True  # its body is not read: the connection ends with this answer
                    self._reply(503, b'{"Error":"stopping: ask the leader\'s Service again"}')
                    if verb is not None:
                        extender.refused(verb, 503, "the server is stopping")
                    return
                if self._marked_for_closing():
                    # a request that came in as the connection was being closed: answered, and the connection ends
                    self.close_connection = True
                if verb is None:
                    self.close_connection = True  # its body is not read: left there, it would be the next request
                    self._reply(404, b'{"Error":"not found"}')
                    return
                if self.headers.get("Transfer-Encoding"):
                    # kube-scheduler sends a Content-Length; a chunked body is not read, so the connection ends here
                    self.close_connection = True
                    self._reply(411, json.dumps({"Error": "a Content-Length is required"}).encode())
                    extender.refused(verb, 411, "a chunked body (no Content-Length)")
                    return
                if not 0 <= length <= MAX_BODY_BYTES:
                    self.close_connection = True
                    status = 413 if length > 0 else 411
                    self._reply(status, json.dumps({"Error": "bad Content-Length"}).encode())
                    declared = self.headers.get("Content-Length")
                    extender.refused(verb, status, f"Content-Length {declared!r} (at most {MAX_BODY_BYTES})")
                    return
                data = self._read_body(length)
                if len(data) < length:  # the client stopped sending (timed out) or closed before the whole body
                    self.close_connection = True
                    error = {"Error": f"the body ended after {len(data)} of {length} bytes (Content-Length)"}
                    with contextlib.suppress(OSError):  # the client may be gone already
                        self._reply(408, json.dumps(error).encode())
                    extender.refused(verb, 408, error["Error"])
                    return
                status, body = extender.handle(verb, data)
                self._reply(status, body)

            def _read_body(self, length: int) -> bytes:
                """The body, or what came of it before the client stopped (a read timeout), closed, or ran out of
                the whole body's time (a client dripping a byte per read timeout would hold the thread for ever)."""
                chunks: list[bytes] = []
                received = 0
                deadline = time.monotonic() + read_timeout_s
                while received < length:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        self.connection.settimeout(left)
                        chunk = self.rfile.read1(length - received)
                    except TimeoutError:
                        break
                    if not chunk:
                        break
                    chunks.append(chunk)
                    received += len(chunk)
                with contextlib.suppress(OSError):
                    self.connection.settimeout(read_timeout_s)  # a kept-alive connection's next request
                return b"".join(chunks)

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/healthz":
                    self._not_post()
                    return
                self._leave_body_unread()
                self._reply(200, b'{"status":"ok"}')

            def _not_post(self) -> None:
                """Any method but POST (a verb's path: 405, so that ``curl`` without ``-X POST`` does not look like
                a wrong urlPrefix), its body unread."""
                self._leave_body_unread()
                if routes.get(self.path.split("?", 1)[0]) is None:
                    self._reply(404, b'{"Error":"not found"}')
                else:
                    self._reply(405, b'{"Error":"method not allowed: the extender\'s verbs are POST"}', allow="POST")

            do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_post
            do_HEAD = do_GET  # _reply sends no body to a HEAD

            def _leave_body_unread(self) -> None:
                """A body this request declares is not read: left on the connection it would be read as the next
                request, so the connection ends after the answer."""
                length = (self.headers.get("Content-Length") or "0").strip()
                if self.headers.get("Transfer-Encoding") or length != "0":
                    self.close_connection = True

            def _reply(self, status: int, body: bytes, allow: str | None = None) -> None:
                self.send_response(status)
                if self.close_connection:
                    self.send_header("Connection", "close")  # the client must not send another request on it
                if allow is not None:
                    self.send_header("Allow", allow)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("extender http: " + format, *args)

        self._server = http_server(bind_address, port, Handler)  # "::" (IPv6-only clusters) failed at start-up
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="extender-http", daemon=True
        )
        self._thread.start()

    def close_connections(self) -> None:
        """End every open connection after the request it is answering, if any: a handler waiting for the next
        request on a kept-alive connection reads its end at once and closes it (one already reading a request answers
        it with ``Connection: close``). The scheduler reconnects through the Service on its next call (to the
        leader). Called when this replica stops leading."""
        with self._connections_lock:
            connections = list(self._connections)
            self._closing.update(connections)  # one in the middle of reading a request answers it, then closes
        for connection in connections:
            with contextlib.suppress(OSError):  # closed meanwhile
                connection.shutdown(socket.SHUT_RD)
        if connections:
            log.info("extender: closed %d kept-alive connection(s)", len(connections))

    def stop(self) -> None:
        self._stopping.set()  # a request already on its way is answered 503 (skipped by the scheduler: ignorable)
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
        self.close_connections()
