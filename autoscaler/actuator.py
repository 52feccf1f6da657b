"""The actuator: turns a plan into port calls, the same for the controller and the simulator (issue 11).

For every action of a plan, in order:

1. **guard** (defence in depth: ``decide_tick`` already holds on stale data, this makes the rule independent of any
   future bug in it): an action that takes capacity away (a scale-down, an eviction, a suspension, fewer nodes) is
   held when the metrics could not be read this tick, when its service's metrics are stale, or -- for a scale-down --
   while the process has been acting for less than the service's scale-down window (a new leader has no
   stabilisation history);
2. **dry-run**: nothing is written but an Event marked ``[dry-run]`` (deduplicated: recommend-only plans repeat);
3. **leadership**: asked before every single action, so a Lease lost in the middle of a tick stops the rest, and
   handed to the writer and to the node-pool scaler as their ``can_write`` guard, which asks it again immediately
   before every request that changes something (the reads before a write may retry for longer than the Lease
   lasts): ``not_leader``;
4. **apply** through ``ClusterWriter`` / ``NodePoolScaler``; a failed write is reported, never raised (the next tick
   re-decides on fresh data); a PodDisruptionBudget's 429 is ``blocked``; a scale carries the replicas it was
   decided from (``expected_replicas``), and a Deployment somebody else scaled in the meantime is not written:
   ``skipped`` (never a conflict turning a scale-up into a scale-down); the writer says what it did, and a write
   that found its object already as wanted (a scale to the replicas it has, a suspension of a suspended workload, a
   resume of a running one, a pool at its size) is ``unchanged``, one whose object is not there any more (an
   eviction answered 404, or refused by its uid precondition because a new pod holds the name; a deleted
   workload) is ``gone``: nothing was written either way;
5. **record**: one ``ActionResult`` per action, in the plan's order, and a Normal Event on the object for every
   ``applied`` change -- only those: an ``unchanged`` or ``gone`` action gets none (an Event naming a gone pod
   would land on its successor of the same name), and an eviction's Event carries the evicted pod's uid.

The plan itself is checked first: an action repeating an earlier one on the same object is applied once, actions
doing different things to one object (a suspension and a resumption of a workload) none of them (``skipped``); a
node the plan gives back after stopping gangs for its replicas is given back only once those stops were made.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.core.model import (
    Action,
    ControllerState,
    EvictPod,
    ResumeWorkload,
    ScaleDeployment,
    ScaleNodePool,
    ServicePolicy,
    ServiceState,
    SetPodDeletionCost,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.ports import (
    ChangedSinceRead,
    ClusterWriter,
    DisruptionBudgets,
    EvictionOutcome,
    NodePoolScaler,
    PortError,
    WriteNotAllowed,
    WriteOutcome,
)

log = logging.getLogger("autoscaler")

DRY_RUN_MARK = "[dry-run] "
# the stale reason of a service whose Deployment was not found (``reporting.STALE_DEPLOYMENT_MISSING``)
DEPLOYMENT_MISSING = "deployment_not_found"


RESULTS = ("applied", "unchanged", "gone", "failed", "blocked", "held", "not_leader", "skipped", "dry_run")
"""Every ``ActionResult.result`` (and ``actions_total{result}``). Only ``applied`` wrote the change; ``unchanged`` (the
object was already as wanted) and ``gone`` (the object is not there any more, or another object holds its name)
wrote nothing, though what the action was for holds: ``DONE``."""
DONE = frozenset({"applied", "unchanged", "gone"})


@dataclass(slots=True)
class ActionResult:
    action: Action
    # applied | unchanged | gone | failed | blocked | held | not_leader | skipped | dry_run (``RESULTS``)
    result: str
    message: str = ""
    component: str | None = None  # for a failed write: cluster_write | node_pool


@dataclass(frozen=True, slots=True)
class GuardContext:
    """What the guard needs to know about this tick."""

    now: float
    policies: Mapping[str, ServicePolicy]
    stale: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # service key -> why its metrics are stale
    metrics_error: str | None = None  # the metrics read failed this tick
    acting_since: float | None = None  # when this process started acting (took the lease)


def event_reason(reason: Reason | str) -> str:
    """Event reasons are CamelCase by Kubernetes convention: ``metric_above_target`` -> ``MetricAboveTarget``."""
    value = reason.value if isinstance(reason, Reason) else reason
    return "".join(part.capitalize() for part in value.split("_"))


def _keyword_parameter(fn: Callable[..., object], name: str) -> tuple[bool, bool]:
    """(``fn`` has a keyword parameter ``name`` itself, ``fn`` takes ``**kwargs``); both False without a readable
    signature."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False, False
    if name in parameters:
        return parameters[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY), False
    return False, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def names_parameter(fn: Callable[..., object], name: str) -> bool:
    """Whether ``fn`` has a keyword parameter named ``name`` itself (``**kwargs`` does not count): for a keyword an
    implementation must understand, since one that ignores it does harm (``remove_unregistered``)."""
    return _keyword_parameter(fn, name)[0]


def takes_keyword(fn: Callable[..., object], name: str) -> bool:
    """Whether ``fn`` accepts the keyword argument ``name`` (a parameter of that name, or ``**kwargs``): a port's
    optional keyword added later is passed only to implementations that take it (provider plug-ins written
    before it keep working). A callable without a readable signature is called the old way."""
    named, var_keyword = _keyword_parameter(fn, name)
    return named or var_keyword


def action_kind(action: Action) -> str:
    return type(action).__name__


def action_target(action: Action) -> str:
    if isinstance(action, ScaleNodePool):
        return f"nodepool/{action.pool}"
    if isinstance(action, SuspendWorkload | ResumeWorkload):
        return f"{action.kind.lower()}/{action.namespace}/{action.name}"
    if isinstance(action, EvictPod | SetPodDeletionCost):
        return f"pod/{action.namespace}/{action.name}"
    return f"deployment/{action.namespace}/{action.name}"


def describe_action(action: Action) -> str:
    if isinstance(action, ScaleDeployment):
        return f"scale {action_target(action)} from {action.previous_replicas} to {action.replicas}"
    if isinstance(action, ScaleNodePool):
        removing = f" (removing node {action.remove_node})" if action.remove_node else ""
        if action.remove_unregistered:
            removing = " (removing a node that never registered)"
        return f"scale {action_target(action)} from {action.previous_nodes} to {action.nodes} nodes{removing}"
    if isinstance(action, EvictPod):
        gang = f" (gang {action.gang})" if action.gang else ""
        return f"evict {action_target(action)}{gang}"
    if isinstance(action, ResumeWorkload):
        return f"resume {action_target(action)}"
    if isinstance(action, SetPodDeletionCost):
        if action.cost is None:
            return f"remove the deletion-cost mark of {action_target(action)}"
        return f"mark {action_target(action)} with pod-deletion-cost {action.cost}"
    return f"suspend {action_target(action)}"


def is_destructive(action: Action) -> bool:
    """Actions that take capacity away; none of them may follow from data we could not read."""
    if isinstance(action, ScaleDeployment):
        return action.replicas < action.previous_replicas
    if isinstance(action, ScaleNodePool):
        return action.nodes < action.previous_nodes
    # Evictions and suspensions take capacity; a resume gives GPUs to training and takes none the forecast needs; a
    # deletion-cost mark only orders the replicas of a scale-down (which is guarded itself).
    return not isinstance(action, ResumeWorkload | SetPodDeletionCost)


def _nothing_written(action: Action, result: str) -> str:
    """Why an ``unchanged`` or ``gone`` action wrote nothing, for its result and log."""
    if result == "gone":
        if isinstance(action, EvictPod | SetPodDeletionCost):
            return (
                "the pod is gone already, or a new pod holds its name (not the uid the plan was made from); "
                "no Event names it"
            )
        if isinstance(action, SuspendWorkload | ResumeWorkload):
            return f"the {action.kind} does not exist"
        return f"the {'node pool' if isinstance(action, ScaleNodePool) else 'Deployment'} does not exist"
    if isinstance(action, ScaleDeployment):
        return f"the Deployment already has {action.replicas} replicas"
    if isinstance(action, SuspendWorkload):
        return f"the {action.kind} is already suspended (not by this action: not marked as ours)"
    if isinstance(action, ResumeWorkload):
        return f"the {action.kind} is already running"
    if isinstance(action, ScaleNodePool):
        return f"the pool is already at {action.nodes} nodes, or at the min/max bound it is clamped to"
    if isinstance(action, SetPodDeletionCost):
        return "the pod already carries no mark of ours" if action.cost is None else "the pod is already so marked"
    return "already done"


def _result_of(outcome: WriteOutcome | None) -> str:
    """The result of a write that says what it did; None (a writer that does not say: a node-pool provider plug-in
    written before ``WriteOutcome``, a test double): taken as written, as before."""
    if outcome is WriteOutcome.ALREADY:
        return "unchanged"
    if outcome is WriteOutcome.GONE:
        return "gone"
    return "applied"


def guard(action: Action, context: GuardContext) -> str | None:
    """Why a planned action must not be applied, or None."""
    if not is_destructive(action):
        return None
    if context.metrics_error is not None:
        return f"metrics unreadable this tick ({context.metrics_error})"
    if isinstance(action, ScaleDeployment):
        key = f"{action.namespace}/{action.name}"
        if context.stale.get(key):
            return f"metrics stale: {'; '.join(context.stale[key])}"
        policy = context.policies.get(key)
        # A new leader has no stabilisation history: the old leader's window may have been holding a scale-down
        # back. Wait one window after taking over, as if every recent recommendation had been "keep".
        if policy is not None and context.acting_since is not None:
            window = policy.scale_down.stabilisation_s
            acting = context.now - context.acting_since
            if acting < window:
                return f"takeover grace: acting for {acting:.0f}s < scale-down window {window:g}s"
    else:
        # a service whose Deployment does not exist has no pods and needs no GPUs: nothing uncertain about the
        # cluster's GPUs, so it holds only its own service (an orphan policy blocked every preemption, give-back and
        # move, tick after tick)
        unsure = [k for k, reasons in context.stale.items() if any(r != DEPLOYMENT_MISSING for r in reasons)]
        if unsure:
            return f"metrics stale for {len(unsure)} service(s)"
    return None


def _effect(action: Action) -> tuple[tuple[str, ...], object]:
    """What an action writes to, and what it does to it (two actions alike do the same). A resize is keyed by the
    size it was decided from too: two resizes from different sizes are a sequence the writer's precondition orders
    (the second is written only over the size it expects), not a contradiction."""
    if isinstance(action, EvictPod):
        return ("pod", action.namespace, action.name), "evict"
    if isinstance(action, SuspendWorkload | ResumeWorkload):
        return ("workload", action.kind, action.namespace, action.name), action_kind(action)
    if isinstance(action, ScaleDeployment):
        return ("deployment", action.namespace, action.name, str(action.previous_replicas)), action.replicas
    if isinstance(action, SetPodDeletionCost):
        return ("pod-deletion-cost", action.namespace, action.name), action.cost
    pool_effect = (action.nodes, action.remove_node, action.remove_unregistered)
    return ("pool", action.pool, str(action.previous_nodes)), pool_effect


def _contradictions(actions: Sequence[Action]) -> dict[int, str]:
    """The actions of a plan that are not applied because of the plan itself, by index, with why (``skipped``):

    - an action on an object an earlier one already does the same to (a pod evicted twice, a workload suspended
      twice, the same scale twice): applied once. The second would be reported applied for nothing written (a pod
      the first eviction removed answers 404), with a second Event and its lost work counted twice;
    - actions that do different things to the same object (a suspension and a resumption of a workload, a
      Deployment or a pool resized two ways from the same size): none of them. The plan contradicts itself --
      suspended then resumed, a training loses its pods and the work since its checkpoint for nothing; a scale-up
      that fails and a scale-down that goes through is a scale-down caused by an API error -- and the next tick
      re-plans on fresh data."""
    effects: dict[tuple[str, ...], set[object]] = {}
    for action in actions:
        target, effect = _effect(action)
        effects.setdefault(target, set()).add(effect)
    out: dict[int, str] = {}
    seen: dict[tuple[str, ...], int] = {}
    for index, action in enumerate(actions):
        target, _ = _effect(action)
        if len(effects[target]) > 1:
            if isinstance(action, SuspendWorkload | ResumeWorkload):
                what = f"both suspends and resumes {action_target(action)}"
            else:
                what = f"changes {action_target(action)} in {len(effects[target])} different ways"
            out[index] = f"the plan {what}: none of it is applied (the next tick re-plans on fresh data)"
        elif target in seen:
            out[index] = f"the plan names {describe_action(action)} twice: applied once (action {seen[target] + 1})"
        else:
            seen[target] = index
    return out


def _move_stops(action: Action) -> list[Action]:
    """The stops a node-pool scale-down was planned on (``ScaleNodePool.needs``: ``core.arbitrate``'s consolidation
    stops the gangs whose GPUs take the node's replicas and gives the node back in the same plan). Given back without
    them, the node's replicas would have nowhere to go."""
    if not isinstance(action, ScaleNodePool) or action.nodes >= action.previous_nodes:
        return []
    return list(action.needs)


def _for_a_scale_up(
    action: Action,
    results: Sequence[ActionResult | None],
    scale_ups: Mapping[str, int],
) -> str | None:
    """Why a stop (a preemption for a service) or a burst pool's growth must not go out: the scale-up of the
    service(s) it was planned for was not made (the write failed, was refused, held or skipped because the
    Deployment changed since the read). Stopping training or buying nodes for replicas that do not exist would be an
    API error causing a preemption; the next tick plans again from what is. None: it may go (no scale-up of its
    service in the plan -- its replicas were asked for earlier and wait for room -- or the scale-up was made or found
    made, or this is a dry run)."""
    if isinstance(action, EvictPod | SuspendWorkload):
        services: tuple[str, ...] = (action.service,) if action.service else ()
    elif isinstance(action, ScaleNodePool) and action.nodes > action.previous_nodes:
        services = action.services
    else:
        return None
    indices = [scale_ups[s] for s in services if s in scale_ups]
    if not indices:
        return None
    outcomes = [results[i] for i in indices]
    if any(r is None or r.result in ("applied", "unchanged", "dry_run") for r in outcomes):
        return None  # one service's replicas are real (or the scale is later in the plan: not gated)
    first = next(r for r in outcomes if r is not None)
    return (
        f"the scale-up of {', '.join(s for s in services if s in scale_ups)} it was planned for was not made "
        f"({first.result}: {first.message}): nothing stopped or bought for replicas that do not exist"
    )


def forget_unapplied(
    state: ControllerState, previous: ControllerState, results: Sequence[ActionResult], now: float
) -> ControllerState:
    """Take the scale events of actions that were not applied back out of the state: the rate policies must count
    only changes that happened (a failed write is retried next tick at full allowance). ``decide`` records this
    tick's change as an event stamped ``now``.

    ``unchanged`` is not applied either: nothing was written, the Deployment already had the replicas (somebody else
    put it there between the tick's read and the write, or a plan repeated a scale). The rate policies bound this
    controller's own changes, as the HPA's scale events record only the HPA's: a change somebody else made is seen by
    the next tick's read as the current replicas, the base of the next allowance (as for ``skipped``, a change to
    other replicas); counting it as ours would also throttle the next real change for a write that never was.
    A scale-down that ``failed`` is the exception: its outcome is unknown, so it stays counted.

    A burst pool's give-back (a scale-down of a node pool) that ``failed`` is recorded in the capacity state
    (``CapacityState.give_back_failed_at``): the arbitration gives back none of the pool's nodes again before its
    retry delay, instead of the same failing write every tick."""
    failed_pools = {
        r.action.pool
        for r in results
        if r.result == "failed" and isinstance(r.action, ScaleNodePool) and r.action.nodes < r.action.previous_nodes
    }
    if failed_pools:
        failed_at = dict(state.capacity.give_back_failed_at)
        failed_at.update({pool: now for pool in failed_pools})
        # The plan dropped the pool's spare timer with the give-back it planned; the node is still spare (since at
        # least the timer's start): kept, the give-back goes once the retry delay is over, not a cooldown later.
        unneeded = dict(state.capacity.burst_unneeded_since)
        for pool in failed_pools:
            unneeded.setdefault(pool, previous.capacity.burst_unneeded_since.get(pool, now))
        capacity = replace(state.capacity, give_back_failed_at=failed_at, burst_unneeded_since=unneeded)
        state = replace(state, capacity=capacity)
    unapplied = {
        f"{r.action.namespace}/{r.action.name}"
        for r in results
        if r.result != "applied"
        and isinstance(r.action, ScaleDeployment)
        # A scale-down whose write failed may have been committed all the same (a timeout, a connection lost after
        # the request went out): it stays counted. Counted once too often only slows the next scale-down; forgotten
        # while committed, the next tick's allowance would double the configured rate. A failed scale-up is
        # forgotten: retried at full allowance, as the SLO wants.
        and not (r.result == "failed" and r.action.replicas < r.action.previous_replicas)
    }
    # a scale applied this tick keeps its event whatever else the plan named for that Deployment (a repeat of it,
    # skipped by ``_contradictions``): the change happened
    unapplied -= {
        f"{r.action.namespace}/{r.action.name}"
        for r in results
        if r.result == "applied" and isinstance(r.action, ScaleDeployment)
    }
    if not unapplied:
        return state
    services = dict(state.services)
    for key in unapplied:
        if key in services:
            # the events as they were before this tick: its change is taken out, and an outdated event it was
            # written over (``hpa.store_scale_event``) is back (older ones the tick pruned count in no period)
            before = previous.services.get(key, ServiceState()).scale_events
            services[key] = replace(services[key], scale_events=before)
    return replace(state, services=services)


class Actuator:
    """Applies plans through the ports; keeps the memo that stops repeated Events."""

    def __init__(
        self,
        writer: ClusterWriter,
        node_pools: NodePoolScaler | None = None,
        *,
        dry_run: bool = False,
        can_act: Callable[[], bool] = lambda: True,
        on_error: Callable[[str], None] = lambda component: None,
        can_finish: Callable[[], bool] | None = None,
    ) -> None:
        self.writer = writer
        self.node_pools = node_pools
        self.dry_run = dry_run
        self.can_act = can_act
        # Asked instead of can_act for the evictions that complete a gang whose first pod is evicted: a shutdown must
        # not leave it half-evicted (its work is lost already, and the pods left running hold their GPUs for a job
        # that cannot progress); only the Lease may stop them. None: can_act.
        self.can_finish = can_finish if can_finish is not None else can_act
        self.on_error = on_error  # counts an error of a component (the controller's telemetry)
        self.reported: dict[tuple[str, str], str] = {}  # (object, topic) -> last event key, to not repeat events

    def apply_one(
        self, action: Action, context: GuardContext, *, write_guard: Callable[[], bool] | None = None
    ) -> ActionResult:
        allowed = write_guard if write_guard is not None else self.can_act
        text = f"{describe_action(action)}: {action.reason.text} ({action.detail})"
        blocked = guard(action, context)
        if blocked is not None:
            log.warning("held back: %s; because %s", describe_action(action), blocked)
            return ActionResult(action, "held", blocked)
        if self.dry_run:
            log.info("%s%s", DRY_RUN_MARK, text)
            # one Event while the recommendation stands: its detail (the tick's metric values) moves every tick, and
            # an Event per tick per service is what the memo is for (the Event's name is a digest of its message)
            self.event_for(
                action,
                f"{DRY_RUN_MARK}would {text}",
                dedupe=True,
                memo_key=f"{describe_action(action)}: {action.reason.text}",
            )
            return ActionResult(action, "dry_run", text)
        if not allowed():
            log.warning("not the leader any more: not applying %s", describe_action(action))
            return ActionResult(action, "not_leader", "lost the lease during the tick")
        try:
            result = self._write(action, allowed)
        except WriteNotAllowed as exc:
            # The writer asked can_act() again right before its request (after reads that may have retried for
            # longer than the Lease lasts) and was told no: nothing was sent.
            log.warning("not the leader any more: %s not applied: %s", describe_action(action), exc)
            return ActionResult(action, "not_leader", f"lost the lease before the write: {exc}")
        except ChangedSinceRead as exc:
            # Somebody else changed the object after this tick read it: the plan's premise is gone, nothing was
            # written, the next tick decides on fresh data. Not an error of ours.
            log.warning("skipped (changed since read): %s: %s", describe_action(action), exc)
            return ActionResult(action, "skipped", str(exc))
        except Exception as exc:
            component = "node_pool" if isinstance(action, ScaleNodePool) else "cluster_write"
            self.on_error(component)
            message = f"{type(exc).__name__}: {exc}"
            log.error("write failed (retried next tick): %s: %s", describe_action(action), message)
            return ActionResult(action, "failed", message, component)
        if result in ("unchanged", "gone"):
            # nothing written: no Event (the object may be another one of that name now), not counted as a change
            message = f"{describe_action(action)}: nothing written: {_nothing_written(action, result)}"
            log.info("%s: %s", result, message)
            return ActionResult(action, result, message)
        log.info("%s: %s", result, text)
        if result == "applied":
            # The Event tells of a write made: it goes while the Lease is held (can_finish), shutting down or not --
            # a gang evicted as the shutdown began (its last pods under can_finish) is told like any other
            self.event_for(action, text[0].upper() + text[1:], dedupe=False, write_guard=self.can_finish)
            if isinstance(action, SuspendWorkload) and action.service:
                # the service's own object says where its GPUs came from (an eviction: once per gang, in apply)
                self.service_event(action.service, action, text, write_guard=self.can_finish)
        return ActionResult(action, result, text)

    def service_event(
        self, service: str, action: Action, text: str, *, write_guard: Callable[[], bool] | None = None
    ) -> None:
        namespace, _, name = service.partition("/")
        self.event(
            ("Deployment", namespace, name),
            event_reason(action.reason),
            text[0].upper() + text[1:],
            "Normal",
            topic=None,
            write_guard=write_guard,
        )

    def apply(self, actions: Sequence[Action], context: GuardContext) -> list[ActionResult]:
        """One result per action, in the plan's order. A gang's evictions are applied together (whole or not at
        all) where its first one stands, wherever the others are in the plan, and its first eviction not made
        leaves it running; an action that repeats an earlier one on the same object, and actions that do different
        things to one object (a suspension and a resumption...), are ``skipped`` (``_contradictions``); a
        consolidation's node-pool scale-down goes after the stops it was planned on, ``skipped`` unless they were
        made (``_move_stops``)."""
        results: list[ActionResult | None] = [None] * len(actions)
        for index, why in _contradictions(actions).items():
            results[index] = ActionResult(actions[index], "skipped", why)
        # the plan's scale-ups, by service: the stops and node-pool growth planned for a service's new replicas go
        # out only once its scale-up was made (``_for_a_scale_up``)
        scale_ups = {
            f"{a.namespace}/{a.name}": i
            for i, a in enumerate(actions)
            if isinstance(a, ScaleDeployment) and a.replicas > a.previous_replicas
        }
        # a node given back by a consolidation goes after the stops it was planned on, and only if they were made
        dependent = {i: stops for i, a in enumerate(actions) if (stops := _move_stops(a))}
        for index, action in enumerate(actions):
            if results[index] is not None:
                continue
            why_not = _for_a_scale_up(action, results, scale_ups)
            if why_not is not None:
                if isinstance(action, EvictPod) and action.gang:
                    # the gang's other evictions wherever they are in the plan: whole or not at all
                    for i in range(index, len(actions)):
                        other = actions[i]
                        if results[i] is None and isinstance(other, EvictPod) and other.gang == action.gang:
                            results[i] = ActionResult(other, "skipped", why_not)
                else:
                    results[index] = ActionResult(action, "skipped", why_not)
                log.warning("skipped: %s: %s", describe_action(action), why_not)
                continue
            if index in dependent:
                # in its place once its stops are done (core.arbitrate puts them first): a scale-down moved after the
                # plan's other writes would remove a node that a replica scaled up meanwhile may just have landed on
                if all(results[i] is not None for i, a in enumerate(actions) if a in dependent[index]):
                    results[index] = self._after_stops(action, dependent[index], results, context)
                continue
            if isinstance(action, EvictPod) and action.gang:
                members = [
                    i
                    for i, other in enumerate(actions)
                    if i >= index and results[i] is None and isinstance(other, EvictPod) and other.gang == action.gang
                ]
                gang = self._apply_gang([a for a in (actions[i] for i in members) if isinstance(a, EvictPod)], context)
                for i, result in zip(members, gang, strict=True):
                    results[i] = result
                continue
            results[index] = self.apply_one(action, context)
        for index, stops in dependent.items():
            if results[index] is None:  # a stop it needs came after it in the plan
                results[index] = self._after_stops(actions[index], stops, results, context)
        done = [r for r in results if r is not None]
        told: set[str] = set()
        for result in done:
            action = result.action
            if not isinstance(action, EvictPod) or result.result != "applied":
                continue
            if action.service and action.gang and action.gang not in told:
                told.add(action.gang)
                # under can_finish, as the evictions were: a gang finished during a shutdown is told too
                self.service_event(
                    action.service, action, f"evicted gang {action.gang}: {action.detail}", write_guard=self.can_finish
                )
        return done

    def _after_stops(
        self,
        action: Action,
        stops: Sequence[Action],
        results: Sequence[ActionResult | None],
        context: GuardContext,
    ) -> ActionResult:
        """A node-pool scale-down planned on stops (``_move_stops``): applied only when all of them were made. A stop
        found done already (a pod ``gone``, a workload ``unchanged``: suspended by someone else) counts as made: its
        GPUs are free either way."""
        made = {action_target(r.action) for r in results if r is not None and r.result in DONE | {"dry_run"}}
        missing = sorted({action_target(a) for a in stops} - made)
        if missing and guard(action, context) is None:
            why = f"not given back: the stops its move needs were not made ({', '.join(missing)})"
            log.warning("skipped: %s: %s", describe_action(action), why)
            return ActionResult(action, "skipped", why)
        return self.apply_one(action, context)

    def _apply_gang(self, evictions: Sequence[EvictPod], context: GuardContext) -> list[ActionResult]:
        """A gang's evictions, whole or not at all: each is first asked as a dry run (the API server checks the
        PodDisruptionBudgets and changes nothing); one refused, or one the guard holds, and none is made. A pod of
        the gang already gone (``gone``: 404, or a successor holds its name) is done, not a failure: the others are
        evicted, and the gang counts as stopped whole once every pod is ``applied`` or ``gone``."""
        gang = evictions[0].gang
        held = next((why for why in (guard(a, context) for a in evictions) if why is not None), None)
        if held is not None:
            log.warning("held back: evict gang %s (%d pods); because %s", gang, len(evictions), held)
            return [ActionResult(a, "held", held) for a in evictions]
        if self.dry_run:
            return [self.apply_one(a, context) for a in evictions]
        if not self.can_act():
            # Not each pod's own apply_one: can_act may say yes again a moment later (the Lease renewed), and the
            # gang would then go pod by pod, past its budget check and dry runs -- a refusal after the first breaks it
            message = f"lost the lease during the tick: gang {gang} left running"
            log.warning("not the leader any more: %s", message)
            return [ActionResult(a, "not_leader", message) for a in evictions]
        short = self._budget_short(evictions)
        if short is not None:
            kind, message = short
            if kind == "failed":
                self.on_error("cluster_write")
                log.error("%s", message)
                return [ActionResult(a, "failed", message, "cluster_write") for a in evictions]
            log.info("%s", message)
            return [ActionResult(a, "blocked", message) for a in evictions]
        for action in evictions:
            try:
                outcome = self.writer.evict_pod(
                    action.namespace, action.name, dry_run=True, can_write=self.can_act, uid=action.uid
                )
            except WriteNotAllowed as exc:
                message = f"gang {gang} left running: lost the lease before its dry-run evictions: {exc}"
                log.warning("%s", message)
                return [ActionResult(a, "not_leader", message) for a in evictions]
            except Exception as exc:
                self.on_error("cluster_write")
                pod = f"{action.namespace}/{action.name}"
                message = f"gang {gang} left running: dry-run eviction of {pod} failed: {exc}"
                log.error("%s", message)
                return [ActionResult(a, "failed", message, "cluster_write") for a in evictions]
            if outcome is EvictionOutcome.BLOCKED:
                message = (
                    f"gang {gang} left running: the eviction of {action.namespace}/{action.name} would be refused "
                    "(PodDisruptionBudget)"
                )
                log.info("%s", message)
                return [ActionResult(a, "blocked", message) for a in evictions]
        results: list[ActionResult] = []
        stopped = 0  # evictions made (``applied``); a pod found gone was not stopped by us
        for position, action in enumerate(evictions):
            # past the first eviction made the gang is broken: the rest go while the Lease allows, stopping or not
            result = self.apply_one(action, context, write_guard=self.can_finish if stopped else None)
            results.append(result)
            if result.result == "applied":
                stopped += 1
            elif result.result != "gone" and not stopped:
                # Nothing is stopped yet (the pods before it, if any, were gone already) and this eviction was not
                # made (an API error, a budget spent since the dry run, the Lease lost): the gang is as it was, so it
                # stays running (an API error never causes a preemption, nor breaks a gang). The others are not sent.
                message = (
                    f"gang {gang} left running: the eviction of {action.namespace}/{action.name} was not made "
                    f"({result.result}): {result.message}"
                )
                log.warning("%s", message)
                result.message = message
                return results + [
                    ActionResult(a, result.result, message, result.component) for a in evictions[position + 1 :]
                ]
        done = sum(1 for r in results if r.result in ("applied", "gone"))
        if stopped and done < len(results):
            # A budget changed between the dry run and the eviction: the gang is broken either way; the next
            # tick's plan sees the pods left and stops them (its work is already lost).
            log.warning("gang %s partly stopped: %d of %d pods evicted", gang, stopped, len(results))
            for r in results:
                if r.result not in ("applied", "gone"):
                    r.message = f"gang {gang} partly stopped ({stopped} of {len(results)} pods): {r.message}"
        return results

    def _budget_short(self, evictions: Sequence[EvictPod]) -> tuple[str, str] | None:
        """Why the gang may not go as a whole under a PodDisruptionBudget covering several of its pods, read now
        (("blocked", why): one allows fewer disruptions than the gang's pods it covers; ("failed", why): the budgets
        could not be read), or None. The dry-run evictions check each pod alone and spend nothing, so two pods under
        a budget that allows one both pass, and the real evictions then stop the first and are refused the second:
        the gang broken. Writers that cannot read budgets (``DisruptionBudgets``) leave it to the dry runs."""
        shared = {budget: covered for budget, covered in evictions[0].budgets if covered > 1}
        if not shared or not isinstance(self.writer, DisruptionBudgets):
            return None
        gang = evictions[0].gang
        allowed: dict[str, int] = {}
        try:
            for namespace in sorted({budget.partition("/")[0] for budget in shared}):
                allowed.update(
                    {f"{namespace}/{name}": n for name, n in self.writer.disruptions_allowed(namespace).items()}
                )
        except Exception as exc:
            return "failed", f"gang {gang} left running: its PodDisruptionBudgets could not be read: {exc}"
        for budget, covered in sorted(shared.items()):
            now = allowed.get(budget)
            if now is not None and now < covered:
                return "blocked", (
                    f"gang {gang} left running: PodDisruptionBudget {budget} allows {now} disruption(s) now, fewer "
                    f"than the {covered} pods of the gang it covers"
                )
        return None

    def _write(self, action: Action, guard: Callable[[], bool]) -> str:
        """The write, and its result: ``applied``, or what the writer says it found instead (``_result_of``)."""
        if isinstance(action, ScaleDeployment):
            return _result_of(
                self.writer.scale_deployment(
                    action.namespace,
                    action.name,
                    action.replicas,
                    expected_replicas=action.previous_replicas,
                    can_write=guard,
                )
            )
        if isinstance(action, EvictPod):
            outcome = self.writer.evict_pod(action.namespace, action.name, can_write=guard, uid=action.uid)
            if outcome is EvictionOutcome.BLOCKED:
                return "blocked"  # 429 from a PodDisruptionBudget means "not now": the next tick re-plans
            return "gone" if outcome is EvictionOutcome.GONE else "applied"
        if isinstance(action, SuspendWorkload):
            return _result_of(self.writer.suspend_workload(action.kind, action.namespace, action.name, can_write=guard))
        if isinstance(action, ResumeWorkload):
            return _result_of(self.writer.resume_workload(action.kind, action.namespace, action.name, can_write=guard))
        if isinstance(action, SetPodDeletionCost):
            return _result_of(
                self.writer.set_pod_deletion_cost(
                    action.namespace, action.name, action.cost, uid=action.uid, can_write=guard
                )
            )
        if self.node_pools is None:
            raise RuntimeError("no node-pool scaler is configured")
        # the size the plan counted: a pool resized since (or counted from its registered nodes because its size could
        # not be read) is not written over (``ChangedSinceRead``: skipped)
        options: dict[str, Any] = {"expected": action.previous_nodes}
        if action.remove_node is not None:
            # a scale-down only: a scale-up stays the call a provider plug-in written before remove_node knows
            options["remove_node"] = action.remove_node
        if action.remove_unregistered:
            if not names_parameter(self.node_pools.scale, "remove_unregistered"):
                # A provider plug-in written before it would shrink the pool by a node of its own choosing: one that
                # takes **options to survive new keywords too (ignored, this one deletes a possibly busy node)
                raise PortError(
                    f"node-pool provider {type(self.node_pools).__name__} cannot remove a node that never registered "
                    f"(its scale() takes no remove_unregistered): pool {action.pool} not scaled down"
                )
            options["remove_unregistered"] = True
            if action.unregistered_min_age_s > 0 and takes_keyword(self.node_pools.scale, "unregistered_min_age_s"):
                # a plug-in written before it gives back the oldest Machine without a Node, as it always did
                options["unregistered_min_age_s"] = action.unregistered_min_age_s
        if takes_keyword(self.node_pools.scale, "can_write"):
            # asked by the provider before each of its requests (a resize reads, marks, re-lists, writes the size...)
            options["can_write"] = guard
        # else: a provider plug-in written before the guard; ``apply_one`` asked ``can_act`` right before this call
        return _result_of(self.node_pools.scale(action.pool, action.nodes, **options))

    def event_for(
        self,
        action: Action,
        message: str,
        dedupe: bool,
        *,
        memo_key: str | None = None,
        write_guard: Callable[[], bool] | None = None,
    ) -> None:
        uid = None
        if isinstance(action, ScaleDeployment):
            obj = ("Deployment", action.namespace, action.name)
        elif isinstance(action, EvictPod):
            obj = ("Pod", action.namespace, action.name)
            uid = action.uid  # the pod the plan meant: the Event never lands on a successor of the same name
        elif isinstance(action, SuspendWorkload | ResumeWorkload):
            obj = (action.kind, action.namespace, action.name)
        else:
            # node pools are cluster-scoped provider objects; a deletion-cost mark is one per replica of a
            # scale-down, told by the scale's own Event: log and metric only
            return
        self.event(
            obj,
            event_reason(action.reason),
            message,
            "Normal",
            topic="action" if dedupe else None,
            uid=uid,
            memo_key=memo_key,
            write_guard=write_guard,
        )

    def event(
        self,
        obj: tuple[str, str, str],
        reason: str,
        message: str,
        event_type: str,
        topic: str | None,
        *,
        uid: str | None = None,
        memo_key: str | None = None,
        write_guard: Callable[[], bool] | None = None,
    ) -> None:
        """Emit an Event; with a ``topic``, only when it differs from the last one of that topic on that object
        (dry-run and recommend-only plans repeat every tick and would flood the API): compared on ``memo_key`` when
        given (what the Event is about, without the numbers that move every tick), else on the message. ``uid``: the
        object's uid the Event is about (passed to the writer only when known). ``write_guard``: asked instead of
        ``can_act`` (``can_finish`` for the Events of a gang finished during a shutdown)."""
        allowed = write_guard if write_guard is not None else self.can_act
        if not allowed():
            # An Event is a write like any other: a replica that is not sure it leads (the Lease lost or not renewed
            # within the deadline mid-tick) writes none. Not remembered as written: the leader's next tick writes it.
            log.info("not the leader any more: Event %s on %s %s/%s not written", reason, *obj)
            return
        memo = (f"{obj[0]}/{obj[1]}/{obj[2]}", topic) if topic is not None else None
        if memo is not None:
            remembered = f"{reason}|{memo_key if memo_key is not None else message}"
            if self.reported.get(memo) == remembered:
                return
            self.reported[memo] = remembered
        options: dict[str, Any] = {"uid": uid} if uid else {}
        try:
            self.writer.emit_event(obj[0], obj[1], obj[2], reason, message, event_type, can_write=allowed, **options)
        except WriteNotAllowed:
            log.info("not the leader any more: Event %s on %s %s/%s not written", reason, *obj)
            if memo is not None:
                self.reported.pop(memo, None)  # the leader's next tick writes it
        except Exception as exc:
            self.on_error("event_write")
            log.warning("event not written (%s %s/%s %s): %s", obj[0], obj[1], obj[2], reason, exc)
            if memo is not None:
                self.reported.pop(memo, None)  # try again next tick
