"""Policies compared by the simulator. All see the same observation and cluster snapshot each tick and return one
``Plan`` for every service, which the controller's own actuator (``autoscaler.actuator``) applies to the simulated
cluster. ``reactive`` and ``predictive`` are the controller's tick (``autoscaler.core.tick.decide_tick``) with
different settings; ``hpa`` goes through the same core HPA arithmetic; ``static`` and ``oracle`` are the bounds.

- ``hpa``: the Kubernetes HPA v2 on GPU utilisation (target 70 % by default), default behaviour: the baseline most
  clusters run today. It goes through the same core HPA arithmetic, with the SLO guard off.
- ``reactive``: this project's reactive policy, as the service's GPUScalingPolicy spec says (its own metric and
  target, the SLO guard, stale-data holds).
- ``static``: replicas for the trace's peak from the first step (what teams do when they give up on autoscaling).
- ``oracle``: knows the whole trace; at every tick it asks for the fewest replicas that meet the latency SLO over
  the next cold start (the physical limit: it still waits for pods to load).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autoscaler.actuator import ActionResult, forget_unapplied
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    ControllerState,
    MetricKind,
    Observation,
    Plan,
    ScaleDecision,
    ScaleDeployment,
    ServicePolicy,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.tick import PublishedForecast, TickConfig, TickInput, decide_tick
from autoscaler.sim.latency import replicas_needed


def metrics_delay_steps(metrics_delay_s: float, step_s: float) -> int:
    """Whole steps the policies' metrics lag the demand: rounded up (a delay is never shortened; rounding half to
    even made the default 30 s delay at 60 s steps no delay at all)."""
    return max(0, math.ceil(metrics_delay_s / step_s - 1e-9))


@dataclass(frozen=True)
class SimService:
    """Everything the simulator knows about one service (static during a run)."""

    policy: ServicePolicy  # from the scenario's GPUScalingPolicy spec
    rates: np.ndarray  # requests/s per step
    throughput: float  # requests/s per replica at saturation
    base_latency_s: float
    slo_s: float
    quantile: float  # the latency quantile the SLO applies to
    forecast_quantile: float = 0.9  # demand quantile the predictive policy provisions for
    # What its request-rate metric counts (``simulation.requestRateCounts``): finished requests, at most what the
    # ready replicas serve, as the controller's default counter does (True); or the arrivals (False)
    rate_counts_finished: bool = True
    # What its forecasts learn from (``simulation.forecastLearnsFrom``): the arrivals (False), or the finished
    # requests, at most what the ready replicas served (True), as the controller's history of its default counter
    forecast_learns_finished: bool = False

    def need(self, rate: float) -> int:
        """Fewest replicas meeting the SLO at ``rate``, within the policy's bounds (none for no demand when
        ``minReplicas`` is 0: no request, no latency to meet)."""
        return replicas_needed(
            rate, self.throughput, self.base_latency_s, self.slo_s, self.quantile,
            self.policy.min_replicas, self.policy.max_replicas,
        )


class SimPolicy:
    """A policy the simulator can run: initial replicas, then one plan per tick for all services."""

    name = "base"
    # The controller's guard-rails that come with acting as the controller (the takeover grace after start-up)
    # apply to the project's policies, not to the baselines.
    is_controller = False
    # The cluster around the policy: a Cluster-Autoscaler-like node loop for Pending pods, and the kube-scheduler's
    # DefaultPreemption. A policy that arbitrates capacity itself turns both off (its inference PriorityClass has
    # preemptionPolicy: Never, and it owns the burst pools).
    node_autoscaler = True
    scheduler_preemption = True
    # The controller's rebalancer (issue 15) runs beside this policy when the scenario enables it: the controller's
    # own policies (``predictive``, ``reactive``), not the baselines.
    rebalances = False

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        """Prepare for a run; returns the initial (ready) replicas of each service."""
        self.services = services
        self.step_s = step_s
        return [min(max(s.need(float(s.rates[0])), s.policy.min_replicas), s.policy.max_replicas) for s in services]

    def begin(self, seen_rates: Sequence[np.ndarray], start: float, steps: int) -> None:
        """Called once before the first step: ``seen_rates[s][i]``, the request rate service ``s``'s observation
        carries at step ``i`` (the demand a metrics delay earlier; it does not depend on the policy)."""

    def end(self) -> None:
        """Called once after the last step (a policy with helpers running beside the run stops them)."""

    def metric(self, index: int) -> MetricKind:
        """The signal this policy scales service ``index`` on (what the observation must carry)."""
        return self.services[index].policy.metric

    def plan(self, step: int, now: float, observation: Observation, snapshot: ClusterSnapshot) -> Plan:
        raise NotImplementedError

    def guarded_policies(self) -> Mapping[str, ServicePolicy]:
        """The policies the actuator's guard reads (scale-down windows for the takeover grace)."""
        return {s.policy.key: s.policy for s in self.services}

    def applied(self, plan: Plan, results: Sequence[ActionResult]) -> None:
        """What the actuator made of the plan (the controller takes unapplied changes out of its state)."""


def replica_plan(
    now: float, services: Sequence[SimService], observation: Observation, desired: Sequence[tuple[int, Reason]]
) -> Plan:
    """A plan that sets each service's replicas: what a baseline that is not the controller would do."""
    decisions, actions = [], []
    for service, (replicas, reason) in zip(services, desired, strict=True):
        policy = service.policy
        seen = observation.services.get(policy.key)
        current = seen.spec_replicas if seen is not None else 0
        decisions.append(ScaleDecision(policy.key, current, replicas, reason, ""))
        if replicas != current:
            actions.append(ScaleDeployment(policy.namespace, policy.name, replicas, current, reason, ""))
    return Plan(now, tuple(decisions), tuple(actions))


class CorePolicy(SimPolicy):
    """The controller's tick: ``decide_tick`` over every service's ServicePolicy, through the same state."""

    is_controller = True

    def __init__(self, name: str, capacity: CapacityConfig | None = None) -> None:
        self.name = name
        self.capacity = capacity
        self.rebalances = name in ("predictive", "reactive")
        if capacity is not None:
            self.node_autoscaler = False
            self.scheduler_preemption = False

    def policy_for(self, service: SimService) -> ServicePolicy:
        # Without forecasts (the reactive column) a spec.forecast has nothing to read.
        return dataclasses.replace(service.policy, forecast=None)

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        self.policies = {s.policy.key: self.policy_for(s) for s in services}
        self.metrics = [self.policies[s.policy.key].metric for s in services]
        self.throughputs = {s.policy.key: s.throughput for s in services}
        self.state = ControllerState()
        self.previous_state = self.state
        self.tick_config = TickConfig(capacity=self.capacity)
        initial = super().reset(services, step_s)
        # within the bounds this policy runs with (the HPA baseline's minimum of 1)
        bounds = [self.policies[s.policy.key] for s in services]
        return [min(max(r, p.min_replicas), p.max_replicas) for r, p in zip(initial, bounds, strict=True)]

    def metric(self, index: int) -> MetricKind:
        return self.metrics[index]

    def guarded_policies(self) -> Mapping[str, ServicePolicy]:
        return self.policies

    def forecasts(self, step: int, now: float, observation: Observation) -> dict[str, PublishedForecast]:
        return {}

    def plan(self, step: int, now: float, observation: Observation, snapshot: ClusterSnapshot) -> Plan:
        tick = TickInput(now, observation, snapshot, self.policies, self.forecasts(step, now, observation),
                         self.throughputs)
        self.previous_state = self.state
        plan, self.state = decide_tick(tick, self.state, self.tick_config)
        return plan

    def applied(self, plan: Plan, results: Sequence[ActionResult]) -> None:
        self.state = forget_unapplied(self.state, self.previous_state, results, plan.time)


class HpaBaseline(CorePolicy):
    """The Kubernetes HPA v2 on GPU utilisation, no SLO guard. By default an HPA without a ``behavior`` block, as most
    HPAs in the wild are: scale-up at most max(2 x current, 4) per sync, the 300 s scale-down window, no rate limit.
    ``behavior=True`` gives it the defaulted behavior block instead (max(+4 pods, +100 %) per 15 s)."""

    is_controller = False

    def __init__(self, target_utilization: float = 70.0, behavior: bool = False) -> None:
        super().__init__("hpa")
        self.target_utilization = target_utilization
        self.behavior = behavior

    def policy_for(self, service: SimService) -> ServicePolicy:
        return dataclasses.replace(
            service.policy,
            # an HPA on a resource metric (GPU utilisation is per pod) has a minimum of 1: with no pod there is no
            # sample to scale back up on (minReplicas 0 needs an Object or External metric, and a feature gate)
            min_replicas=max(1, service.policy.min_replicas),
            metric=MetricKind.GPU_UTILIZATION,
            target=self.target_utilization,
            scale_up=DEFAULT_SCALE_UP,
            scale_down=DEFAULT_SCALE_DOWN,
            behavior=self.behavior,
            slo_guard=False,
            forecast=None,
        )


class StaticPeak(SimPolicy):
    name = "static"

    def __init__(self, headroom: float = 1.0) -> None:
        self.headroom = headroom

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        super().reset(services, step_s)
        self.replicas = [
            min(s.policy.max_replicas, math.ceil(s.need(float(s.rates.max())) * self.headroom)) for s in services
        ]
        return list(self.replicas)

    def plan(self, step: int, now: float, observation: Observation, snapshot: ClusterSnapshot) -> Plan:
        return replica_plan(now, self.services, observation, [(r, Reason.STATIC_PEAK) for r in self.replicas])


class Oracle(SimPolicy):
    """Provisions at decision time for the worst step until the new pods are ready.

    A decision at the end of step i creates pods that are ready from step i + 1 + L (L = cold start in steps), so
    asking for max(need[i+1 .. i+1+L]) keeps ready >= need at every step, given GPUs; the simulator removes the
    newest pods first on a scale-down, so the pods that are about to be ready are the last to go.
    """

    name = "oracle"

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        super().reset(services, step_s)
        self.targets: list[np.ndarray] = []
        initial = []
        for service in services:
            rates = service.rates
            need = np.fromiter((service.need(float(r)) for r in rates), dtype=np.int64, count=len(rates))
            lead_steps = math.ceil(service.policy.cold_start_s / step_s)
            self.targets.append(_forward_window_max(need, lead_steps + 1))
            initial.append(int(need[: lead_steps + 1].max()))
        return initial

    def plan(self, step: int, now: float, observation: Observation, snapshot: ClusterSnapshot) -> Plan:
        desired = [(int(t[min(step + 1, len(t) - 1)]), Reason.ORACLE) for t in self.targets]
        return replica_plan(now, self.services, observation, desired)


def _forward_window_max(values: np.ndarray, window: int) -> np.ndarray:
    """out[i] = max(values[i : i + window]) (shorter at the end), in O(n log window) with numpy."""
    out = values.copy()
    span = 1
    while span < window:
        step = min(span, window - span)
        shifted = np.empty_like(out)
        shifted[:-step] = out[step:]
        shifted[-step:] = out[-step:]
        np.maximum(out, shifted, out=out)
        span += step
    return out
