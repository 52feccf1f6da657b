"""The controller's own Prometheus metrics and its HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``).

Metric names start with ``gpu_autoscaler_``; reason labels are ``Reason.value`` so that dashboards, alerts, Events
and logs use the same words. Every instance has its own registry, so tests can build many controllers in one
process without the global registry's duplicate-name errors.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PREFIX = "gpu_autoscaler"

# Ticks read the cluster and Prometheus: tens of ms on a small cluster, seconds on a large one, and the 15 s tick
# interval is the point where ticks would start to overlap.
TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0)

# Components named in gpu_autoscaler_errors_total{component}.
ERROR_COMPONENTS = (
    "metrics_read",
    "cluster_read",
    "policy_read",
    "decide",
    "cluster_write",
    "event_write",
    "status_write",
    "node_pool",
    "leader_election",
    "refit",
    "rebalance",
)


# The scheduler extender answers from memory: tens of microseconds for a few nodes, milliseconds for thousands; the
# scheduler's httpTimeout (deploy/: 1 s) is the end of the range.
EXTENDER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
EXTENDER_VERBS = ("filter", "prioritize")
EXTENDER_RESULTS = ("ok", "fail_open", "bad_request", "refused", "error")
EXTENDER_FAIL_OPEN = ("no_snapshot", "stale_snapshot", "bad_pod")

# Results named in gpu_autoscaler_forecast_fits_total{result}.
FIT_RESULTS = ("ok", "failed", "timeout", "no_data")

# Counter children created at zero with the registry, so that increase() and rate() count an alert's first event (a
# child that appears at its first increment starts at 1, and increase() reads that first sample as no change). Only
# the label values the alerts of deploy/rules/gpu-autoscaler.rules.yml read, which keeps the series count fixed.
TICK_RESULTS = ("ok", "hold", "error", "standby")
# gpu_autoscaler_decisions_total{reason}: GPUAutoscalerSLOBreachPersistent, GPUAutoscalerServiceAtMaxReplicas.
ALERTED_DECISION_REASONS = ("slo_breach", "at_max_replicas")
# gpu_autoscaler_actions_total{kind, reason}: the (kind, reason) pairs the controller plans (core/decide.py: a
# ScaleDeployment carries the reason of the decision that changed the replicas; core/arbitrate.py; core/rebalance.py).
SCALE_REASONS = (
    "metric_above_target",
    "metric_below_target",
    "slo_breach",
    "scale_up_stabilised",
    "scale_down_stabilised",
    "scale_up_rate_limited",
    "scale_down_rate_limited",
    "at_min_replicas",
    "at_max_replicas",
    "forecast_floor",
    "forecast_hold",
)
ACTION_KIND_REASONS = (
    *(("ScaleDeployment", reason) for reason in SCALE_REASONS),
    ("EvictPod", "preempt_for_inference"),
    ("EvictPod", "rebalance"),
    ("SuspendWorkload", "preempt_for_inference"),
    ("ResumeWorkload", "resume_training"),
    ("ScaleNodePool", "burst_scale_up"),
    ("ScaleNodePool", "burst_scale_down"),
    ("ScaleNodePool", "burst_node_not_registered"),
    ("ScaleNodePool", "burst_node_not_ready"),
)
# (kind, result) pairs the alerts count: every kind failed (GPUAutoscalerActionsFailing), evictions blocked
# (GPUAutoscalerEvictionsBlocked), resumed training (GPUAutoscalerTrainingThrash), pool resizes applied
# (GPUAutoscalerBurstNodesNotRegistering). These results only happen when the controller writes, so their dry_run
# label is always "false".
ALERTED_ACTION_RESULTS = (
    *((kind, "failed") for kind in dict.fromkeys(kind for kind, _ in ACTION_KIND_REASONS)),
    ("EvictPod", "blocked"),
    ("ResumeWorkload", "applied"),
    ("ScaleNodePool", "applied"),
)


@dataclass(frozen=True, slots=True)
class ServiceGauges:
    """The per-service values exported after a tick (None = unknown, not exported)."""

    namespace: str
    service: str
    current_replicas: int | None
    desired_replicas: int | None
    stale_reasons: tuple[str, ...] = ()


class _ServiceCollector(Collector):
    """Per-service gauges from the latest tick's snapshot, exported atomically.

    A plain labelled Gauge would keep exporting services that were deleted or recovered from staleness; a collector
    that renders the latest snapshot has no such leftovers, and a scrape never sees half a tick.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._services: tuple[ServiceGauges, ...] = ()

    def update(self, services: Iterable[ServiceGauges]) -> None:
        snapshot = tuple(services)
        with self._lock:
            self._services = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            services = self._services
        current = GaugeMetricFamily(
            f"{PREFIX}_current_replicas",
            "Replicas on the Deployment's scale subresource at the latest tick",
            labels=["namespace", "service"],
        )
        desired = GaugeMetricFamily(
            f"{PREFIX}_desired_replicas",
            "Replicas the latest plan wants (equal to current when holding)",
            labels=["namespace", "service"],
        )
        stale = GaugeMetricFamily(
            f"{PREFIX}_stale_services",
            "1 when a service's metrics were missing or stale at the latest tick, by reason",
            labels=["namespace", "service", "reason"],
        )
        for s in services:
            if s.current_replicas is not None:
                current.add_metric([s.namespace, s.service], s.current_replicas)
            if s.desired_replicas is not None:
                desired.add_metric([s.namespace, s.service], s.desired_replicas)
            for reason in s.stale_reasons:
                stale.add_metric([s.namespace, s.service, reason], 1)
        return [current, desired, stale]


# One series' fit: milliseconds for the baselines, about a second for Holt-Winters on a week at 60 s, up to the
# fit timeout (120 s by default) for the slowest models.
FIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True, slots=True)
class ForecastGauges:
    """The per-service forecast values exported after a tick (None = unknown, not exported)."""

    namespace: str
    service: str
    pinball_ratio: float | None  # recent pinball loss / seasonal naive's on the same values
    reliable: bool | None
    fit_age_s: float | None
    floor_replicas: int | None  # replicas the forecast asks for (also in shadow mode); None when not usable
    # forecast_stale | forecast_unreliable | forecast_missing: the service scales reactively only
    fallback_reason: str | None = None
    headroom_ratio: float | None = None  # share of the spec's target an ACTIVE forecasting service runs at
    headroom_state: str | None = None  # core.headroom.HeadroomState value
    # share of the quantile's excess over the median the floor provisioned (calibrated excess); None: no usable floor
    excess_share: float | None = None


class _ForecastCollector(Collector):
    """Per-service forecast accountability from the latest tick, rendered atomically like ``_ServiceCollector``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._services: tuple[ForecastGauges, ...] = ()

    def update(self, services: Iterable[ForecastGauges]) -> None:
        snapshot = tuple(services)
        with self._lock:
            self._services = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            services = self._services
        labels = ["namespace", "service"]
        ratio = GaugeMetricFamily(
            f"{PREFIX}_forecast_pinball_ratio",
            "Recent pinball loss of the service's forecast at its provisioned quantile divided by the seasonal-naive "
            "baseline's on the same values (below 1 = better than the baseline)",
            labels=labels,
        )
        reliable = GaugeMetricFamily(
            f"{PREFIX}_forecast_reliable",
            "1 when the service's forecast is trusted, 0 when its recent error is above the threshold (reactive only)",
            labels=labels,
        )
        age = GaugeMetricFamily(
            f"{PREFIX}_forecast_fit_age_seconds",
            "Seconds since the parameters of the service's published forecast were last fitted (its latest successful "
            "refit; updates re-condition a fit without renewing it), at the latest tick",
            labels=labels,
        )
        floor = GaugeMetricFamily(
            f"{PREFIX}_forecast_floor_replicas",
            "Replicas the forecast asks for at now + lead time (reported in shadow mode too)",
            labels=labels,
        )
        fallback = GaugeMetricFamily(
            f"{PREFIX}_forecast_fallback",
            "1 when a forecasting service scales reactively only, by reason: forecast_stale (its latest fit is too "
            "old), forecast_unreliable (its recent error is above the seasonal-naive baseline's), forecast_missing "
            "(an active service without a usable forecast: no fit yet, as for a new service until it has enough "
            "history, or a metric other than the request rate without spec.forecast.ratePerReplica; not alerted on)",
            labels=[*labels, "reason"],
        )
        headroom = GaugeMetricFamily(
            f"{PREFIX}_headroom_target_ratio",
            "Share of its spec's target an active forecasting service runs at: 1 once its forecast has earned the "
            "target (its quantile covered the demand), lower while learning or when the forecast degrades",
            labels=labels,
        )
        excess = GaugeMetricFamily(
            f"{PREFIX}_forecast_excess_share",
            "Share of the forecast quantile's excess over the median that the service's floor provisions: what its "
            "recent scores needed to cover that quantile (calibrated excess; 1 = the quantile as fitted)",
            labels=labels,
        )
        headroom_state = GaugeMetricFamily(
            f"{PREFIX}_headroom_state",
            "1 for the service's earned-headroom state (learning, earned, partial, degraded, untrusted)",
            labels=[*labels, "state"],
        )
        for s in services:
            key = [s.namespace, s.service]
            if s.headroom_ratio is not None:
                headroom.add_metric(key, s.headroom_ratio)
            if s.excess_share is not None:
                excess.add_metric(key, s.excess_share)
            if s.headroom_state is not None:
                headroom_state.add_metric([*key, s.headroom_state], 1)
            if s.fallback_reason is not None:
                fallback.add_metric([*key, s.fallback_reason], 1)
            if s.pinball_ratio is not None:
                ratio.add_metric(key, s.pinball_ratio)
            if s.reliable is not None:
                reliable.add_metric(key, 1 if s.reliable else 0)
            if s.fit_age_s is not None:
                age.add_metric(key, s.fit_age_s)
            if s.floor_replicas is not None:
                floor.add_metric(key, s.floor_replicas)
        return [ratio, reliable, age, floor, fallback, headroom, excess, headroom_state]


class Telemetry:
    """All controller metrics, in one registry."""

    def __init__(self, identity: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.ticks = Counter(
            f"{PREFIX}_ticks",
            "Control ticks by result: ok, hold (a read failed: nothing destructive done), error, standby (follower)",
            ["result"],
            registry=r,
        )
        self.tick_duration = Histogram(
            f"{PREFIX}_tick_duration_seconds",
            "Wall time of one control tick (observe, read, decide, act), seconds",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        self.actions = Counter(
            f"{PREFIX}_actions",
            "Actions of the plans, by kind, reason, dry_run and result (applied: written; unchanged: already so, "
            "gone: the object is not there any more, nothing written either; failed, blocked, held, not_leader, "
            "skipped, dry_run)",
            ["kind", "reason", "dry_run", "result"],
            registry=r,
        )
        self.decisions = Counter(
            f"{PREFIX}_decisions",
            "Per-service decisions by reason (one per service per tick, whether or not it changes anything)",
            ["reason"],
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors", "Errors by component (a read, a write, the lease...)", ["component"], registry=r
        )
        self.leader = Gauge(
            f"{PREFIX}_leader", "1 when this process holds the leader Lease and acts", ["identity"], registry=r
        )
        self.dry_run = Gauge(f"{PREFIX}_dry_run", "1 when the controller runs in dry-run mode", registry=r)
        self.last_success = Gauge(
            f"{PREFIX}_last_successful_tick_timestamp_seconds",
            "Unix time of the latest tick that read everything it needed",
            registry=r,
        )
        self.invalid_policies = Gauge(
            f"{PREFIX}_invalid_policies",
            "GPUScalingPolicy objects rejected by validation at the latest tick",
            registry=r,
        )
        self.process_start_time = Gauge(
            f"{PREFIX}_process_start_time_seconds",
            "Start time of the controller process (when its metrics were created), seconds since the Unix epoch",
            registry=r,
        )
        self.process_start_time.set(time.time())
        self._identity = identity
        self.leader.labels(identity=identity).set(0)
        for component in ERROR_COMPONENTS:
            self.errors.labels(component=component)  # export zeros so that rate() works from the first error
        for result in TICK_RESULTS:
            self.ticks.labels(result=result)
        for reason in ALERTED_DECISION_REASONS:
            self.decisions.labels(reason=reason)
        alerted = set(ALERTED_ACTION_RESULTS)
        for kind, reason in ACTION_KIND_REASONS:
            for result in ("failed", "blocked", "applied"):
                if (kind, result) in alerted:
                    self.actions.labels(kind=kind, reason=reason, dry_run="false", result=result)
        self.services = _ServiceCollector()
        r.register(self.services)
        self.forecast_fit_duration = Histogram(
            f"{PREFIX}_forecast_fit_duration_seconds",
            "Wall time of one series' forecast fit (and model selection when due) in the refit job, seconds",
            buckets=FIT_BUCKETS,
            registry=r,
        )
        self.forecast_updates = Counter(
            f"{PREFIX}_forecast_updates",
            "Per-series outcomes of the update job that re-conditions the latest fit on new history between refits: "
            "ok, failed (the model's update raised), no_data (history unreadable or too old)",
            ["result"],
            registry=r,
        )
        self.forecast_fits = Counter(
            f"{PREFIX}_forecast_fits",
            "Per-series outcomes of the refit job: ok, failed (the fit raised), timeout, no_data (history "
            "unreadable or too short); the previous fit stays in use until it is stale",
            ["result"],
            registry=r,
        )
        for result in FIT_RESULTS:
            self.forecast_fits.labels(result=result)
        self.forecast_refit_duration = Gauge(
            f"{PREFIX}_forecast_refit_duration_seconds",
            "Wall time of the latest refit round (all series: history reads and fits), seconds",
            registry=r,
        )
        self.forecasts = _ForecastCollector()
        r.register(self.forecasts)
        # Capacity arbitration (issue 12). Preemptions and burst scale-ups by reason are in gpu_autoscaler_actions
        # (kind SuspendWorkload/EvictPod, reason preempt_for_inference; kind ScaleNodePool, reason burst_*).
        self.training_lost = Counter(
            f"{PREFIX}_training_gpu_hours_lost",
            "Training work the controller's preemptions threw away (GPUs x hours since each stopped gang's last "
            "checkpoint, else its start), GPU-hours",
            registry=r,
        )
        self.gangs_stopped = Counter(
            f"{PREFIX}_training_gangs_stopped",
            "Training gangs the controller stopped (suspended, or every pod evicted), by how",
            ["how"],
            registry=r,
        )
        for how in ("suspend", "evict"):
            self.gangs_stopped.labels(how=how)
        self.delete_marks_left = Counter(
            f"{PREFIX}_node_pool_delete_marks_left",
            "cluster.x-k8s.io/delete-machine marks a burst scale-down left on a Machine after its size write did not "
            "go through (the next scale-down of the pool, anyone's, removes that node), by why",
            ["reason"],
            registry=r,
        )
        for why in ("outcome_unknown", "size_fell", "size_unreadable", "unmark_failed", "not_leader"):
            self.delete_marks_left.labels(reason=why)
        self.burst_nodes = Gauge(
            f"{PREFIX}_burst_nodes", "Nodes of each burst pool at the latest tick (booting included)", ["pool"],
            registry=r,
        )
        self.burst_spend = Gauge(
            f"{PREFIX}_burst_spend_per_hour",
            "What the burst pools' nodes cost per hour at the latest tick, in the pools' currency",
            registry=r,
        )
        self.capacity_shortfall = Gauge(
            f"{PREFIX}_capacity_shortfall_gpus",
            "GPUs inference wanted at the latest tick that neither free GPUs nor booting nodes had",
            registry=r,
        )

        # Rebalancing (issue 15). Its moves are in gpu_autoscaler_actions (kind EvictPod, reason rebalance).
        self.rebalance_passes = Counter(
            f"{PREFIX}_rebalance_passes",
            "Rebalance passes by result: ok (planned, moves applied or none needed), held (the latest tick held or "
            "failed, or the cluster could not be read: no move), error",
            ["result"],
            registry=r,
        )
        for result in ("ok", "held", "error"):
            self.rebalance_passes.labels(result=result)
        self.stranded_gpus = Gauge(
            f"{PREFIX}_stranded_gpus",
            "Free GPUs on ready nodes where none of the waiting GPU pods (pending, or training this controller "
            "suspended) fits, at the latest rebalance pass: free but unusable for the shapes that wait, GPUs",
            registry=r,
        )
        self.rebalance_moves_last_hour = Gauge(
            f"{PREFIX}_rebalance_moves_last_hour",
            "Pods the rebalancer evicted over the last hour at the latest pass (bounded by "
            "rebalance.max_moves_per_hour), pods",
            registry=r,
        )
        self.rebalance_held_seconds = Gauge(
            f"{PREFIX}_rebalance_held_seconds",
            "Seconds the rebalancer still holds every move at the latest pass (the put-back hold: "
            "rebalance.put_back_checks targets in a row whose room the scheduler refilled), 0 when not held, seconds",
            registry=r,
        )

        # Placement advice for kube-scheduler (issue 15): its HTTP extender, served from the latest snapshot.
        self.extender_requests = Counter(
            f"{PREFIX}_extender_requests",
            "Scheduler extender requests by verb (filter, prioritize) and result: ok, fail_open (no advice: every "
            "node passes, every score 0), bad_request (not the extender protocol, HTTP 400), refused (answered before "
            "reading: a body too large (413), incomplete (408), without a length (411), or the server stopping "
            "(503)), error (HTTP 500)",
            ["verb", "result"],
            registry=r,
        )
        self.extender_fail_open = Counter(
            f"{PREFIX}_extender_fail_open",
            "Scheduler extender requests answered without advice, by verb and reason: no_snapshot, stale_snapshot "
            "(older than scheduler_extender.max_snapshot_age_seconds), bad_pod (the pod could not be read)",
            ["verb", "reason"],
            registry=r,
        )
        self.extender_duration = Histogram(
            f"{PREFIX}_extender_request_duration_seconds",
            "Time to answer one scheduler extender request (decode, advise, encode; not the network), seconds",
            ["verb"],
            buckets=EXTENDER_BUCKETS,
            registry=r,
        )
        for verb in EXTENDER_VERBS:
            for result in EXTENDER_RESULTS:
                self.extender_requests.labels(verb=verb, result=result)
            for reason in EXTENDER_FAIL_OPEN:
                self.extender_fail_open.labels(verb=verb, reason=reason)

    def set_leader(self, leader: bool) -> None:
        self.leader.labels(identity=self._identity).set(1 if leader else 0)

    def error(self, component: str) -> None:
        self.errors.labels(component=component).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


HealthCheck = Callable[[], tuple[bool, str]]


class HttpServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a small threaded stdlib server (no extra dependency)."""

    def __init__(
        self,
        telemetry: Telemetry,
        healthz: HealthCheck,
        readyz: HealthCheck,
        bind_address: str = "",
        port: int = 8080,
        extra: Mapping[str, Callable[[], tuple[int, str, bytes]]] | None = None,
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, telemetry.render()),
            "/healthz": lambda: _check(healthz),
            "/readyz": lambda: _check(readyz),
            **(extra or {}),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
                else:
                    try:
                        status, ctype, body = route()
                    except Exception as exc:  # a failing check is a 500, never a dead server
                        status, ctype, body = 500, "text/plain; charset=utf-8", f"{exc}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        self._server = http_server(bind_address, port, Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()  # blocks until serve_forever returns, so only when it runs
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()


def http_server(bind_address: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threading HTTP server on ``bind_address``: an IPv4 address, an IPv6 one (bracketed or not), a host name, or
    empty -- every interface, IPv6 and IPv4 where the host has IPv6 (as Go's ``:8080``), else every IPv4 one."""
    host = bind_address.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal as written in a URL
    if not host:
        # 0.0.0.0 takes no IPv6 connection: on an IPv6-only cluster the kubelet's probes and Prometheus' scrapes of
        # the pod's address failed. "::" takes both where the kernel has IPv6; where IPv6 is disabled it fails.
        try:
            return _Ipv6HttpServer(("::", port), handler)
        except OSError as exc:
            if exc.errno not in _NO_IPV6:
                raise  # the port is taken, or not ours to bind: the same answer on IPv4
        return ThreadingHTTPServer(("0.0.0.0", port), handler)
    server_class = _Ipv6HttpServer if ":" in host else ThreadingHTTPServer
    return server_class((host, port), handler)


# what binding "::" raises where the kernel has no IPv6 (disabled, or built without it)
_NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT})


class _Ipv6HttpServer(ThreadingHTTPServer):
    """An IPv6 bind address ("::", "::1"): the stdlib server is IPv4-only and failed on one at start-up ("Address
    family for hostname not supported"). "::" also takes IPv4, as the settings' clash check assumes."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _check(check: HealthCheck) -> tuple[int, str, bytes]:
    ok, message = check()
    return (200 if ok else 503), "text/plain; charset=utf-8", f"{'ok' if ok else 'fail'}: {message}\n".encode()
