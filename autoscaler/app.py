"""Wiring: settings -> adapters -> the controller -> the runtime (apscheduler jobs, leader election, HTTP
``/metrics``, ``/healthz``, ``/readyz``).

The jobs live in their own modules: ``autoscaler.controller`` (the tick: read, decide, act), ``autoscaler.reporting``
(the tick's status, Events and gauges), ``autoscaler.actuator`` (applying a plan), ``autoscaler.forecasting`` (the
refit job) and ``autoscaler.runtime`` (scheduler, leadership, HTTP, signals, logging). This module builds them from
settings: ``build_adapters`` (Kubernetes and Prometheus) and ``build_runtime``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autoscaler.controller import Controller
from autoscaler.ports import (
    ClusterReader,
    ClusterWriter,
    MetricsSource,
    MoveLedger,
    NodePoolScaler,
    PolicyObject,
    PolicySource,
    PolicyStatusWriter,
)
from autoscaler.runtime import LeaderPodLabel, Runtime, noop_job
from autoscaler.telemetry import Telemetry

if TYPE_CHECKING:
    from autoscaler.extender_http import ExtenderServer, LatestSnapshot
    from autoscaler.settings import Settings

log = logging.getLogger("autoscaler")


@dataclass(slots=True)
class Adapters:
    metrics: MetricsSource
    cluster: ClusterReader
    writer: ClusterWriter
    policies: PolicySource
    status_writer: PolicyStatusWriter | None
    node_pools: NodePoolScaler | None
    api_client: Any = None


class KubePolicySource:
    """The GPUScalingPolicy objects through the Kubernetes adapter's ``PolicyLoader`` (validated, contested
    Deployments resolved oldest-first), in the controller's ``PolicyObject`` shape."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def list_policies(self) -> Sequence[PolicyObject]:
        loaded = self._loader.load()
        out = [
            PolicyObject(
                p.namespace,
                p.name,
                p.service,
                None,
                p.generation,
                _queries_or_none(p.spec.queries),
                adopt_hpa=p.spec.adopt_hpa,
                uid=p.uid or None,
            )
            for p in loaded.valid
        ]
        out += [
            PolicyObject(b.namespace, b.name, None, b.text, b.generation, uid=b.uid or None) for b in loaded.invalid
        ]
        return out


def _queries_or_none(queries: Any) -> Any:
    """Only policies that override a query are handed to the metrics source."""
    if queries is None:
        return None
    fields = queries.model_dump(exclude_none=True) if hasattr(queries, "model_dump") else queries
    return queries if fields else None


def _kubernetes_adapters(settings: Settings, api_client: Any, metrics: MetricsSource) -> Adapters:
    from autoscaler.adapters.kubernetes import (
        KubeClusterReader,
        KubeClusterWriter,
        PolicyLoader,
        ReaderConfig,
        WriterConfig,
        make_node_pool_scaler,
    )

    timeout = settings.kubernetes.request_timeout_seconds
    writer = KubeClusterWriter(
        api_client,
        WriterConfig(request_timeout_s=timeout, reporting_instance=settings.leader_election.identity),
    )
    node_pools = None
    if settings.node_pools.provider != "none":
        node_pools = make_node_pool_scaler(
            settings.node_pools.provider,
            api_client,
            settings.node_pools.namespace,
            settings.node_pools.pools or None,
            request_timeout_s=timeout,
        )
    return Adapters(
        metrics=metrics,
        # A booting burst node is a GPU node before its device plugin reports GPUs (and before GPU feature discovery
        # labels it): left out of the snapshot, it read as a node the provider counts that never registered.
        cluster=KubeClusterReader(
            api_client,
            ReaderConfig(request_timeout_s=timeout, gpu_pools=frozenset(settings.capacity.burst_pools)),
        ),
        writer=writer,
        policies=KubePolicySource(PolicyLoader(api_client, settings.namespaces, request_timeout_s=timeout)),
        status_writer=writer,
        node_pools=node_pools,
        api_client=api_client,
    )


def build_adapters(settings: Settings, *, check_prometheus: bool = True) -> Adapters:
    """The real adapters: Kubernetes (reader, writer, policies, status) and Prometheus.

    A configuration error (no kubeconfig, a missing token or CA file) raises with a readable message: it will not
    fix itself. An *unreachable* Prometheus only logs a warning: it is an outage, the controller starts anyway and
    holds with stale metrics (visible in /metrics and Events) rather than crash-looping through it. The check runs
    in the background: a Prometheus that does not answer took its timeout x (retries + 1) before /healthz was
    served, which with a longer timeout outlasted the startupProbe (the kubelet restarted the pod through the outage).
    """
    from autoscaler.adapters.kubernetes.config import load_api_client
    from autoscaler.adapters.prometheus import connect

    api_client = load_api_client(
        settings.kubernetes.config_mode, settings.kubernetes.kubeconfig, settings.kubernetes.context
    )
    metrics = connect(settings.prometheus, check=False)
    if check_prometheus:
        threading.Thread(target=_check_prometheus, args=(metrics,), name="prometheus-check", daemon=True).start()
    return _kubernetes_adapters(settings, api_client, metrics)


def _check_prometheus(metrics: Any) -> None:
    try:
        info = metrics.check()
        log.info("Prometheus at %s answers (version %s)", info.url, info.version or "unknown")
    except Exception as exc:
        log.warning("Prometheus check failed, starting anyway (services hold until it answers): %s", exc)


def _discard_result(job: Callable[[float], object]) -> Callable[[float], None]:
    def run(now: float) -> None:
        job(now)

    return run


def _scheduler_extender(
    settings: Settings, cluster: ClusterReader, telemetry: Telemetry
) -> tuple[ExtenderServer | None, LatestSnapshot | None]:
    """The kube-scheduler extender on its own port, answering from the snapshots the tick reads (through the
    returned reader); (None, None) when it is off."""
    config = settings.scheduler_extender
    if not config.enabled:
        return None, None
    from autoscaler.core.extender import ExtenderConfig, fgd_scores, once_per_node_state
    from autoscaler.core.placement_score import score_nodes
    from autoscaler.extender_http import Extender, ExtenderServer, LatestSnapshot

    snapshots = LatestSnapshot(cluster)
    scorer = fgd_scores if config.scorer == "fgd" else once_per_node_state(score_nodes)
    extender = Extender(
        snapshots.latest,
        ExtenderConfig(config.max_snapshot_age_seconds),
        telemetry=telemetry,
        scorer=scorer,
        snapshot_age=snapshots.age_s,
    )
    return ExtenderServer(extender, config.bind_address, config.port), snapshots


def _move_ledger(settings: Settings, adapters: Adapters, for_plan: bool = False) -> MoveLedger | None:
    """The rebalancer's ConfigMap ledger beside the Lease, when the rebalancer is on, not a dry run (``for_plan``: a
    dry run too, which only reads it: ``autoscaler plan`` shows the moves the acting controller's budget allows), and
    there is a Kubernetes API (adapters built for tests without one keep the count in memory)."""
    name = settings.rebalance.ledger_configmap
    if not settings.rebalance.enabled or (settings.dry_run and not for_plan) or not name or adapters.api_client is None:
        return None
    from autoscaler.adapters.kubernetes.ledger import KubernetesMoveLedger

    return KubernetesMoveLedger(
        adapters.api_client,
        settings.leader_election.lease_namespace,
        name,
        request_timeout_s=settings.kubernetes.request_timeout_seconds,
    )


# The Kubernetes requests of one rebalance pass besides its cluster read (``Controller._rebalance``), for
# ``rebalance_stall_seconds``: the move ledger's read, the write that reserves the pass's moves and the write that
# gives back the refused ones; and per pod moved, a gang's dry-run eviction (``Actuator._apply_gang``), the eviction,
# its Event on the pod (the pod's uid read, the create) and at most one Event on the moved gang's Deployment (its uid
# read, the create).
PASS_LEDGER_REQUESTS = 3
PASS_REQUESTS_PER_MOVE = 6


# Tries of the tick's first read, the GPUScalingPolicy list (``PolicyLoader``'s default: 1 + 2 retries), each up to
# twice the request timeout (the API client's connect retry), with backoff sleeps of at most 2 s between them.
POLICY_READ_TRIES = 3
POLICY_READ_MAX_BACKOFF_S = 2.0


def tick_stall_seconds(settings: Settings) -> float:
    """How long a tick may run before /healthz calls the loop hung: ``tick_stall_seconds``, or longer when a tick
    held on an unanswering Kubernetes API takes longer -- its policy read through all its tries, plus a tick
    interval. The settings check the Prometheus worst case only; with a long ``kubernetes.request_timeout_seconds``
    (60 s: 3 x 120 s) the configured bound failed /healthz during an API outage, and the livenessProbe restarted
    the controller through it. With the defaults (10 s, 15 s ticks): 3 x 20 + 2 x 2 + 15 = 79 s, the 120 s stand."""
    per_try = 2 * settings.kubernetes.request_timeout_seconds
    held = (
        POLICY_READ_TRIES * per_try
        + (POLICY_READ_TRIES - 1) * POLICY_READ_MAX_BACKOFF_S
        + settings.tick_interval_seconds
    )
    return max(settings.tick_stall_seconds, held)


def read_retry_window_seconds(settings: Settings) -> float:
    """How long into a tick its Kubernetes reads may still start a retry (``read_retry_deadline``): the tick's
    stall bound less what may follow the last retry -- that try itself (twice the request timeout: the client's
    connect retry), one Prometheus query through all its tries, and a tick interval for the decision and the
    writes. Each read retries a bounded number of times, but a tick makes many (the policy list, then every list
    of the snapshot), and all of them answering on their last try outlasted the bound: /healthz failed and the
    livenessProbe restarted the controller through an API server that was only flaky. With the defaults (120 s,
    10 s requests, Prometheus 10 s x (1 + 2 x 2), 15 s ticks): 120 - 20 - 50 - 15 = 35 s; past it a failed read
    fails the tick's read at once and the tick holds, as on any failed read."""
    prometheus = settings.prometheus
    after = (
        2 * settings.kubernetes.request_timeout_seconds
        + prometheus.timeout_seconds * (1 + 2 * prometheus.retries)
        + settings.tick_interval_seconds
    )
    return max(0.0, tick_stall_seconds(settings) - after)


def rebalance_stall_seconds(settings: Settings) -> float:
    """How long one rebalance pass may run before /healthz calls it hung.

    tick_stall_seconds + (3 + 6 x rebalance.max_moves_per_pass) x 2 x kubernetes.request_timeout_seconds:

    - the pass's cluster read is the snapshot a tick reads (paged lists, each page with its bounded read retries),
      which a tick must fit within tick_stall_seconds with the rest of its work: that bound covers it;
    - every other request of the pass (``PASS_LEDGER_REQUESTS``, ``PASS_REQUESTS_PER_MOVE`` per pod moved) is sent
      once (the writer never retries a write; the ledger and the uid reads are not retried either), and takes up to
      twice the request timeout: the API client retries a connection that failed once, a timed-out connect included
      (``adapters.kubernetes.config._no_auto_retries``), each attempt bounded by the timeout.

    Not counted: an Event that already exists is bumped by a read-modify-write instead (a pod's eviction Event
    names the pod and the move, so a fresh eviction rarely meets one); the tick's share of the bound leaves room.
    With the defaults (120 s, 2 moves, 10 s): 120 + 15 x 20 = 420 s. The tick_stall_seconds alone failed /healthz
    during a pass that was only slow (a tick waits for the pass), and the livenessProbe restarted the controller
    in a loop under a slow API server."""
    requests = PASS_LEDGER_REQUESTS + PASS_REQUESTS_PER_MOVE * settings.rebalance.max_moves_per_pass
    per_request = 2 * settings.kubernetes.request_timeout_seconds
    return tick_stall_seconds(settings) + requests * per_request


def _leader_pod_label(settings: Settings, adapters: Adapters, serving: bool) -> LeaderPodLabel | None:
    """The leader's pod label (``leader_election.label_leader_pod``), on the pod the downward API names; None when
    off, when the process serves nothing (``run --once``: a Service pointed at it would find no server), or without
    a Kubernetes API (adapters built for tests). Refuses to start without POD_NAME: the Service that selects the
    label would otherwise never have an endpoint, and nothing but the scheduler's skipped calls would say so."""
    le = settings.leader_election
    if not le.label_leader_pod or not serving or adapters.api_client is None:
        return None
    pod = os.environ.get("POD_NAME", "").strip()
    if not pod:
        from autoscaler.settings import SettingsError

        raise SettingsError(
            "AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD (leader_election.label_leader_pod) is on, but POD_NAME is "
            "not set: give the container its pod's name (env valueFrom fieldRef metadata.name, as "
            "deploy/base/deployment.yaml does)"
        )
    from autoscaler.adapters.kubernetes.leader_label import KubernetesLeaderPodLabel

    return KubernetesLeaderPodLabel(
        adapters.api_client,
        os.environ.get("POD_NAMESPACE", "").strip() or le.lease_namespace,
        pod,
        lease_name(settings),
        # as the Lease's release: stop() removes the label after it, within the pod's termination grace period
        request_timeout_s=min(settings.kubernetes.request_timeout_seconds, le.renew_deadline_seconds / 2),
    )


def lease_name(settings: Settings) -> str:
    """A dry-run controller elects among dry-run replicas only: on the real Lease it could win, act on nothing,
    and keep the real controller from acting at all."""
    from autoscaler.settings import DRY_RUN_LEASE_SUFFIX  # the lease name's bound leaves room for it

    name = settings.leader_election.lease_name
    return f"{name}{DRY_RUN_LEASE_SUFFIX}" if settings.dry_run else name


def build_runtime(
    settings: Settings,
    adapters: Adapters | None = None,
    refit: Callable[[float], object] | None = None,
    rebalance: Callable[[float], object] | None = None,
    http: bool = True,
) -> Runtime:
    """Everything ``autoscaler run`` needs. ``refit`` defaults to the ``ForecastService``'s refit job, which also
    hands the tick its forecast floors; pass another callable to replace the job (and run without forecasts).
    ``rebalance`` defaults to the controller's rebalance pass when ``rebalance.enabled``, else to nothing."""
    from autoscaler.adapters.kubernetes._api import read_retry_deadline
    from autoscaler.adapters.kubernetes_lease import ElectionTimings, KubernetesLeaseStore, LeaderElector

    adapters = adapters if adapters is not None else build_adapters(settings)
    leader_label = _leader_pod_label(settings, adapters, serving=http)  # first: it may refuse to start
    le = settings.leader_election
    telemetry = Telemetry(identity=le.identity if le.enabled else "")
    if getattr(adapters.node_pools, "on_mark_left", False) is None:
        # a delete-machine mark a scale-down left behind steers the pool's next scale-down: counted, by why
        def count_mark_left(machine: str, why: str) -> None:
            telemetry.delete_marks_left.labels(reason=why).inc()

        adapters.node_pools.on_mark_left = count_mark_left  # type: ignore[union-attr]
    forecasts = None
    if refit is None:
        from autoscaler.forecasting import ForecastService

        forecasts = ForecastService(
            settings.forecast,
            adapters.metrics,
            lambda: controller.policies_seen,
            refit_interval_s=settings.refit_interval_seconds,
            tick_interval_s=settings.tick_interval_seconds,
            telemetry=telemetry,
            update_interval_s=settings.forecast.update_interval_seconds,
        )
        refit = forecasts.refit
    extender, extender_snapshots = _scheduler_extender(settings, adapters.cluster, telemetry) if http else (None, None)
    controller = Controller(
        metrics=adapters.metrics,
        cluster=extender_snapshots if extender_snapshots is not None else adapters.cluster,
        writer=adapters.writer,
        policies=adapters.policies,
        status_writer=adapters.status_writer,
        node_pools=adapters.node_pools,
        telemetry=telemetry,
        dry_run=settings.dry_run,
        forecasts=forecasts,
        capacity=settings.capacity.to_config(),
        rebalance=settings.rebalance.to_config(settings.rebalance_interval_seconds, settings.capacity.burst_pools),
        move_ledger=_move_ledger(settings, adapters),
    )
    if rebalance is None:
        # the controller's pass when rebalance.enabled; else nothing to do
        rebalance = controller.rebalance if controller.rebalance_config is not None else noop_job
    runtime_ref: list[Runtime] = []
    elector = None
    if le.enabled:
        from kubernetes import client

        store = KubernetesLeaseStore(
            client.CoordinationV1Api(adapters.api_client),
            le.lease_namespace,
            lease_name(settings),
            # one hung request must not use up the renew deadline
            request_timeout_s=min(settings.kubernetes.request_timeout_seconds, le.renew_deadline_seconds / 2),
        )
        elector = LeaderElector(
            store,
            le.identity,
            ElectionTimings(
                le.lease_duration_seconds,
                le.renew_deadline_seconds,
                le.retry_period_seconds,
                write_margin_s=settings.kubernetes.request_timeout_seconds,
            ),
            on_started_leading=lambda: runtime_ref[0].on_started_leading(),
            on_stopped_leading=lambda: runtime_ref[0].on_stopped_leading(),
            on_error=lambda exc: telemetry.error("leader_election"),
        )
    retry_window = read_retry_window_seconds(settings)
    runtime = Runtime(
        controller,
        telemetry,
        tick_interval_s=settings.tick_interval_seconds,
        refit_interval_s=settings.refit_interval_seconds,
        rebalance_interval_s=settings.rebalance_interval_seconds,
        tick_stall_s=tick_stall_seconds(settings),
        rebalance_stall_s=rebalance_stall_seconds(settings),
        shutdown_grace_s=settings.shutdown_grace_seconds,
        elector=elector,
        refit=_discard_result(refit),
        rebalance=rebalance,
        forecast_update=_discard_result(forecasts.update) if forecasts is not None else None,
        forecast_update_interval_s=settings.forecast.update_interval_seconds,
        http=(settings.http.bind_address, settings.http.port) if http and settings.http.enabled else None,
        on_stop=forecasts.close if forecasts is not None else None,
        extender=extender,
        extender_snapshots=extender_snapshots,
        leader_label=leader_label,
        tick_scope=lambda: read_retry_deadline(time.monotonic() + retry_window),
    )
    runtime_ref.append(runtime)
    return runtime
