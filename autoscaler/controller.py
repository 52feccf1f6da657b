"""The controller: ``Controller.run_once(now)`` is one tick, RunOnce style. It reads the policies, the cluster and the
metrics, decides through the pure ``autoscaler.core.tick.decide_tick`` (the simulator's decision too), applies the plan
through the ``Actuator`` and reports (``autoscaler.reporting``). The rules it keeps, beyond what the core already does:

- **A failed read holds.** A PortError (or any exception) from the policy, cluster or metrics read never turns into
  a scale-down, an eviction or a suspension: when the cluster or the policies cannot be read nothing is applied; when
  the metrics cannot be read every service is observed as stale and ``decide()`` holds. When the forecasts cannot be
  read the tick decides reactively.
- **A failed write is retried by the next tick**, which re-decides on fresh data (the failed action's scale event is
  taken out of the state so that the rate policies do not count a change that never happened). Nothing propagates
  out of ``run_once``: the loop survives every error, counts it and logs it.
- **Only the leader acts**, and it asks before every single write (node-pool resizes and the rebalancer's move ledger
  included), so a Lease lost in the middle of a tick stops the rest of that tick's writes.
- **Dry-run writes nothing but Events** (marked ``[dry-run]``); the plan is still logged and counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from autoscaler.actuator import DRY_RUN_MARK, ActionResult, Actuator, GuardContext, forget_unapplied
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import ClusterSnapshot, hpas_targeting
from autoscaler.core.headroom import DEFAULT_HEADROOM
from autoscaler.core.model import (
    ControllerState,
    Mode,
    Observation,
    Plan,
    ScaleNodePool,
    ServiceObservation,
    ServicePolicy,
)
from autoscaler.core.rebalance import (
    RebalanceConfig,
    RebalancePlan,
    RebalanceState,
    managed_services,
    merge_move_times,
    merge_moved_for,
    plan_rebalance,
    put_back_hold,
    record_pass,
    resumable_suspended,
)
from autoscaler.core.rebalance import protected_owners as core_protected_owners
from autoscaler.core.tick import ForecastReadConfig, TickConfig, TickInput, decide_tick
from autoscaler.ports import (
    POLICY_KIND,
    ClusterReader,
    ClusterWriter,
    ForecastReader,
    MetricsSource,
    MoveLedger,
    NodePoolScaler,
    PolicyObject,
    PolicySource,
    PolicyStatusWriter,
)
from autoscaler.reporting import STALE_DEPLOYMENT_MISSING, STALE_METRICS_UNAVAILABLE, TickReport, TickReporter
from autoscaler.telemetry import Telemetry

__all__ = [
    "POLICY_KIND",
    "STALE_DEPLOYMENT_MISSING",
    "STALE_METRICS_UNAVAILABLE",
    "Controller",
    "RebalanceReport",
    "TickDecider",
    "TickReport",
]

log = logging.getLogger("autoscaler")


@dataclass(slots=True)
class RebalanceReport:
    """What one rebalance pass planned and did (``autoscaler plan`` prints it, tests read it)."""

    time: float
    plan: RebalancePlan | None  # None: the pass was held or failed
    result: str = "ok"  # ok | held | error
    held_because: str | None = None
    results: list[ActionResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    protected: frozenset[str] = frozenset()  # owners left alone this pass


def protected_owners(tick: TickReport, spare_only: bool = True) -> frozenset[str]:
    """The Deployments the latest tick says a rebalance move must not touch (``core.rebalance.protected_owners``)."""
    return core_protected_owners(tick.plan.decisions, set(tick.stale) | set(tick.partial), spare_only)


def given_back(plan: Plan) -> frozenset[str]:
    """The nodes a tick's burst scale-downs name (``ScaleNodePool.remove_node``): on their way out, though the
    snapshot shows them ready until their drain cordons them (a provider that deletes the instance without a drain
    never does). Whatever the outcome of the write: a give-back not made yet is tried again at the next tick."""
    return frozenset(
        a.remove_node
        for a in plan.actions
        if isinstance(a, ScaleNodePool) and a.remove_node is not None and a.nodes < a.previous_nodes
    )


TickDecider = Callable[[TickInput, ControllerState, TickConfig], tuple[Plan, ControllerState]]


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
        forecasts: ForecastReader | None = None,
        capacity: CapacityConfig | None = None,
        rebalance: RebalanceConfig | None = None,
        move_ledger: MoveLedger | None = None,
    ) -> None:
        self.metrics = metrics
        self.capacity = capacity  # capacity arbitration (preempt, burst, give back); None = replicas only
        self.rebalance_config = rebalance  # the rebalancer's bounds; None = no pass runs
        self.rebalance_state = RebalanceState()
        # where the rebalancer's evictions are recorded across restarts and changes of leader (its hourly bound);
        # None: in memory only
        self.move_ledger = move_ledger
        self.last_rebalance: RebalanceReport | None = None
        self.cluster = cluster
        self.writer = writer
        self.policies = policies
        self.status_writer = status_writer
        self.node_pools = node_pools
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.dry_run = dry_run
        self.can_act = can_act  # replaced by the Runtime (leadership); the actuator asks it before every write
        # replaced by the Runtime: leadership without the shutdown, asked to finish a gang whose first pod is evicted
        self.can_finish: Callable[[], bool] = lambda: self.can_act()
        self.forecasts = forecasts
        self.actuator = Actuator(
            writer,
            node_pools,
            dry_run=dry_run,
            can_act=lambda: self.can_act(),
            on_error=self.telemetry.error,
            can_finish=lambda: self.can_finish(),
        )
        self.reporter = TickReporter(self.telemetry, self.actuator, status_writer, dry_run=dry_run)
        self._decide: TickDecider = decide_tick
        self.policies_seen: tuple[ServicePolicy, ...] = ()  # valid policies of the latest tick (the refit fits these)
        self._queries: dict[str, Any] = {}
        self.state = ControllerState()
        self.acting_since: float | None = None  # when this process started acting (took the lease)
        # per burst pool, the provider's (min, max) nodes as last read: kept through a failed read
        self._pool_bounds_read: dict[str, tuple[int | None, int | None]] = {}
        self.last_report: TickReport | None = None
        self._tick_before_term: TickReport | None = None  # ``last_report`` when leadership last changed
        self._policy_owners: dict[str, tuple[str, str]] = {}  # service key -> (namespace, name) of its policy
        self._lock = threading.Lock()
        self._pending_reset: tuple[str, float | None] | None = None
        # held only to set or swap ``_pending_reset`` (the election thread sets it while a tick may be taking it: a
        # swap that was not atomic could lose a term's reset, and with it the takeover grace)
        self._reset_lock = threading.Lock()
        self.telemetry.dry_run.set(1 if dry_run else 0)

    # -- leadership hooks (called by the elector) --

    def start_acting(self, now: float) -> None:
        """A fresh leader knows no history: forget any state and start the takeover grace now.

        Called from the election thread, so it must not wait for a running tick (that tick may be asking the
        elector whether it still leads): the reset is recorded here and applied when the next tick starts.
        """
        with self._reset_lock:
            self._pending_reset = ("start", now)

    def stop_acting(self) -> None:
        with self._reset_lock:
            self._pending_reset = ("stop", None)

    def clock_stepped_forward(self, now: float) -> None:
        """The wall clock stepped forward (the runtime compares it with the monotonic clock): every window and timer
        of the state aged by the step at once. While acting, start over as a fresh leader does (no history, the
        takeover grace from ``now``): no scale-down or give-back on the strength of a window the step emptied."""
        with self._reset_lock:
            pending = self._pending_reset
            if pending is not None and pending[0] == "stop":
                return  # leadership lost meanwhile: the reset to come forgets everything anyway
            if self.acting_since is not None or pending is not None:
                self._pending_reset = ("start", now)

    def _apply_pending_reset(self) -> None:
        with self._reset_lock:
            pending, self._pending_reset = self._pending_reset, None
        if pending is None:
            return
        self.state = ControllerState()
        self.rebalance_state = RebalanceState()
        # the owners of contested Deployments as this process last saw them (names, not uids): another leader may
        # have seen policies deleted and re-created meanwhile; the term starts from the source's order, as a fresh
        # process does
        self._policy_owners = {}
        self.reporter.reset()
        self.actuator.reported.clear()
        self.acting_since = pending[1]
        # a rebalance pass waits for a tick of the new term (``_rebalance``)
        self._tick_before_term = self.last_report
        if pending[0] == "start" and self.forecasts is not None:
            # the fits may have gone stale while another replica led, and this tick runs before the term's first
            # refit: a service without a usable forecast holds until that refit (ForecastReader.start_term)
            self.forecasts.start_term()

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

    # -- the rebalance pass --

    def rebalance(self, now: float) -> RebalanceReport | None:
        """One rebalance pass at ``now`` (the runtime's rebalance job, on the leader only). Never raises.

        It moves nothing unless the latest tick read everything (a pass takes a replica away for a cold start; it must
        not follow from metrics or a cluster it could not read), and it leaves alone every service the latest tick
        wanted to grow, guarded on latency or saw stale. Only evictions that were applied count against the hourly
        bound (a dry run or a PodDisruptionBudget's refusal moved nothing), and those that failed (perhaps made)."""
        if self.rebalance_config is None:
            return None
        with self._lock:
            # A leadership change not yet applied by a tick: the pass must see the new term's start (the takeover
            # grace), not act on the previous term's.
            self._apply_pending_reset()
            if self.acting_since is None:
                self.acting_since = now
            try:
                report = self._rebalance(now, self.rebalance_config)
            except Exception as exc:  # a bug in here must not kill the scheduler thread
                log.exception("rebalance pass failed")
                self.telemetry.error("rebalance")
                self.telemetry.rebalance_passes.labels(result="error").inc()
                report = RebalanceReport(now, None, result="error", held_because=f"{type(exc).__name__}: {exc}")
            self.last_rebalance = report
        return report

    def _rebalance(self, now: float, config: RebalanceConfig) -> RebalanceReport:
        tick = self.last_report
        why = None
        if tick is None:
            why = "no tick yet"
        elif tick.result != "ok":
            why = f"the latest tick did not read everything ({tick.held_because or tick.result})"
        elif now - tick.time > 4 * config.interval_s:
            why = f"the latest tick is {now - tick.time:.0f}s old"
        elif tick is self._tick_before_term:
            # A replica that took the Lease (back) still has the tick of its previous term: the services it protected,
            # managed and saw stale are those of before the takeover, not now's. The tick brought forward comes first.
            why = "no tick since this replica started acting (it took the Lease)"
        if why is not None or tick is None:
            return self._rebalance_held(now, why or "no tick yet")
        try:
            snapshot = self.cluster.snapshot(now)
        except Exception as exc:
            self.telemetry.error("cluster_read")
            return self._rebalance_held(now, f"cluster_read: {type(exc).__name__}: {exc}")
        protected = protected_owners(tick, config.spare_replicas_only)
        # A dry run evicts nothing and records nothing, but reads the ledger it is given (``autoscaler plan``): the
        # moves it shows are those the acting controller's hourly budget still allows, not a fresh hour's.
        ledger = self.move_ledger
        if ledger is not None:
            # The hourly bound counts every eviction of the last hour, including a previous leader's or a previous
            # run's: without the ledger, a restart or a change of leader would start a fresh budget.
            try:
                recorded = ledger.read()
            except Exception as exc:  # PortError, or a bug: moving nothing is safe, moving past the bound is not
                return self._ledger_failed(now, exc)
            merged = merge_move_times(self.rebalance_state.move_times, recorded, now)
            # and the targets moved for, each waiting out retry_after_s whichever leader moved for it
            targets = merge_moved_for(self.rebalance_state.moved_for, ledger.targets())
            self.rebalance_state = replace(self.rebalance_state, move_times=merged, moved_for=targets)
        # the runtime's job sets the pace: a pass is due whenever the job runs (its timer may fire a little early)
        due = replace(self.rebalance_state, last_pass_at=None)
        # only the services a valid policy scaled at the latest tick: a move is an eviction
        managed = managed_services(tick.plan.decisions)
        plan, state = plan_rebalance(
            snapshot,
            now,
            config,
            due,
            protected=protected,
            managed=managed,
            leaving=given_back(tick.plan),
            resumable=resumable_suspended(tick.plan),
        )
        results: list[ActionResult] = []
        if plan.actions and ledger is not None and not self.dry_run:
            # Recorded before they go out: a crash between the evictions and the record must not forget them. A
            # ledger that cannot be written (or was written by another process since it was read) moves nothing.
            reserved = self.rebalance_state.move_times + (now,) * len(plan.actions)
            if not self.can_act():
                # The ledger is a write like any other: a replica that lost the Lease during the pass (its reads may
                # take longer than the Lease lasts) records nothing, and so moves nothing. Not an error.
                return self._rebalance_held(
                    now, "not the leader any more: the move ledger was not written and nothing was moved"
                )
            try:
                ledger.write(reserved, state.moved_for)  # this pass's targets among them, as if every move is made
            except Exception as exc:
                return self._ledger_failed(now, exc)
        forget = getattr(self.cluster, "forget_pods", None)  # the scheduler extender's LatestSnapshot (app wiring)
        if plan.actions and callable(forget) and not self.dry_run:
            # The extender answers from the latest snapshot. A moved pod's replacement is scheduled within
            # milliseconds of its eviction, long before the next tick reads the cluster, and a view that still shows
            # the moved pod scores the node it left as busy as the one the plan expects it on (a tie the scheduler's
            # own spreading breaks towards the emptied node, and the waiting pod stays pending). So the view drops
            # the planned pods before the evictions go out; one that is not evicted after all is back at the next
            # tick's read.
            forget({(a.namespace, a.name) for a in plan.actions})
        if plan.actions:
            context = GuardContext(now, {}, tick.stale, None, self.acting_since)
            results = self.actuator.apply(plan.actions, context)
            report = TickReport(now, Plan(now))
            self.reporter.actions(results, report)
            errors = report.errors
        else:
            errors = []
        # A failed eviction may have been made all the same (a timeout after the API server committed it): it stays
        # counted, as a failed scale-down does against its rate policy; uncounted, a flaky API server would let every
        # pass evict past the hourly bound. Only the evictions known not made give their budget back.
        counted = {
            (r.action.namespace, r.action.name)
            for r in results
            if r.result in ("applied", "failed") and not isinstance(r.action, ScaleNodePool)
        }
        self.rebalance_state = record_pass(self.rebalance_state, state, plan, now, counted)
        if plan.actions and ledger is not None and not self.dry_run and len(counted) < len(plan.actions):
            # Evictions refused (a PodDisruptionBudget, a pod gone) moved nothing: give their budget back. If this
            # write fails the reservation stands, which only over-counts; so does a replica that lost the Lease
            # meanwhile, which writes nothing more (the new leader's own ledger writes are the ones that count).
            if not self.can_act():
                log.warning("rebalance: not the leader any more: the move ledger keeps this pass's reservation")
            else:
                try:
                    ledger.write(self.rebalance_state.move_times, self.rebalance_state.moved_for)
                except Exception as exc:
                    self.telemetry.error("rebalance")
                    log.warning("rebalance: could not correct the move ledger (it over-counts this pass): %s", exc)
        elif (
            not plan.actions
            and ledger is not None
            and not self.dry_run
            and set(ledger.targets()) - set(self.rebalance_state.moved_for)
            and self.can_act()
        ):
            # The pass forgot targets the ledger still holds (placed or gone, their wait over): written down, or the
            # next read would bring their passes back and a target waiting again would wait as if never placed.
            # Failing to write only keeps the longer wait: not an error of the pass.
            try:
                ledger.write(self.rebalance_state.move_times, self.rebalance_state.moved_for)
            except Exception as exc:
                self.telemetry.error("rebalance")
                log.warning("rebalance: could not drop the forgotten targets from the move ledger: %s", exc)
        self.telemetry.rebalance_passes.labels(result="ok").inc()
        if plan.ran:
            self.telemetry.stranded_gpus.set(plan.stranded_gpus)
        self.telemetry.rebalance_moves_last_hour.set(len(self.rebalance_state.move_times))
        self.telemetry.rebalance_held_seconds.set(put_back_hold(self.rebalance_state, now, config))
        for move in plan.moves:
            log.info("rebalance: move %s (%s): %s", move.owner, move.target, move.detail)
        for note in plan.notes:
            log.info("rebalance: %s", note)
        return RebalanceReport(now, plan, results=results, errors=errors, protected=protected)

    def _ledger_failed(self, now: float, exc: Exception) -> RebalanceReport:
        self.telemetry.error("rebalance")
        return self._rebalance_held(now, f"move ledger: {type(exc).__name__}: {exc}")

    def _rebalance_held(self, now: float, why: str) -> RebalanceReport:
        log.info("rebalance pass held: %s", why)
        self.telemetry.rebalance_passes.labels(result="held").inc()
        return RebalanceReport(now, None, result="held", held_because=why)

    def _hold(self, report: TickReport, component: str, exc: Exception) -> TickReport:
        report.result = "hold"
        report.held_by = component
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
        # what was written to or reported on objects gone since (a policy deleted, a pod gone) is forgotten
        self.reporter.forget_unlisted(objects, snapshot)

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
            # The Prometheus adapter maps pods to Deployments and counts unready pods from the snapshot.
            observation = self.metrics.observe(services, now, cluster=snapshot)
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

        # 4. decide (pure), with the forecast floors from the latest published fits (the refit job fits; never here)
        previous_state = self.state
        pool_nodes, pool_bounds = self._pool_nodes()
        tick = TickInput(now, observation, snapshot, policies, pool_nodes=pool_nodes, pool_bounds=pool_bounds)
        plan, state = self._decide_tick(tick, previous_state, report)
        report.plan = plan
        self.reporter.decisions(plan)
        self.reporter.capacity(plan)

        # 5. act
        context = GuardContext(now, policies, report.stale, metrics_error, self.acting_since)
        report.results = self.actuator.apply(plan.actions, context)
        self.reporter.actions(report.results, report)
        self.state = forget_unapplied(state, previous_state, report.results, now)

        # 6. report
        self.reporter.services(plan, policies, report)
        self.reporter.warnings(objects, report)
        if not self.dry_run and self.can_act():
            self.reporter.statuses(objects, policies, plan, report, now)
        if metrics_error is not None:
            report.result = "hold"
            report.held_by = "metrics_read"
            report.held_because = f"metrics_read: {metrics_error}"
        return report

    def _decide_tick(self, tick: TickInput, state: ControllerState, report: TickReport) -> tuple[Plan, ControllerState]:
        """``decide_tick`` with the latest published forecasts. Without a forecast reader, or when the forecasts
        cannot be read, every service scales reactively, which is always safe."""
        if self.forecasts is None:
            return self._decide(tick, state, TickConfig(capacity=self.capacity))
        try:
            config = TickConfig(forecast=self.forecasts.read_config(), capacity=self.capacity)
            plan, new_state = self._decide(replace(tick, forecasts=self.forecasts.published), state, config)
            self.forecasts.record_leads(plan.forecasts)
        except Exception as exc:
            log.exception("reading the forecasts failed; forecasting services hold this tick, the others scale")
            self.telemetry.error("decide")
            report.errors.append(f"forecast_read: {type(exc).__name__}: {exc}")
            # Without its fits, a forecasting service would read as "no forecast fitted yet" and run at the untrusted
            # share of its target: every earned service scaled up by a third (preempting training, buying nodes for
            # it) and back down once the read works. It holds instead, as before a term's first refit: the spec's
            # target, no scale-down. Reactive services are not concerned.
            holding = ForecastReadConfig(headroom=replace(DEFAULT_HEADROOM, hold_unfitted=True))
            return self._decide(tick, state, TickConfig(forecast=holding, capacity=self.capacity))
        report.forecasts = plan.forecasts
        report.floors = MappingProxyType({k: v.floor for k, v in plan.forecasts.items() if v.floor is not None})
        return plan, new_state

    # -- reading --

    def _pool_nodes(self) -> tuple[dict[str, int] | None, dict[str, tuple[int | None, int | None]] | None]:
        """Nodes per burst pool as the provider counts them (requested, not yet registered, included), and the
        (min, max) nodes the provider allows where it says (a ``bounds(pool)`` method, as the Cluster API adapter's:
        it clamps every write to them). A pool whose size cannot be read is left out: the arbitration then counts the
        snapshot's nodes of that pool; one whose bounds cannot be read is planned within its configured ones."""
        if self.capacity is None or self.node_pools is None or not self.capacity.pools:
            return None, None
        counts = {}
        bounds: dict[str, tuple[int | None, int | None]] = {}
        read_bounds = getattr(self.node_pools, "bounds", None)
        # both from one read where the provider can (the Cluster API adapter: one GET of the MachineDeployment)
        read_both = getattr(self.node_pools, "size_and_bounds", None)
        for pool in self.capacity.pools:
            if callable(read_both):
                try:
                    count, (low, high) = read_both(pool.name)
                except Exception as exc:
                    self.telemetry.error("node_pool")
                    log.warning("node pool %s: cannot read its size and min/max size: %s", pool.name, exc)
                    # the snapshot counts its nodes; the last bounds read stand (as below)
                    if pool.name in self._pool_bounds_read:
                        bounds[pool.name] = self._pool_bounds_read[pool.name]
                    continue
                counts[pool.name] = count
                bounds[pool.name] = self._pool_bounds_read[pool.name] = (low, high)
                continue
            try:
                counts[pool.name] = self.node_pools.node_count(pool.name)
            except Exception as exc:
                self.telemetry.error("node_pool")
                log.warning("node pool %s: cannot read its size: %s", pool.name, exc)
                continue
            if callable(read_bounds):
                try:
                    low, high = read_bounds(pool.name)
                    bounds[pool.name] = (low, high)
                    self._pool_bounds_read[pool.name] = (low, high)
                except Exception as exc:
                    self.telemetry.error("node_pool")
                    log.warning("node pool %s: cannot read its min/max size: %s", pool.name, exc)
                    # the last bounds read stand: falling back to the configured ones on every other failed read
                    # would alternate the plan between stopping training and a burst the provider clamps
                    if pool.name in self._pool_bounds_read:
                        bounds[pool.name] = self._pool_bounds_read[pool.name]
        return counts, bounds or None

    def _configure_queries(
        self, objects: Sequence[PolicyObject], policies: dict[str, ServicePolicy]
    ) -> list[PolicyObject]:
        """Hand the policies' PromQL overrides (spec.queries) to the metrics source; a policy whose
        override is rejected becomes invalid (the error names spec.queries.<field>) and the others keep working."""
        # the owner's overrides only: a duplicate on the same Deployment (reported invalid) steers nothing
        owners = self._owning_objects(objects, policies)
        wanted = {key: obj.queries for key, obj in owners.items() if obj.queries is not None}
        if wanted == self._queries:
            return []
        rejected: list[PolicyObject] = []
        for _ in range(len(wanted) + 1):
            try:
                self.metrics.set_service_queries(wanted)
                self._queries = dict(wanted)
                break
            except ValueError as exc:
                # The adapter names the service first: "<namespace>/<name>: spec.queries.<field>: <why>".
                key, _, why = str(exc).partition(": ")
                if key not in wanted:
                    log.error("metrics source rejected the query overrides: %s", exc)
                    break
                del wanted[key]
                rejected.append(replace(owners[key], policy=None, error=why))
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
        # An owner still listed whose spec is invalid now (a typo being fixed) keeps its Deployment: the Deployment
        # holds, and another policy on it stays a duplicate -- it must not take the Deployment over for one tick
        # and keep it once the owner is fixed
        invalid_now = {(o.namespace, o.name) for o in objects if o.policy is None}
        reserved = {key: ident for key, ident in previous.items() if ident in invalid_now}
        ordered = sorted(
            objects,
            key=lambda o: o.policy is None or previous.get(o.policy.key) != (o.namespace, o.name),
        )
        for obj in ordered:
            if obj.policy is None:
                invalid.append(obj)
                continue
            key = obj.policy.key
            if key in reserved:
                error = (
                    f"spec.targetRef.name: Deployment {obj.policy.name} is already scaled by {reserved[key][1]} "
                    "(whose spec is invalid now: the Deployment holds until it is fixed or deleted)"
                )
                invalid.append(replace(obj, policy=None, error=error))
                continue
            if key in valid:
                first = owner[key]
                error = f"spec.targetRef.name: Deployment {obj.policy.name} is already scaled by {first.name}"
                invalid.append(replace(obj, policy=None, error=error))
                continue
            valid[key] = obj.policy
            owner[key] = obj
        self._policy_owners = {**reserved, **{key: (obj.namespace, obj.name) for key, obj in owner.items()}}
        return valid, invalid

    def _owning_objects(
        self, objects: Sequence[PolicyObject], policies: Mapping[str, ServicePolicy]
    ) -> dict[str, PolicyObject]:
        """The object that owns each valid policy's Deployment (``_valid_policies``): its ``spec.queries`` and
        ``spec.adoptHpa`` are the ones that count, and Events about the service go to it. Another object naming that
        Deployment is a duplicate, reported invalid: last listed or not, it steers nothing."""
        return {
            obj.policy.key: obj
            for obj in objects
            if obj.policy is not None
            and obj.policy.key in policies
            and self._policy_owners.get(obj.policy.key) == (obj.namespace, obj.name)
        }

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
        by_key = self._owning_objects(objects, policies)
        out = dict(policies)
        for key, policy in policies.items():
            found = hpas_targeting(snapshot, policy.namespace, policy.name)
            obj = by_key.get(key)
            if obj is None:
                continue
            memo = (f"{POLICY_KIND}/{obj.namespace}/{obj.name}", "hpa")
            if not found:
                self.actuator.reported.pop(memo, None)
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
                self.actuator.event(where, "WaitingForHpaRemoval", message, "Normal", topic="hpa")
            else:
                message = (
                    f"{mark}not scaling deployment {key}: HorizontalPodAutoscaler {names} also scales it; delete "
                    f"the HPA, or set spec.adoptHpa to hand the Deployment over from it"
                )
                self.actuator.event(where, "HpaConflict", message, "Warning", topic="hpa")
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
                seen,
                spec_replicas=deployment.spec_replicas,
                ready_replicas=deployment.ready_replicas,
                status_replicas=deployment.status_replicas,
            )
        return Observation(now, merged, observation.gpus)
