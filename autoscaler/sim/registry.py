"""The simulator's policies by name: the one module that knows all of them.

It sits above ``policies`` (the baselines and the core's policy) and ``predictive`` (which builds on ``policies``),
so that neither imports the other back (issue 11: the ``policies`` <-> ``predictive`` cycle is gone, and an
import-linter ``layers`` contract keeps it so).
"""

from __future__ import annotations

from typing import Any

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.sim.policies import CorePolicy, HpaBaseline, Oracle, SimPolicy, StaticPeak
from autoscaler.sim.predictive import PredictivePolicy

POLICY_NAMES = ("oracle", "predictive", "reactive", "hpa", "static", "kube-preemption", "burst-only")
# Run by default on every scenario; the capacity baselines are added when the scenario has training.
DEFAULT_POLICIES = ("oracle", "predictive", "reactive", "hpa", "static")
CAPACITY_BASELINES = ("kube-preemption", "burst-only")


def default_policies(has_training: bool) -> tuple[str, ...]:
    return DEFAULT_POLICIES + (CAPACITY_BASELINES if has_training else ())


def make_policy(
    name: str,
    hpa_target_utilization: float = 70.0,
    static_headroom: float = 1.0,
    forecasting: Any = None,
    node_boot_s: float = 0.0,
    metrics_delay_s: float = 0.0,
    hpa_behavior: bool = False,
    capacity: CapacityConfig | None = None,
    forecast_workers: int = 0,
) -> SimPolicy:
    """A policy by name. ``capacity``: the controller's capacity arbitration for ``predictive`` and ``reactive``
    (None: they scale replicas only and the cluster's node autoscaler and scheduler preemption run beside them).
    ``kube-preemption`` and ``burst-only`` scale replicas as ``predictive`` does, without the arbitration: the
    kube-scheduler's pod-by-pod preemption plus a Cluster-Autoscaler-like node loop, or the node loop alone.
    ``forecast_workers``: processes that compute the forecasting policies' forecasts beside the run (0: in the run's
    own process; the figures are the same either way)."""
    if name == "predictive":
        return PredictivePolicy(forecasting, node_boot_s, metrics_delay_s, capacity, forecast_workers=forecast_workers)
    if name == "kube-preemption":
        return PredictivePolicy(
            forecasting, node_boot_s, metrics_delay_s, None, name, scheduler_preemption=True,
            forecast_workers=forecast_workers,
        )
    if name == "burst-only":
        return PredictivePolicy(
            forecasting, node_boot_s, metrics_delay_s, None, name, scheduler_preemption=False,
            forecast_workers=forecast_workers,
        )
    if name == "hpa":
        return HpaBaseline(hpa_target_utilization, behavior=hpa_behavior)
    if name == "reactive":
        return CorePolicy("reactive", capacity)
    if name == "static":
        return StaticPeak(static_headroom)
    if name == "oracle":
        return Oracle()
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
