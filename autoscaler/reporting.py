"""What one tick tells the world, beyond its writes: the ``TickReport``, the decision log, the per-service and
forecast gauges, the Warning Events on the policies (invalid spec; stale or partial metrics, once per episode) and
the GPUScalingPolicy status (replicas, conditions, the last action and the last forecast), written only when it
changes.

The controller (``autoscaler.controller``) gathers and decides; ``TickReporter`` reports. Events go through the
actuator, whose memo keeps recommend-only and dry-run plans from repeating them every tick.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.actuator import (
    DEPLOYMENT_MISSING,
    DRY_RUN_MARK,
    ActionResult,
    Actuator,
    action_kind,
    describe_action,
    event_reason,
)
from autoscaler.core.cluster import ClusterSnapshot, HpaInfo
from autoscaler.core.decide import ReplicaFloor
from autoscaler.core.model import (
    Action,
    EvictPod,
    Mode,
    Plan,
    ScaleDecision,
    ScaleDeployment,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.status import (
    AT_MAX_REPLICAS,
    INVALID_SPEC,
    METRICS_STALE,
    READY,
    ConditionUpdate,
    ForecastRecord,
    LastAction,
    StatusUpdate,
)
from autoscaler.core.tick import ServiceForecastView
from autoscaler.ports import POLICY_KIND, PolicyObject, PolicyStatusWriter, WriteNotAllowed
from autoscaler.telemetry import ForecastGauges, ServiceGauges, Telemetry

log = logging.getLogger("autoscaler")

# Stale reasons the controller itself adds (the metrics adapter adds its own, e.g. "empty result").
STALE_METRICS_UNAVAILABLE = "metrics_unavailable"
STALE_DEPLOYMENT_MISSING = DEPLOYMENT_MISSING


@dataclass(slots=True)
class TickReport:
    """What one tick saw, decided and did; ``autoscaler plan`` prints it, tests read it."""

    time: float
    plan: Plan
    result: str = "ok"  # ok | hold | error | standby
    held_because: str | None = None
    # the read that held the tick: policy_read | cluster_read (before anything else was read) | metrics_read
    held_by: str | None = None
    results: list[ActionResult] = field(default_factory=list)
    stale: dict[str, tuple[str, ...]] = field(default_factory=dict)  # service key -> reasons
    partial: dict[str, tuple[str, ...]] = field(default_factory=dict)  # service key -> why no scale-down
    # service key -> the HPAs that also scale its Deployment (the service is then recommend-only this tick)
    hpas: dict[str, tuple[HpaInfo, ...]] = field(default_factory=dict)
    invalid_policies: list[PolicyObject] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    floors: Mapping[str, ReplicaFloor] = field(default_factory=dict)  # service key -> forecast floor handed to decide
    forecasts: Mapping[str, ServiceForecastView] = field(default_factory=dict)  # what the tick made of each forecast


GANG_COUNTED_FOR_S = 600.0  # seconds a gang stopped by evictions is not counted again (its remaining pods' evictions)


class TickReporter:
    """Logs, metrics, Events and policy status of each tick. Remembers what it wrote, to not rewrite it."""

    def __init__(
        self,
        telemetry: Telemetry,
        actuator: Actuator,
        status_writer: PolicyStatusWriter | None = None,
        *,
        dry_run: bool = False,
    ) -> None:
        self.telemetry = telemetry
        self.actuator = actuator
        self.status_writer = status_writer
        self.dry_run = dry_run
        self._written_status: dict[tuple[str, str], tuple[int | None, StatusUpdate]] = {}
        self._written_forecast: dict[tuple[str, str], tuple[Any, ...]] = {}  # lastForecast, to not rewrite each tick
        self._seen_uids: dict[tuple[str, str], str] = {}  # each listed policy's metadata.uid at the last prune
        self._gangs_counted: dict[str, float] = {}  # gang -> when its evictions were last counted as a gang stopped
        # a scale applied whose status write failed: its lastAction (and when) goes with the next write that succeeds
        self._unwritten_action: dict[tuple[str, str], tuple[Action, float]] = {}

    def reset(self) -> None:
        """Forget what was written (a new leader writes everything once)."""
        self._written_status.clear()
        self._written_forecast.clear()
        self._unwritten_action.clear()

    def forget_unlisted(self, objects: Sequence[PolicyObject], snapshot: ClusterSnapshot | None = None) -> None:
        """Forget what was written to, and reported on, objects this tick's reads no longer list.

        A policy deleted and created again under the same name is a new object with an empty status and no Events:
        the memos of the deleted one (same name, generation 1 again, same status) would keep its status and its
        Warning Events from ever being written. Pruned at every tick that read the policies, the memos also hold
        no more entries than there are objects (a long run deletes many policies, and a dry run plans many pods).

        ``snapshot``: the tick's cluster read; the dry-run Events' memos of Pods and Deployments it does not list
        are forgotten too (a dry-run plan only targets objects of the snapshot it was made from)."""
        # An object whose uid changed since the last tick was deleted and re-created between two reads: it counts as
        # unlisted once, so its memos (Warning Events included) start over.
        uids = {(o.namespace, o.name): o.uid for o in objects if o.uid}
        replaced = {i for i, uid in uids.items() if self._seen_uids.get(i, uid) != uid}
        self._seen_uids = uids
        listed = {(o.namespace, o.name) for o in objects} - replaced
        for memo in (self._written_status, self._written_forecast, self._unwritten_action):
            for ident in [i for i in memo if i not in listed]:
                del memo[ident]
        kinds = (f"{POLICY_KIND}/", "Pod/", "Deployment/") if snapshot is not None else (f"{POLICY_KIND}/",)
        reported = self.actuator.reported
        memos = [k for k in reported if k[0].startswith(kinds)]
        live = {f"{POLICY_KIND}/{namespace}/{name}" for namespace, name in listed}
        if snapshot is not None and any(not k[0].startswith(kinds[0]) for k in memos):
            # only with a Pod or Deployment memo (a dry run's): no walk over every pod at every acting tick
            live.update(f"Pod/{p.namespace}/{p.name}" for p in snapshot.pods)
            live.update(f"Deployment/{d.namespace}/{d.name}" for d in snapshot.deployments)
        for memo_key in memos:
            if memo_key[0] not in live:
                reported.pop(memo_key, None)

    # -- decisions and actions --

    def decisions(self, plan: Plan) -> None:
        for decision in plan.decisions:
            self.telemetry.decisions.labels(reason=decision.reason.value).inc()
            log_decision(decision)

    def actions(self, results: Sequence[ActionResult], report: TickReport) -> None:
        """Count every action by its result; a failed write is also one of the tick's errors."""
        for outcome in results:
            action = outcome.action
            if outcome.result == "failed":
                report.errors.append(f"{outcome.component}: {describe_action(action)}: {outcome.message}")
            self.telemetry.actions.labels(
                kind=action_kind(action),
                reason=action.reason.value,
                dry_run=str(self.dry_run).lower(),
                result=outcome.result,
            ).inc()
        self._training(results, report.time)

    def _training(self, results: Sequence[ActionResult], now: float) -> None:
        """Lost training work and gangs stopped, for the applied preemptions. A gang whose evictions span two ticks
        (a budget refused its last pods, the next tick evicts them) is one gang stopped, not two: a gang counted
        within ``GANG_COUNTED_FOR_S`` is not counted again (no gang is preempted again that soon: the training's
        minimum runtime, 600 s by default, protects a restarted gang)."""
        for gang in [g for g, at in self._gangs_counted.items() if not 0 <= now - at < GANG_COUNTED_FOR_S]:
            del self._gangs_counted[gang]
        gangs: set[str] = set()
        for outcome in results:
            action = outcome.action
            if outcome.result != "applied":
                continue
            if isinstance(action, SuspendWorkload):
                self.telemetry.gangs_stopped.labels(how="suspend").inc()
                self.telemetry.training_lost.inc(action.lost_work_gpu_s / 3600.0)
            elif isinstance(action, EvictPod) and action.reason is Reason.PREEMPT_FOR_INFERENCE:
                self.telemetry.training_lost.inc(action.lost_work_gpu_s / 3600.0)
                gangs.add(action.gang or f"pod/{action.namespace}/{action.name}")
        fresh = {g for g in gangs if g not in self._gangs_counted}
        for gang in gangs:
            self._gangs_counted[gang] = now
        if fresh:
            self.telemetry.gangs_stopped.labels(how="evict").inc(len(fresh))

    def capacity(self, plan: Plan) -> None:
        """Burst pool and shortfall gauges from the arbitration's report (nothing when arbitration is off)."""
        if plan.capacity is None:
            return
        for pool in plan.capacity.pools:
            self.telemetry.burst_nodes.labels(pool=pool.name).set(pool.nodes)
        self.telemetry.burst_spend.set(plan.capacity.spend_per_hour)
        self.telemetry.capacity_shortfall.set(sum(s.replicas * s.gpus_per_replica for s in plan.capacity.shortfalls))

    # -- gauges --

    def services(self, plan: Plan, policies: Mapping[str, ServicePolicy], report: TickReport) -> None:
        """The per-service replica and staleness gauges, and the forecast gauges."""
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
        self.telemetry.forecasts.update(forecast_gauges(report.forecasts, report.time))

    # -- Events on the policies --

    def warnings(self, objects: Sequence[PolicyObject], report: TickReport) -> None:
        """A Warning Event on the policy when its service turns stale (once per episode), and one per invalid
        object naming the bad field ("say so in a metric and an event")."""
        for obj in objects:
            where = (POLICY_KIND, obj.namespace, obj.name)
            mark = DRY_RUN_MARK if self.dry_run else ""
            invalid = next(
                (o for o in report.invalid_policies if (o.namespace, o.name) == (obj.namespace, obj.name)), None
            )
            if invalid is not None:
                message = f"{mark}invalid policy: {invalid.error}"
                self.actuator.event(where, "InvalidSpec", message, "Warning", topic="invalid")
                continue
            self.actuator.reported.pop((f"{POLICY_KIND}/{obj.namespace}/{obj.name}", "invalid"), None)
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
            self.actuator.reported.pop(memo, None)
        elif memo not in self.actuator.reported:
            self.actuator.event(where, event_reason(reason), message, "Warning", topic=topic)

    # -- status --

    def statuses(
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
                action: Action | None = applied.get(key)
                action_time = now
                if action is not None:
                    self._unwritten_action[ident] = (action, now)
                elif ident in self._unwritten_action:
                    # applied at an earlier tick whose status write failed: the status still says why (and when)
                    action, action_time = self._unwritten_action[ident]
                update = policy_status(
                    policies[key], decisions.get(key), action, report.stale.get(key, ()), now, action_time
                )
                view = report.forecasts.get(key)
                spec_forecast = policies[key].forecast
                quantile = spec_forecast.quantile if spec_forecast is not None else None
                record = forecast_record(view, quantile) if view is not None else None
                if record is not None:
                    # The demand at now + lead moves every tick; rewrite lastForecast only when the fit, the floor
                    # or the verdict changes, so a steady service costs no status write per tick.
                    forecast_memo = (
                        record.time,
                        record.replicas,
                        record.reliable,
                        record.reason,
                        record.mode,
                        record.headroom_state,
                        record.headroom_ratio,
                    )
                    if self._written_forecast.get(ident) != forecast_memo:
                        update = replace(update, last_forecast=record)
            else:
                continue
            if self._written_status.get(ident) == (obj.generation, _steady(update)):
                self._unwritten_action.pop(ident, None)
                continue
            if not self.actuator.can_act():
                # asked before every write: a Lease lost after the previous status write stops the rest
                log.info("not the leader any more: status of %s %s/%s not written", POLICY_KIND, *ident)
                return
            try:
                # can_write: the writer reads the object before its PUT (with retries); the Lease may be lost
                # meanwhile, so it asks again right before the PUT, as every other write does. generation: the spec
                # this tick decided on is the one observedGeneration reports, not a newer one read by the writer.
                # uid: the object this tick read; one deleted and re-created under its name since is not written
                # (skipped, no error: the next tick lists the new object, forgets this memo and writes its status).
                self.status_writer.update_policy_status(
                    obj.namespace,
                    obj.name,
                    update,
                    now=now,
                    generation=obj.generation,
                    can_write=self.actuator.can_act,
                    uid=obj.uid,
                )
            except WriteNotAllowed as exc:
                log.info("not the leader any more: status of %s %s/%s not written: %s", POLICY_KIND, *ident, exc)
                return
            except Exception as exc:
                self.telemetry.error("status_write")
                log.warning("status of %s %s/%s not written (retried next tick): %s", POLICY_KIND, *ident, exc)
                continue
            self._written_status[ident] = (obj.generation, _steady(replace(update, last_forecast=None)))
            self._unwritten_action.pop(ident, None)
            if forecast_memo is not None:
                self._written_forecast[ident] = forecast_memo


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _steady(update: StatusUpdate) -> StatusUpdate:
    """``update`` as the memo compares it: the MetricsStale condition's message without its numbers. A stale
    reason carries the sample's age, which grows every tick; the condition's status, reason and transition do not
    change through the episode, and a status write per tick for the age alone is churn (each a new
    resourceVersion). The message written is the episode's first (or the last one that changed otherwise)."""
    conditions = tuple(
        replace(c, message=_NUMBER.sub("#", c.message)) if c.type == METRICS_STALE and c.status else c
        for c in update.conditions
    )
    return replace(update, conditions=conditions)


def log_decision(decision: ScaleDecision) -> None:
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


# Stale reasons are free text (they name pods, URLs, ages); the metric label is one of these bounded categories.
STALE_QUERY_REFUSED = "query_refused"
# A policy's override the Prometheus adapter refused before sending it: "spec.queries.<field>: " then a refusal of
# promql.render, check_self_contained or check_confined. Only the start of the refusal identifies it: the rest
# quotes the tenant's query (info( holds "inf", a selector may hold "no "), and the same prefix also comes before
# Prometheus's own answer to an override that was sent ("spec.queries.<field>: Prometheus query failed: ...").
_OVERRIDE_REFUSED = re.compile(
    r"spec\.queries\.[A-Za-z]+: (?:"
    # render
    r"unknown placeholder |placeholder \{|value for \{|unterminated string literal"
    # check_self_contained
    r"|the query must be on one line|comments \(#\) are not allowed|unbalanced |unclosed "
    # check_confined
    r"|too long to check: |too complex to check: |not valid PromQL: |selector .* does not select "
    r"|info\(\) may not be used|cannot check a )"
)
# The adapter's words for a request to Prometheus that got no answer (prometheus.py ``_query``): unreachable, a TLS
# handshake refused, or any other transport failure ("Prometheus at <url>: <exception>"). Matched before the needles:
# the URL and the exception's text ("Invalid URL", a host named "...-infra") say nothing about the metrics.
_PROMETHEUS_UNANSWERED = re.compile(r"(?:^|: )prometheus at \S+(?: unreachable)?: ")
_STALE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (STALE_DEPLOYMENT_MISSING, (STALE_DEPLOYMENT_MISSING,)),
    (STALE_METRICS_UNAVAILABLE, (STALE_METRICS_UNAVAILABLE, "unreachable", "did not answer", "timed out")),
    (
        "query_failed",
        (
            "query failed",
            "not the query api",
            "unexpected answer",
            "unexpected sample shape",
            "adapter error",
            "credentials",
        ),
    ),
    ("invalid_value", ("is nan", ": nan ", "+inf", "-inf", "not a number", "outside", "invalid")),
    ("sample_too_old", ("older than", "before the tick", " old", "stale")),
    ("no_data", ("no ", "empty", "without a valid sample", "missing")),
    ("duplicate_series", (" series", "duplicate")),  # "pod x: 2 series (differing ...)"
)
_SERVICE_KEY = re.compile(r"[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9.-]*")
# Every value the label takes: the alert's runbook explains each one.
STALE_CATEGORY_NAMES: tuple[str, ...] = (STALE_QUERY_REFUSED, *(c for c, _ in _STALE_CATEGORIES), "other")


def stale_category(reason: str) -> str:
    """The bounded ``reason`` label of ``gpu_autoscaler_stale_services`` for a free-text stale reason."""
    if _OVERRIDE_REFUSED.match(reason):
        return STALE_QUERY_REFUSED
    if _PROMETHEUS_UNANSWERED.search(reason.lower()):
        return STALE_METRICS_UNAVAILABLE
    # the adapter's wording only: a namespace/name (``inference/chat``: "inf") says nothing about the cause
    text = _SERVICE_KEY.sub(" ", reason.lower())
    for category, needles in _STALE_CATEGORIES:
        if any(needle in text for needle in needles):
            return category
    return "other"


def forecast_gauges(views: Mapping[str, ServiceForecastView], now: float) -> list[ForecastGauges]:
    """The forecast gauges of every forecasting service the tick read."""
    out = []
    for v in views.values():
        pub = v.published
        usable = v.floor is not None and v.floor.usable
        fallback = v.floor.reason.value if v.floor is not None and not v.floor.usable else None
        out.append(
            ForecastGauges(
                namespace=v.namespace,
                service=v.service,
                pinball_ratio=pub.pinball_ratio if pub is not None else None,
                reliable=pub.latest.reliable if pub is not None else None,
                fit_age_s=max(0.0, now - pub.latest.refit_time) if pub is not None else None,
                floor_replicas=v.floor.replicas if usable and v.floor is not None else None,
                fallback_reason=fallback,
                headroom_ratio=v.headroom.ratio if v.headroom is not None else None,
                headroom_state=v.headroom.state.value if v.headroom is not None else None,
                excess_share=v.excess_share if usable else None,
            )
        )
    return out


def forecast_record(view: ServiceForecastView, quantile: float | None = None) -> ForecastRecord | None:
    """``status.lastForecast`` of one service: the fit, the demand it forecasts at now + lead and the floor. Without
    a fit in force (none yet, or withheld after a spec change) but with the headroom the tick ran at: a record of
    that headroom alone (``time`` None, at the spec's ``quantile``), so the status never shows an earlier fit's
    verdict as the one in force."""
    pub = view.published
    if pub is None:
        if view.headroom is None or quantile is None:
            return None
        reason = view.floor.reason.value if view.floor is not None else None
        return ForecastRecord(
            time=None,
            horizon_s=view.lead_s,
            quantile=quantile,
            mode=view.mode.value,
            reason=reason,
            message=(view.floor.detail if view.floor is not None else view.message) or None,
            headroom_state=view.headroom.state.value,
            headroom_ratio=round(view.headroom.ratio, 4),
            headroom_message=view.headroom.detail,
        )
    floor = view.floor
    message: str | None
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
        headroom_state=view.headroom.state.value if view.headroom is not None else None,
        headroom_ratio=round(view.headroom.ratio, 4) if view.headroom is not None else None,
        headroom_message=view.headroom.detail if view.headroom is not None else None,
        excess_share=round(view.excess_share, 4) if floor is not None and floor.usable else None,
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
    action_time: float | None = None,
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
        last_action=(
            LastAction.from_action(applied, action_time if action_time is not None else now)
            if applied is not None
            else None
        ),
        conditions=conditions,
    )
