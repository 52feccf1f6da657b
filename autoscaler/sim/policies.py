"""Policies compared by the simulator. All see the same observations; ``hpa`` and ``reactive`` (and later
``predictive``) decide through the project's pure core, ``static`` and ``oracle`` are the bounds.

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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscaler.core.decide import decide_service
from autoscaler.core.model import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    MetricKind,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.reasons import Reason
from autoscaler.sim.latency import replicas_needed


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

    def need(self, rate: float) -> int:
        """Fewest replicas meeting the SLO at ``rate``, within the policy's bounds."""
        return replicas_needed(
            rate, self.throughput, self.base_latency_s, self.slo_s, self.quantile,
            max(self.policy.min_replicas, 1), self.policy.max_replicas,
        )


class SimPolicy:
    """A policy the simulator can run: initial replicas, then one decision per service per tick."""

    name = "base"

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        """Prepare for a run; returns the initial (ready) replicas of each service."""
        self.services = services
        self.step_s = step_s
        return [min(max(s.need(float(s.rates[0])), s.policy.min_replicas), s.policy.max_replicas) for s in services]

    def metric(self, index: int) -> MetricKind:
        """The signal this policy scales service ``index`` on (what the observation must carry)."""
        return self.services[index].policy.metric

    def decide(self, index: int, step: int, now: float, obs: ServiceObservation) -> tuple[int, Reason]:
        raise NotImplementedError


class CorePolicy(SimPolicy):
    """Decides through ``autoscaler.core.decide.decide_service`` with one ServicePolicy per service."""

    def __init__(self, name: str) -> None:
        self.name = name

    def policy_for(self, service: SimService) -> ServicePolicy:
        return service.policy

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        self.policies = [self.policy_for(s) for s in services]
        self.states = [ServiceState() for _ in services]
        return super().reset(services, step_s)

    def metric(self, index: int) -> MetricKind:
        return self.policies[index].metric

    def decide(self, index: int, step: int, now: float, obs: ServiceObservation) -> tuple[int, Reason]:
        decision, self.states[index] = decide_service(self.policies[index], obs, self.states[index], now)
        return decision.desired_replicas, decision.reason


class HpaBaseline(CorePolicy):
    """The Kubernetes HPA v2 on GPU utilisation, no SLO guard. By default an HPA without a ``behavior`` block, as most
    HPAs in the wild are: scale-up at most max(2 x current, 4) per sync, the 300 s scale-down window, no rate limit.
    ``behavior=True`` gives it the defaulted behavior block instead (max(+4 pods, +100 %) per 15 s)."""

    def __init__(self, target_utilization: float = 70.0, behavior: bool = False) -> None:
        super().__init__("hpa")
        self.target_utilization = target_utilization
        self.behavior = behavior

    def policy_for(self, service: SimService) -> ServicePolicy:
        return dataclasses.replace(
            service.policy,
            metric=MetricKind.GPU_UTILIZATION,
            target=self.target_utilization,
            scale_up=DEFAULT_SCALE_UP,
            scale_down=DEFAULT_SCALE_DOWN,
            behavior=self.behavior,
            slo_guard=False,
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

    def decide(self, index: int, step: int, now: float, obs: ServiceObservation) -> tuple[int, Reason]:
        return self.replicas[index], Reason.STATIC_PEAK


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

    def decide(self, index: int, step: int, now: float, obs: ServiceObservation) -> tuple[int, Reason]:
        targets = self.targets[index]
        following = min(step + 1, len(targets) - 1)
        return int(targets[following]), Reason.ORACLE


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
