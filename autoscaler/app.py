"""Wiring: settings -> adapters -> the control loop (apscheduler jobs) -> HTTP ``/metrics``, ``/healthz``, ``/readyz``.

``Controller.run_once(now)`` is one tick, RunOnce style: read the policies, the cluster and the metrics, call the pure
``decide()``, then apply the plan through the ports. The rules it keeps, beyond what ``decide()`` already does:

- **A failed read holds.** A PortError (or any exception) from the policy, cluster or metrics read never turns into
  a scale-down, an eviction or a suspension: when the cluster or the policies cannot be read nothing is applied; when
  the metrics cannot be read every service is observed as stale and ``decide()`` holds.
- **A failed write is retried by the next tick**, which re-decides on fresh data (the failed action's scale event is
  taken out of the state so that the rate policies do not count a change that never happened). Nothing propagates
  out of ``run_once``: the loop survives every error, counts it and logs it.
- **Only the leader acts**, and it asks before every single write, so a Lease lost in the middle of a tick stops the
  rest of that tick's writes.
- **Dry-run writes nothing but Events** (marked ``[dry-run]``); the plan is still logged and counted.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from autoscaler.adapters.kubernetes.status import (
    AT_MAX_REPLICAS,
    INVALID_SPEC,
    METRICS_STALE,
    READY,
    ConditionUpdate,
    ForecastRecord,
    LastAction,
    StatusUpdate,
)
from autoscaler.core.cluster import ClusterSnapshot, HpaInfo, hpas_targeting
from autoscaler.core.model import (
    Action,
    ControllerState,
    EvictPod,
    Mode,
    Observation,
    Plan,
    ScaleDecision,
    ScaleDeployment,
    ScaleNodePool,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.ports import ClusterReader, ClusterWriter, EvictionOutcome, MetricsSource, NodePoolScaler
from autoscaler.telemetry import HttpServer, ServiceGauges, Telemetry

if TYPE_CHECKING:
    from autoscaler.adapters.kubernetes_lease import LeaderElector
    from autoscaler.core.decide import ReplicaFloor
    from autoscaler.forecasting import ForecastReadout, ServiceForecastView
    from autoscaler.settings import Settings

log = logging.getLogger("autoscaler")

POLICY_KIND = "GPUScalingPolicy"
DRY_RUN_MARK = "[dry-run] "

# Stale reasons the controller itself adds (the metrics adapter adds its own, e.g. "empty result").
STALE_METRICS_UNAVAILABLE = "metrics_unavailable"
STALE_DEPLOYMENT_MISSING = "deployment_not_found"


# ---- The policy port --------------------------------------------------------------------------------------------
# ``autoscaler.ports`` has no port for the GPUScalingPolicy objects yet; this is the shape the controller needs.
# The Kubernetes adapter's reader/writer are adapted to it in ``build_runtime``.


@dataclass(frozen=True, slots=True)
class PolicyObject:
    """One GPUScalingPolicy object: its parsed policy, or the validation error that names the bad field."""

    namespace: str
    name: str  # the object's own name (events and status go here)
    policy: ServicePolicy | None
    error: str | None = None
    generation: int | None = None
    queries: Any = None  # spec.queries (PromQL overrides for the metrics source), when set
    adopt_hpa: str | None = None  # spec.adoptHpa: the HPA this policy takes the Deployment over from


class PolicySource(Protocol):
    def list_policies(self) -> Sequence[PolicyObject]:
        """Every GPUScalingPolicy in the watched namespaces. Raises PortError when the API cannot be read."""
        ...


class PolicyStatusWriter(Protocol):
    def update_policy_status(self, namespace: str, name: str, update: StatusUpdate, *, now: float) -> object:
        """Merge ``update`` into the object's status subresource (``merge_status``: conditions keep their
        transition time, observedGeneration follows the object); idempotent. Raises PortError when it cannot."""
        ...


class ForecastReader(Protocol):
    def readout(
        self, now: float, policies: Mapping[str, ServicePolicy], snapshot: ClusterSnapshot, observation: Observation
    ) -> ForecastReadout:
        """The forecast floor of every forecasting service from the latest published fits (reads, never fits)."""
        ...


DecideFn = Callable[..., tuple[Plan, ControllerState]]


def _default_decide() -> DecideFn:
    from autoscaler.core.decide import decide

    return decide


# ---- One tick's report --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ActionResult:
    action: Action
    result: str  # applied | failed | blocked | held | not_leader | dry_run
    message: str = ""


@dataclass(slots=True)
class TickReport:
    """What one tick saw, decided and did; ``autoscaler plan`` prints it, tests read it."""

    time: float
    plan: Plan
    result: str = "ok"  # ok | hold | error | standby
    held_because: str | None = None
    results: list[ActionResult] = field(default_factory=list)
    stale: dict[str, tuple[str, ...]] = field(default_factory=dict)  # service key -> reasons
    partial: dict[str, tuple[str, ...]] = field(default_factory=dict)  # service key -> why no scale-down
    # service key -> the HPAs that also scale its Deployment (the service is then recommend-only this tick)
    hpas: dict[str, tuple[HpaInfo, ...]] = field(default_factory=dict)
    invalid_policies: list[PolicyObject] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    floors: Mapping[str, ReplicaFloor] = field(default_factory=dict)  # service key -> forecast floor handed to decide
    forecasts: Mapping[str, ServiceForecastView] = field(default_factory=dict)  # what the tick made of each forecast


def event_reason(reason: Reason | str) -> str:
    """Event reasons are CamelCase by Kubernetes convention: ``metric_above_target`` -> ``MetricAboveTarget``."""
    value = reason.value if isinstance(reason, Reason) else reason
    return "".join(part.capitalize() for part in value.split("_"))


def action_kind(action: Action) -> str:
    return type(action).__name__


def action_target(action: Action) -> str:
    if isinstance(action, ScaleNodePool):
        return f"nodepool/{action.pool}"
    if isinstance(action, SuspendWorkload):
        return f"{action.kind.lower()}/{action.namespace}/{action.name}"
    if isinstance(action, EvictPod):
        return f"pod/{action.namespace}/{action.name}"
    return f"deployment/{action.namespace}/{action.name}"


def describe_action(action: Action) -> str:
    if isinstance(action, ScaleDeployment):
        return f"scale {action_target(action)} from {action.previous_replicas} to {action.replicas}"
    if isinstance(action, ScaleNodePool):
        return f"scale {action_target(action)} from {action.previous_nodes} to {action.nodes} nodes"
    if isinstance(action, EvictPod):
        gang = f" (gang {action.gang})" if action.gang else ""
        return f"evict {action_target(action)}{gang}"
    return f"suspend {action_target(action)}"


def _is_destructive(action: Action) -> bool:
    """Actions that take capacity away; none of them may follow from data we could not read."""
    if isinstance(action, ScaleDeployment):
        return action.replicas < action.previous_replicas
    if isinstance(action, ScaleNodePool):
        return action.nodes < action.previous_nodes
    return True  # evictions and suspensions


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- The controller -----------------------------------------------------------------------------------------------


class Controller:
    """One tick at a time: observe, decide, act. Thread-compatible (the scheduler runs one tick at a time)."""

    def __init__(
        self,
        *,
        metrics: MetricsSource,
        cluster: ClusterReader,
        writer: ClusterWriter,
        policies: PolicySource,
        status_writer: PolicyStatusWriter | None = None,
        node_pools: NodePoolScaler | None = None,
        telemetry: Telemetry | None = None,
        dry_run: bool = False,
        can_act: Callable[[], bool] = lambda: True,
        decide_fn: DecideFn | None = None,
        forecasts: ForecastReader | None = None,
    ) -> None:
        self.metrics = metrics
        self.cluster = cluster
        self.writer = writer
        self.policies = policies
        self.status_writer = status_writer
        self.node_pools = node_pools
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.dry_run = dry_run
        self.can_act = can_act
        self._decide = decide_fn if decide_fn is not None else _default_decide()
        self.forecasts = forecasts
        self.policies_seen: tuple[ServicePolicy, ...] = ()  # valid policies of the latest tick (the refit fits these)
        self._queries: dict[str, Any] = {}
        self._observe_takes_cluster = _accepts_keyword(metrics.observe, "cluster")
        self.state = ControllerState()
        self.acting_since: float | None = None  # when this process started acting (took the lease)
        self.last_report: TickReport | None = None
        self._written_status: dict[tuple[str, str], tuple[int | None, StatusUpdate]] = {}
        self._written_forecast: dict[tuple[str, str], tuple[Any, ...]] = {}  # lastForecast, to not rewrite each tick
        self._policy_owners: dict[str, tuple[str, str]] = {}  # service key -> (namespace, name) of its policy
        self._reported: dict[tuple[str, str], str] = {}  # (object, topic) -> last event key, to not repeat events
        self._lock = threading.Lock()
        self._pending_reset: tuple[str, float | None] | None = None
        self.telemetry.dry_run.set(1 if dry_run else 0)

    # -- leadership hooks (called by the elector) --

    def start_acting(self, now: float) -> None:
        """A fresh leader knows no history: forget any state and start the takeover grace now.

        Called from the election thread, so it must not wait for a running tick (that tick may be asking the
        elector whether it still leads): the reset is recorded here and applied when the next tick starts.
        """
        self._pending_reset = ("start", now)

    def stop_acting(self) -> None:
        self._pending_reset = ("stop", None)

    def _apply_pending_reset(self) -> None:
        pending, self._pending_reset = self._pending_reset, None
        if pending is None:
            return
        self.state = ControllerState()
        self._written_status.clear()
        self._written_forecast.clear()
        self._reported.clear()
        self.acting_since = pending[1]

    # -- the tick --

    def run_once(self, now: float) -> Plan:
        """One tick at ``now`` (Unix seconds). Never raises; the report is in ``last_report``."""
        started = time.perf_counter()
        with self._lock:
            self._apply_pending_reset()
            if self.acting_since is None:
                self.acting_since = now
            try:
                report = self._tick(now)
            except Exception as exc:  # a bug in here must not kill the scheduler thread
                log.exception("tick failed")
                self.telemetry.error("decide")
                report = TickReport(now, Plan(now), result="error", errors=[f"{type(exc).__name__}: {exc}"])
            self.last_report = report
        self.telemetry.ticks.labels(result=report.result).inc()
        self.telemetry.tick_duration.observe(time.perf_counter() - started)
        if report.result == "ok":
            self.telemetry.last_success.set(now)
        return report.plan

    def _hold(self, report: TickReport, component: str, exc: Exception) -> TickReport:
        report.result = "hold"
        report.held_because = f"{component}: {type(exc).__name__}: {exc}"
        report.errors.append(report.held_because)
        self.telemetry.error(component)
        log.warning("hold: %s (nothing applied this tick)", report.held_because)
        return report

    def _tick(self, now: float) -> TickReport:
        report = TickReport(now, Plan(now))

        # 1. policies
        try:
            objects = list(self.policies.list_policies())
        except Exception as exc:
            return self._hold(report, "policy_read", exc)
        policies, invalid = self._valid_policies(objects)
        report.invalid_policies = invalid
        self.telemetry.invalid_policies.set(len(invalid))

        # 2. cluster
        try:
            snapshot = self.cluster.snapshot(now)
        except Exception as exc:
            return self._hold(report, "cluster_read", exc)

        # 2b. never two writers of one scale subresource: a Deployment an HPA scales is only recommended for
        policies = self._yield_to_hpas(objects, policies, snapshot, report)

        # 3. metrics; an outage makes every service stale, which decide() turns into a hold
        metrics_error: str | None = None
        invalid += self._configure_queries(objects, policies)
        report.invalid_policies = invalid
        self.telemetry.invalid_policies.set(len(invalid))
        self.policies_seen = tuple(policies.values())
        services = list(policies.values())
        try:
            if self._observe_takes_cluster:
                # The Prometheus adapter maps pods to Deployments and counts unready pods from the snapshot.
                observation = self.metrics.observe(services, now, cluster=snapshot)  # type: ignore[call-arg]
            else:
                observation = self.metrics.observe(services, now)
        except Exception as exc:
            self.telemetry.error("metrics_read")
            metrics_error = f"{type(exc).__name__}: {exc}"
            log.warning("metrics read failed, holding every service: %s", metrics_error)
            report.errors.append(f"metrics_read: {metrics_error}")
            observation = Observation(now, {})
        observation = self._merge(observation, snapshot, policies, metrics_error, now)
        report.stale = {k: o.stale_reasons for k, o in observation.services.items() if o.stale_reasons}
        report.partial = {k: o.partial_reasons for k, o in observation.services.items() if o.partial_reasons}
        for key in policies:
            if key not in observation.services:
                report.stale[key] = (STALE_DEPLOYMENT_MISSING,)

        # 4. forecast floors: read the latest published fits (the refit job fits; the tick never does)
        readout = self._read_forecasts(now, policies, snapshot, observation, report)

        # 5. decide (pure)
        previous_state = self.state
        if readout is not None:
            plan, state = self._decide(observation, previous_state, policies, now, floors=readout.floors)
        else:
            plan, state = self._decide(observation, previous_state, policies, now)
        report.plan = plan

        for decision in plan.decisions:
            self.telemetry.decisions.labels(reason=decision.reason.value).inc()
            self._log_decision(decision)

        # 6. act
        unapplied: set[str] = set()
        for action in plan.actions:
            outcome = self._apply(action, policies, report, metrics_error, now)
            report.results.append(outcome)
            self.telemetry.actions.labels(
                kind=action_kind(action),
                reason=action.reason.value,
                dry_run=str(self.dry_run).lower(),
                result=outcome.result,
            ).inc()
            if outcome.result != "applied" and isinstance(action, ScaleDeployment):
                unapplied.add(f"{action.namespace}/{action.name}")
        self.state = self._forget_unapplied(state, previous_state, unapplied, now)

        # 7. report
        self._report_services(plan, policies, report)
        self.telemetry.forecasts.update(readout.gauges(now) if readout is not None else ())
        self._report_stale(objects, policies, report)
        if not self.dry_run and self.can_act():
            self._write_statuses(objects, policies, plan, report, now)
        if metrics_error is not None:
            report.result = "hold"
            report.held_because = f"metrics_read: {metrics_error}"
        return report

    # -- reading --

    def _read_forecasts(
        self,
        now: float,
        policies: Mapping[str, ServicePolicy],
        snapshot: ClusterSnapshot,
        observation: Observation,
        report: TickReport,
    ) -> ForecastReadout | None:
        """The forecast floors, or None: without forecasts every service scales reactively, which is always safe."""
        if self.forecasts is None:
            return None
        try:
            readout = self.forecasts.readout(now, policies, snapshot, observation)
        except Exception as exc:
            log.exception("reading the forecasts failed; reactive scaling only this tick")
            self.telemetry.error("decide")
            report.errors.append(f"forecast_read: {type(exc).__name__}: {exc}")
            return None
        report.floors = readout.floors
        report.forecasts = readout.views
        return readout

    def _configure_queries(
        self, objects: Sequence[PolicyObject], policies: dict[str, ServicePolicy]
    ) -> list[PolicyObject]:
        """Hand the policies' PromQL overrides (spec.queries) to a metrics source that takes them; a policy whose
        override is rejected becomes invalid (the error names spec.queries.<field>) and the others keep working."""
        setter = getattr(self.metrics, "set_service_queries", None)
        if setter is None:
            return []
        wanted = {o.policy.key: o.queries for o in objects if o.policy is not None and o.policy.key in policies}
        wanted = {k: q for k, q in wanted.items() if q is not None}
        if wanted == self._queries:
            return []
        rejected: list[PolicyObject] = []
        for _ in range(len(wanted) + 1):
            try:
                setter(wanted)
                self._queries = dict(wanted)
                break
            except ValueError as exc:
                # The adapter names the service first: "<namespace>/<name>: spec.queries.<field>: <why>".
                key, _, why = str(exc).partition(": ")
                if key not in wanted:
                    log.error("metrics source rejected the query overrides: %s", exc)
                    break
                del wanted[key]
                obj = next(o for o in objects if o.policy is not None and o.policy.key == key)
                rejected.append(replace(obj, policy=None, error=why))
                del policies[key]
        return rejected

    def _valid_policies(self, objects: Sequence[PolicyObject]) -> tuple[dict[str, ServicePolicy], list[PolicyObject]]:
        """Valid policies by service key. Two objects targeting one Deployment would fight: the one that owned it at
        the previous tick keeps it, else the first listed (the Kubernetes source lists established owners first);
        the others are reported invalid. Never by name: a newcomer must not take a Deployment over."""
        valid: dict[str, ServicePolicy] = {}
        owner: dict[str, PolicyObject] = {}
        invalid: list[PolicyObject] = []
        previous = self._policy_owners
        ordered = sorted(
            objects,
            key=lambda o: o.policy is None or previous.get(o.policy.key) != (o.namespace, o.name),
        )
        for obj in ordered:
            if obj.policy is None:
                invalid.append(obj)
                continue
            key = obj.policy.key
            if key in valid:
                first = owner[key]
                error = f"spec.targetRef.name: Deployment {obj.policy.name} is already scaled by {first.name}"
                invalid.append(replace(obj, policy=None, error=error))
                continue
            valid[key] = obj.policy
            owner[key] = obj
        self._policy_owners = {key: (obj.namespace, obj.name) for key, obj in owner.items()}
        return valid, invalid

    def _yield_to_hpas(
        self,
        objects: Sequence[PolicyObject],
        policies: dict[str, ServicePolicy],
        snapshot: ClusterSnapshot,
        report: TickReport,
    ) -> dict[str, ServicePolicy]:
        """Services whose Deployment an HPA also scales become recommend-only for this tick, with one Event per
        episode on the policy: ``WaitingForHpaRemoval`` (Normal) when the policy adopts that HPA
        (``spec.adoptHpa``), ``HpaConflict`` (Warning) otherwise. The HPA is never modified: deleting it is the
        user's hand-over, after comparing both recommendations in ``autoscaler plan``."""
        by_key = {o.policy.key: o for o in objects if o.policy is not None}
        out = dict(policies)
        for key, policy in policies.items():
            found = hpas_targeting(snapshot, policy.namespace, policy.name)
            obj = by_key.get(key)
            if obj is None:
                continue
            memo = (f"{POLICY_KIND}/{obj.namespace}/{obj.name}", "hpa")
            if not found:
                self._reported.pop(memo, None)
                continue
            report.hpas[key] = found
            out[key] = replace(policy, mode=Mode.RECOMMEND_ONLY)
            names = ", ".join(h.name for h in found)
            mark = DRY_RUN_MARK if self.dry_run else ""
            where = (POLICY_KIND, obj.namespace, obj.name)
            if obj.adopt_hpa is not None and [h.name for h in found] == [obj.adopt_hpa]:
                message = (
                    f"{mark}recommend-only while HorizontalPodAutoscaler {names} scales deployment {key}; "
                    f"compare both with autoscaler plan, then delete the HPA to hand the Deployment over "
                    f"(kubectl delete hpa {names} -n {policy.namespace})"
                )
                self._event(where, "WaitingForHpaRemoval", message, "Normal", topic="hpa")
            else:
                message = (
                    f"{mark}not scaling deployment {key}: HorizontalPodAutoscaler {names} also scales it; delete "
                    f"the HPA, or set spec.adoptHpa to hand the Deployment over from it"
                )
                self._event(where, "HpaConflict", message, "Warning", topic="hpa")
        return out

    def _merge(
        self,
        observation: Observation,
        snapshot: ClusterSnapshot,
        policies: Mapping[str, ServicePolicy],
        metrics_error: str | None,
        now: float,
    ) -> Observation:
        """The cluster is the authority on replicas; the metrics source on signals.

        A service whose Deployment does not exist is left out (``decide()`` then holds with "no observation").
        """
        deployments = {f"{d.namespace}/{d.name}": d for d in snapshot.deployments}
        merged: dict[str, ServiceObservation] = {}
        for key in policies:
            deployment = deployments.get(key)
            if deployment is None:
                continue
            seen = observation.services.get(key)
            if seen is None:
                reason = (
                    f"{STALE_METRICS_UNAVAILABLE}: {metrics_error}" if metrics_error else "no metrics for this service"
                )
                seen = ServiceObservation(
                    key, deployment.spec_replicas, deployment.ready_replicas, stale_reasons=(reason,)
                )
            elif metrics_error is not None:
                # Whatever came back from a failed read is not trusted.
                seen = replace(seen, stale_reasons=(*seen.stale_reasons, STALE_METRICS_UNAVAILABLE))
            merged[key] = replace(
                seen, spec_replicas=deployment.spec_replicas, ready_replicas=deployment.ready_replicas
            )
        return Observation(now, merged, observation.gpus)

    # -- acting --

    def _guard(
        self,
        action: Action,
        policies: Mapping[str, ServicePolicy],
        report: TickReport,
        metrics_error: str | None,
        now: float,
    ) -> str | None:
        """Why a planned action must not be applied, or None. Defence in depth: decide() already holds on stale
        data; this makes the rule independent of any future bug in it."""
        if not _is_destructive(action):
            return None
        if metrics_error is not None:
            return f"metrics unreadable this tick ({metrics_error})"
        if isinstance(action, ScaleDeployment):
            key = f"{action.namespace}/{action.name}"
            if report.stale.get(key):
                return f"metrics stale: {'; '.join(report.stale[key])}"
            policy = policies.get(key)
            # A new leader has no stabilisation history: the old leader's window may have been holding a scale-down
            # back. Wait one window after taking over, as if every recent recommendation had been "keep".
            if policy is not None and self.acting_since is not None:
                window = policy.scale_down.stabilisation_s
                if now - self.acting_since < window:
                    return f"takeover grace: acting for {now - self.acting_since:.0f}s < scale-down window {window:g}s"
        elif report.stale:
            return f"metrics stale for {len(report.stale)} service(s)"
        return None

    def _apply(
        self,
        action: Action,
        policies: Mapping[str, ServicePolicy],
        report: TickReport,
        metrics_error: str | None,
        now: float,
    ) -> ActionResult:
        text = f"{describe_action(action)}: {action.reason.text} ({action.detail})"
        blocked = self._guard(action, policies, report, metrics_error, now)
        if blocked is not None:
            log.warning("held back: %s; because %s", describe_action(action), blocked)
            return ActionResult(action, "held", blocked)
        if self.dry_run:
            log.info("%s%s", DRY_RUN_MARK, text)
            self._event_for(action, f"{DRY_RUN_MARK}would {text}", dedupe=True)
            return ActionResult(action, "dry_run", text)
        if not self.can_act():
            log.warning("not the leader any more: not applying %s", describe_action(action))
            return ActionResult(action, "not_leader", "lost the lease during the tick")
        try:
            result = self._write(action)
        except Exception as exc:
            component = "node_pool" if isinstance(action, ScaleNodePool) else "cluster_write"
            self.telemetry.error(component)
            message = f"{type(exc).__name__}: {exc}"
            log.error("write failed (retried next tick): %s: %s", describe_action(action), message)
            report.errors.append(f"{component}: {describe_action(action)}: {message}")
            return ActionResult(action, "failed", message)
        log.info("%s: %s", result, text)
        if result == "applied":
            self._event_for(action, text[0].upper() + text[1:], dedupe=False)
        return ActionResult(action, result, text)

    def _write(self, action: Action) -> str:
        if isinstance(action, ScaleDeployment):
            self.writer.scale_deployment(action.namespace, action.name, action.replicas)
            return "applied"
        if isinstance(action, EvictPod):
            outcome = self.writer.evict_pod(action.namespace, action.name)
            # 429 from a PodDisruptionBudget means "not now": the next tick re-plans.
            return "blocked" if outcome is EvictionOutcome.BLOCKED else "applied"
        if isinstance(action, SuspendWorkload):
            self.writer.suspend_workload(action.kind, action.namespace, action.name)
            return "applied"
        if self.node_pools is None:
            raise RuntimeError("no node-pool scaler is configured")
        self.node_pools.scale(action.pool, action.nodes)
        return "applied"

    def _event_for(self, action: Action, message: str, dedupe: bool) -> None:
        if isinstance(action, ScaleDeployment):
            obj = ("Deployment", action.namespace, action.name)
        elif isinstance(action, EvictPod):
            obj = ("Pod", action.namespace, action.name)
        elif isinstance(action, SuspendWorkload):
            obj = (action.kind, action.namespace, action.name)
        else:
            return  # node pools are cluster-scoped provider objects: log and metric only
        self._event(obj, event_reason(action.reason), message, "Normal", topic="action" if dedupe else None)

    def _event(self, obj: tuple[str, str, str], reason: str, message: str, event_type: str, topic: str | None) -> None:
        """Emit an Event; with a ``topic``, only when it differs from the last one of that topic on that object
        (dry-run and recommend-only plans repeat every tick and would flood the API)."""
        if topic is not None:
            memo = (f"{obj[0]}/{obj[1]}/{obj[2]}", topic)
            if self._reported.get(memo) == f"{reason}|{message}":
                return
            self._reported[memo] = f"{reason}|{message}"
        try:
            self.writer.emit_event(obj[0], obj[1], obj[2], reason, message, event_type)
        except Exception as exc:
            self.telemetry.error("event_write")
            log.warning("event not written (%s %s/%s %s): %s", obj[0], obj[1], obj[2], reason, exc)
            if topic is not None:
                self._reported.pop((f"{obj[0]}/{obj[1]}/{obj[2]}", topic), None)  # try again next tick

    @staticmethod
    def _forget_unapplied(
        state: ControllerState, previous: ControllerState, unapplied: set[str], now: float
    ) -> ControllerState:
        """Take the scale events of actions that were not applied back out of the state: the rate policies must
        count only changes that happened (a failed write is retried next tick at full allowance). decide() records
        this tick's change as an event stamped ``now``."""
        if not unapplied:
            return state
        services = dict(state.services)
        for key in unapplied:
            if key in services:
                before = set(previous.services.get(key, ServiceState()).scale_events)
                kept = tuple(e for e in services[key].scale_events if e[0] != now or e in before)
                services[key] = replace(services[key], scale_events=kept)
        return ControllerState(services)

    # -- reporting --

    def _log_decision(self, decision: ScaleDecision) -> None:
        mode = " (recommend-only)" if decision.recommend_only else ""
        level = logging.INFO if decision.changes or decision.reason is Reason.METRICS_STALE else logging.DEBUG
        log.log(
            level,
            "decision %s%s: %d -> %d, %s: %s (%s)",
            decision.key,
            mode,
            decision.current_replicas,
            decision.desired_replicas,
            decision.reason.value,
            decision.reason.text,
            decision.detail,
        )

    def _report_services(self, plan: Plan, policies: Mapping[str, ServicePolicy], report: TickReport) -> None:
        by_key = {d.key: d for d in plan.decisions}
        gauges = []
        for key, policy in policies.items():
            decision = by_key.get(key)
            # Without a Deployment the decision's 0 -> 0 is not a replica count; export nothing rather than a zero.
            known = decision is not None and STALE_DEPLOYMENT_MISSING not in report.stale.get(key, ())
            gauges.append(
                ServiceGauges(
                    namespace=policy.namespace,
                    service=policy.name,
                    current_replicas=decision.current_replicas if known and decision else None,
                    desired_replicas=decision.desired_replicas if known and decision else None,
                    stale_reasons=tuple(dict.fromkeys(stale_category(r) for r in report.stale.get(key, ()))),
                )
            )
        self.telemetry.services.update(gauges)

    def _report_stale(
        self, objects: Sequence[PolicyObject], policies: Mapping[str, ServicePolicy], report: TickReport
    ) -> None:
        """A Warning Event on the policy when its service turns stale (once per episode), and one per invalid
        object naming the bad field ("say so in a metric and an event")."""
        for obj in objects:
            where = (POLICY_KIND, obj.namespace, obj.name)
            mark = DRY_RUN_MARK if self.dry_run else ""
            invalid = next(
                (o for o in report.invalid_policies if (o.namespace, o.name) == (obj.namespace, obj.name)), None
            )
            if invalid is not None:
                self._event(where, "InvalidSpec", f"{mark}invalid policy: {invalid.error}", "Warning", topic="invalid")
                continue
            self._reported.pop((f"{POLICY_KIND}/{obj.namespace}/{obj.name}", "invalid"), None)
            if obj.policy is None:
                continue
            key = obj.policy.key
            reasons = report.stale.get(key)
            partial = None if reasons else report.partial.get(key)
            self._episode_warning(
                where,
                Reason.METRICS_STALE,
                f"{mark}holding {key}: {Reason.METRICS_STALE.text}: {'; '.join(reasons)}" if reasons else None,
            )
            self._episode_warning(
                where,
                Reason.METRICS_PARTIAL,
                f"{mark}no scale-down for {key}: {Reason.METRICS_PARTIAL.text}: {'; '.join(partial)}"
                if partial
                else None,
            )

    def _episode_warning(self, where: tuple[str, str, str], reason: Reason, message: str | None) -> None:
        """One Warning Event when an episode (stale, partial data) starts, none while it lasts, whatever its changing
        detail says; ``message`` None ends the episode."""
        topic = reason.value
        memo = (f"{where[0]}/{where[1]}/{where[2]}", topic)
        if message is None:
            self._reported.pop(memo, None)
        elif memo not in self._reported:
            self._event(where, event_reason(reason), message, "Warning", topic=topic)

    def _write_statuses(
        self,
        objects: Sequence[PolicyObject],
        policies: Mapping[str, ServicePolicy],
        plan: Plan,
        report: TickReport,
        now: float,
    ) -> None:
        """Status of every policy object; a write only when the update differs from the last one written (a
        steady service costs no API call per tick)."""
        if self.status_writer is None:
            return
        decisions = {d.key: d for d in plan.decisions}
        applied = {
            f"{r.action.namespace}/{r.action.name}": r.action
            for r in report.results
            if r.result == "applied" and isinstance(r.action, ScaleDeployment)
        }
        invalid = {(o.namespace, o.name): o.error for o in report.invalid_policies}
        for obj in objects:
            ident = (obj.namespace, obj.name)
            forecast_memo: tuple[Any, ...] | None = None
            if ident in invalid:
                update = invalid_status(invalid[ident] or "invalid spec")
            elif obj.policy is not None:
                key = obj.policy.key
                update = policy_status(
                    policies[key], decisions.get(key), applied.get(key), report.stale.get(key, ()), now
                )
                view = report.forecasts.get(key)
                record = forecast_record(view) if view is not None else None
                if record is not None:
                    # The demand at now + lead moves every tick; rewrite lastForecast only when the fit, the floor
                    # or the verdict changes, so a steady service costs no status write per tick.
                    forecast_memo = (record.time, record.replicas, record.reliable, record.reason, record.mode)
                    if self._written_forecast.get(ident) != forecast_memo:
                        update = replace(update, last_forecast=record)
            else:
                continue
            if self._written_status.get(ident) == (obj.generation, update):
                continue
            try:
                self.status_writer.update_policy_status(obj.namespace, obj.name, update, now=now)
            except Exception as exc:
                self.telemetry.error("status_write")
                log.warning("status of %s %s/%s not written (retried next tick): %s", POLICY_KIND, *ident, exc)
                continue
            self._written_status[ident] = (obj.generation, replace(update, last_forecast=None))
            if forecast_memo is not None:
                self._written_forecast[ident] = forecast_memo


def _accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# Stale reasons are free text (they name pods, URLs, ages); the metric label is one of these bounded categories.
_STALE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (STALE_DEPLOYMENT_MISSING, (STALE_DEPLOYMENT_MISSING,)),
    (STALE_METRICS_UNAVAILABLE, (STALE_METRICS_UNAVAILABLE, "unreachable", "did not answer", "timed out")),
    ("query_failed", ("query failed", "not the query api", "unexpected answer", "adapter error", "credentials")),
    ("invalid_value", ("nan", "inf", "not a number", "outside", "invalid")),
    ("sample_too_old", ("older than", "before the tick", " old", "stale")),
    ("no_data", ("no ", "empty", "without a valid sample", "missing")),
    ("duplicate_series", (" series", "duplicate")),  # "pod x: 2 series (differing ...)"
)


def stale_category(reason: str) -> str:
    """The bounded ``reason`` label of ``gpu_autoscaler_stale_services`` for a free-text stale reason."""
    text = reason.lower()
    for category, needles in _STALE_CATEGORIES:
        if any(needle in text for needle in needles):
            return category
    return "other"


def forecast_record(view: ServiceForecastView) -> ForecastRecord | None:
    """``status.lastForecast`` of one service: the fit, the demand it forecasts at now + lead and the floor."""
    pub = view.published
    if pub is None:
        return None
    floor = view.floor
    if floor is not None:
        reason, message = floor.reason.value, floor.detail
    else:
        reason, message = None, view.message or None
    return ForecastRecord(
        time=pub.latest.fitted_at,
        horizon_s=view.lead_s,
        quantile=pub.quantile,
        demand=view.demand,
        replicas=floor.replicas if floor is not None and floor.usable else None,
        model=pub.model,
        error=pub.relative_error,
        pinball_ratio=pub.pinball_ratio,
        mode=view.mode.value,
        reliable=pub.latest.reliable,
        reason=reason,
        message=message,
    )


def invalid_status(error: str) -> StatusUpdate:
    return StatusUpdate(
        conditions=(
            ConditionUpdate(READY, False, "InvalidSpec", error),
            ConditionUpdate(INVALID_SPEC, True, "InvalidSpec", error),
        )
    )


def policy_status(
    policy: ServicePolicy,
    decision: ScaleDecision | None,
    applied: Action | None,
    stale: Sequence[str],
    now: float,
) -> StatusUpdate:
    """The GPUScalingPolicy status update for one tick: replicas, the last applied action and its reason, conditions.

    ``lastAction`` is only sent when an action was applied, so ``kubectl get`` keeps showing why the replicas are
    what they are. Replicas are not sent when the Deployment is missing (0 would be a lie).
    """
    missing = STALE_DEPLOYMENT_MISSING in stale
    current = desired = None
    if decision is not None and not missing:
        current, desired = decision.current_replicas, decision.desired_replicas
    at_max = desired is not None and desired >= policy.max_replicas
    if missing:
        ready = ConditionUpdate(READY, False, "DeploymentNotFound", f"Deployment {policy.key} not found")
    else:
        mode = "RecommendOnly" if policy.mode is Mode.RECOMMEND_ONLY else "Active"
        ready = ConditionUpdate(READY, True, mode, f"scaling {policy.key} in mode {policy.mode.value}")
    conditions = (
        ready,
        ConditionUpdate(
            METRICS_STALE,
            bool(stale),
            event_reason(Reason.METRICS_STALE) if stale else "MetricsFresh",
            "; ".join(stale) if stale else "all scaling signals are fresh",
        ),
        ConditionUpdate(
            AT_MAX_REPLICAS,
            at_max,
            "AtMaxReplicas" if at_max else "BelowMaxReplicas",
            f"desired replicas at maxReplicas {policy.max_replicas}" if at_max else "",
        ),
        ConditionUpdate(INVALID_SPEC, False, "SpecValid", "the spec is valid"),
    )
    return StatusUpdate(
        current_replicas=current,
        desired_replicas=desired,
        last_action=LastAction.from_action(applied, now) if applied is not None else None,
        conditions=conditions,
    )


# ---- The runtime: scheduler, leader election, HTTP, signals -------------------------------------------------------


def _noop(now: float) -> None:
    """Placeholder job: forecasting and rebalancing land in later issues."""


class Runtime:
    """apscheduler jobs (tick, refit, rebalance), leader election, HTTP endpoints, clean shutdown."""

    def __init__(
        self,
        controller: Controller,
        telemetry: Telemetry,
        *,
        tick_interval_s: float = 15.0,
        refit_interval_s: float = 900.0,
        rebalance_interval_s: float = 300.0,
        tick_stall_s: float = 120.0,
        shutdown_grace_s: float = 10.0,
        elector: LeaderElector | None = None,
        refit: Callable[[float], None] = _noop,
        rebalance: Callable[[float], None] = _noop,
        http: tuple[str, int] | None = ("0.0.0.0", 8080),
        clock: Callable[[], float] = time.time,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.controller = controller
        self.telemetry = telemetry
        self.elector = elector
        self._tick_interval = tick_interval_s
        self._refit_interval = refit_interval_s
        self._rebalance_interval = rebalance_interval_s
        self._stall = tick_stall_s
        self._grace = shutdown_grace_s
        self._refit = refit
        self._on_stop = on_stop
        # The first refit waits for a tick: the tick reads the policies (and hands their PromQL overrides to the
        # metrics source) that the refit fits. Set again when this replica becomes the leader.
        self._refit_after_tick = True
        self._rebalance = rebalance
        self._clock = clock
        self._stopping = threading.Event()
        self._tick_running = threading.Lock()  # held while a tick runs; shutdown waits on it
        self._heartbeat = time.monotonic()
        self._tick_started: float | None = None
        self._ok_ticks = 0
        self.scheduler: Any = None
        self.http: HttpServer | None = None
        if http is not None:
            self.http = HttpServer(telemetry, self.healthz, self.readyz, bind_address=http[0], port=http[1])
        controller.can_act = self.can_act
        if elector is None:
            telemetry.set_leader(True)

    # -- leadership --

    def can_act(self) -> bool:
        if self._stopping.is_set():
            return False
        return self.elector is None or self.elector.is_leader()

    def on_started_leading(self) -> None:
        self.telemetry.set_leader(True)
        self.controller.start_acting(self._clock())
        self._refit_after_tick = True
        # Act now rather than at the next interval: after a handover the service has been unattended already.
        self._bring_forward("tick")

    def _bring_forward(self, job: str) -> None:
        """Run a scheduled job now rather than at its next interval."""
        if self.scheduler is not None and self.scheduler.running:
            try:
                self.scheduler.modify_job(job, next_run_time=datetime.now(UTC))
            except Exception:  # the job may be gone during shutdown
                log.debug("could not bring the %s job forward", job, exc_info=True)

    def on_stopped_leading(self) -> None:
        self.telemetry.set_leader(False)
        self.controller.stop_acting()

    # -- jobs --

    def tick(self) -> None:
        with self._tick_running:
            self._tick_started = time.monotonic()
            try:
                if not self.can_act():
                    self.telemetry.ticks.labels(result="standby").inc()
                    return
                self.controller.run_once(self._clock())
                report = self.controller.last_report
                if report is not None and report.result == "ok":
                    self._ok_ticks += 1
                if report is not None and report.result in ("ok", "hold") and self._refit_after_tick:
                    self._refit_after_tick = False
                    self._bring_forward("refit")
            except Exception:  # run_once never raises; this is the last line of defence for the thread
                log.exception("tick job failed")
                self.telemetry.error("decide")
            finally:
                self._tick_started = None
                self._heartbeat = time.monotonic()

    def _job(self, component: str, fn: Callable[[float], None]) -> Callable[[], None]:
        def run() -> None:
            if not self.can_act():
                return  # acting jobs run on the leader only
            try:
                fn(self._clock())
            except Exception:
                log.exception("%s job failed", component)
                self.telemetry.error(component)

        return run

    # -- health --

    def healthz(self) -> tuple[bool, str]:
        """Alive and not wedged: the tick loop finished an iteration recently and none is stuck."""
        now = time.monotonic()
        if self.scheduler is not None and not self.scheduler.running and not self._stopping.is_set():
            return False, "scheduler is not running"
        started = self._tick_started
        if started is not None and now - started > self._stall:
            return False, f"a tick has been running for {now - started:.0f}s (> {self._stall:g}s)"
        if started is None and now - self._heartbeat > self._stall:
            return False, f"no tick for {now - self._heartbeat:.0f}s (> {self._stall:g}s)"
        return True, "tick loop alive"

    def readyz(self) -> tuple[bool, str]:
        """Ready once settings are loaded (they are, if this object exists) and either a tick succeeded or this
        replica is a standby follower that can reach the Lease."""
        if self._stopping.is_set():
            return False, "shutting down"
        if self._ok_ticks > 0:
            return True, "ticking"
        if self.elector is not None and not self.elector.is_leader() and self.elector.last_attempt_ok:
            return True, f"standby follower (leader: {self.elector.holder or 'none'})"
        return False, "no successful tick yet"

    # -- lifecycle --

    def start(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        if self.http is not None:
            self.http.start()
            log.info("serving /metrics /healthz /readyz on port %d", self.http.port)
        if self.elector is not None:
            self.elector.start()
        # coalesce + max_instances=1: a slow tick delays the next one instead of stacking ticks up.
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}, timezone=UTC
        )
        first = datetime.now(UTC)
        self.scheduler.add_job(self.tick, "interval", seconds=self._tick_interval, id="tick", next_run_time=first)
        # The refit's first run is brought forward by the first tick (see tick()).
        self.scheduler.add_job(self._job("refit", self._refit), "interval", seconds=self._refit_interval, id="refit")
        self.scheduler.add_job(
            self._job("rebalance", self._rebalance), "interval", seconds=self._rebalance_interval, id="rebalance"
        )
        self.scheduler.start()
        self._heartbeat = time.monotonic()

    def stop(self) -> None:
        """Stop acting at once, let a running tick finish (bounded), then release the Lease for a fast handover."""
        log.info("shutting down")
        self._stopping.set()  # can_act() is False from here: an in-flight tick applies nothing more
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._tick_running.acquire(timeout=self._grace):
            self._tick_running.release()
        else:
            log.warning("a tick is still running after %.0fs; releasing the lease anyway", self._grace)
        if self.elector is not None:
            self.elector.stop(release=True)
        self.telemetry.set_leader(False)
        if self._on_stop is not None:
            try:
                self._on_stop()  # e.g. stop the forecast workers
            except Exception:
                log.exception("shutdown hook failed")
        if self.http is not None:
            self.http.stop()

    def run_forever(self) -> int:
        """Start, block until SIGTERM/SIGINT, stop cleanly."""
        stop = threading.Event()

        def handle(signum: int, _frame: object) -> None:
            log.info("received %s", signal.Signals(signum).name)
            stop.set()

        previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not stop.wait(1.0):
                pass
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        return 0


# ---- Building everything from settings ----------------------------------------------------------------------------


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("apscheduler", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


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
            )
            for p in loaded.valid
        ]
        out += [PolicyObject(b.namespace, b.name, None, b.text, b.generation) for b in loaded.invalid]
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
        cluster=KubeClusterReader(api_client, ReaderConfig(request_timeout_s=timeout)),
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
    holds with stale metrics (visible in /metrics and Events) rather than crash-looping through it.
    """
    from autoscaler.adapters.kubernetes.config import load_api_client
    from autoscaler.adapters.prometheus import connect

    api_client = load_api_client(
        settings.kubernetes.config_mode, settings.kubernetes.kubeconfig, settings.kubernetes.context
    )
    metrics = connect(settings.prometheus, check=False)
    if check_prometheus:
        try:
            info = metrics.check()
            log.info("Prometheus at %s answers (version %s)", info.url, info.version or "unknown")
        except Exception as exc:
            log.warning("Prometheus check failed, starting anyway (services hold until it answers): %s", exc)
    return _kubernetes_adapters(settings, api_client, metrics)


def _discard_result(job: Callable[[float], object]) -> Callable[[float], None]:
    def run(now: float) -> None:
        job(now)

    return run


def lease_name(settings: Settings) -> str:
    """A dry-run controller elects among dry-run replicas only: on the real Lease it could win, act on nothing,
    and keep the real controller from acting at all."""
    name = settings.leader_election.lease_name
    return f"{name}-dry-run" if settings.dry_run else name


def build_runtime(
    settings: Settings,
    adapters: Adapters | None = None,
    refit: Callable[[float], None] | None = None,
    rebalance: Callable[[float], None] = _noop,
    http: bool = True,
) -> Runtime:
    """Everything ``autoscaler run`` needs. ``refit`` defaults to the ``ForecastService``'s refit job, which also
    hands the tick its forecast floors; pass another callable to replace the job (and run without forecasts)."""
    from autoscaler.adapters.kubernetes_lease import ElectionTimings, KubernetesLeaseStore, LeaderElector

    adapters = adapters if adapters is not None else build_adapters(settings)
    le = settings.leader_election
    telemetry = Telemetry(identity=le.identity if le.enabled else "")
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
        )
        refit = forecasts.refit
    controller = Controller(
        metrics=adapters.metrics,
        cluster=adapters.cluster,
        writer=adapters.writer,
        policies=adapters.policies,
        status_writer=adapters.status_writer,
        node_pools=adapters.node_pools,
        telemetry=telemetry,
        dry_run=settings.dry_run,
        forecasts=forecasts,
    )
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
            ElectionTimings(le.lease_duration_seconds, le.renew_deadline_seconds, le.retry_period_seconds),
            on_started_leading=lambda: runtime_ref[0].on_started_leading(),
            on_stopped_leading=lambda: runtime_ref[0].on_stopped_leading(),
            on_error=lambda exc: telemetry.error("leader_election"),
        )
    runtime = Runtime(
        controller,
        telemetry,
        tick_interval_s=settings.tick_interval_seconds,
        refit_interval_s=settings.refit_interval_seconds,
        rebalance_interval_s=settings.rebalance_interval_seconds,
        tick_stall_s=settings.tick_stall_seconds,
        shutdown_grace_s=settings.shutdown_grace_seconds,
        elector=elector,
        refit=_discard_result(refit),
        rebalance=rebalance,
        http=(settings.http.bind_address, settings.http.port) if http and settings.http.enabled else None,
        on_stop=forecasts.close if forecasts is not None else None,
    )
    runtime_ref.append(runtime)
    return runtime
