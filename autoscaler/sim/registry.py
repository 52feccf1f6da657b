"""The simulator's policies by name: the one module that knows all of them.

It sits above ``policies`` (the baselines and the core's policy) and ``predictive`` (which builds on ``policies``),
so that neither imports the other back (issue 11: the ``policies`` <-> ``predictive`` cycle is gone, and an
import-linter ``layers`` contract keeps it so).
"""

from __future__ import annotations

from typing import Any

from autoscaler.sim.policies import CorePolicy, HpaBaseline, Oracle, SimPolicy, StaticPeak
from autoscaler.sim.predictive import PredictivePolicy

POLICY_NAMES = ("oracle", "predictive", "reactive", "hpa", "static")


def make_policy(
    name: str,
    hpa_target_utilization: float = 70.0,
    static_headroom: float = 1.0,
    forecasting: Any = None,
    node_boot_s: float = 0.0,
    metrics_delay_s: float = 0.0,
    hpa_behavior: bool = False,
) -> SimPolicy:
    if name == "predictive":
        return PredictivePolicy(forecasting, node_boot_s, metrics_delay_s)
    if name == "hpa":
        return HpaBaseline(hpa_target_utilization, behavior=hpa_behavior)
    if name == "reactive":
        return CorePolicy("reactive")
    if name == "static":
        return StaticPeak(static_headroom)
    if name == "oracle":
        return Oracle()
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
