"""Why the controller did (or did not do) something.

One enum, reused in plans, Kubernetes Events, logs and metric labels, so that a reason reads the same everywhere.
The value is the stable machine name (used as a metric label); ``text`` is the human sentence.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Reason attached to every decision and action."""

    # Reactive scaling
    METRIC_ABOVE_TARGET = "metric_above_target"
    METRIC_BELOW_TARGET = "metric_below_target"
    WITHIN_TOLERANCE = "within_tolerance"
    SLO_BREACH = "slo_breach"
    # Guard-rails that changed the recommendation
    SCALE_DOWN_STABILISED = "scale_down_stabilised"
    SCALE_UP_STABILISED = "scale_up_stabilised"
    SCALE_UP_RATE_LIMITED = "scale_up_rate_limited"
    SCALE_DOWN_RATE_LIMITED = "scale_down_rate_limited"
    AT_MIN_REPLICAS = "at_min_replicas"
    AT_MAX_REPLICAS = "at_max_replicas"
    # Holding because we cannot trust what we see
    METRICS_STALE = "metrics_stale"
    METRICS_PARTIAL = "metrics_partial"
    SCALING_DISABLED = "scaling_disabled"
    DECISION_FAILED = "decision_failed"
    # Predictive scaling
    FORECAST_FLOOR = "forecast_floor"
    FORECAST_UNRELIABLE = "forecast_unreliable"
    FORECAST_STALE = "forecast_stale"
    FORECAST_HOLD = "forecast_hold"
    FORECAST_MISSING = "forecast_missing"
    # Capacity arbitration, burst and rebalance (the actions of later issues share this enum)
    PREEMPT_FOR_INFERENCE = "preempt_for_inference"
    BURST_SCALE_UP = "burst_scale_up"
    BURST_SCALE_DOWN = "burst_scale_down"
    BURST_NODE_NOT_REGISTERED = "burst_node_not_registered"
    BURST_NODE_NOT_READY = "burst_node_not_ready"
    RESUME_TRAINING = "resume_training"
    REBALANCE = "rebalance"
    SCALE_DOWN_CHOICE = "scale_down_choice"
    # Baselines used by the simulator
    STATIC_PEAK = "static_peak"
    ORACLE = "oracle"

    @property
    def text(self) -> str:
        return _TEXT[self]


_TEXT: dict[Reason, str] = {
    Reason.METRIC_ABOVE_TARGET: "metric is above its target: scale up to bring it back to target",
    Reason.METRIC_BELOW_TARGET: "metric is below its target: scale down to bring it back to target",
    Reason.WITHIN_TOLERANCE: "metric is within tolerance of its target: keep the current replicas",
    Reason.SLO_BREACH: "latency is above the service's SLO: scale up even though the metric looks on target",
    Reason.SCALE_DOWN_STABILISED: "scale-down held back by the stabilisation window (highest recent recommendation)",
    Reason.SCALE_UP_STABILISED: "scale-up held back by the stabilisation window (lowest recent recommendation)",
    Reason.SCALE_UP_RATE_LIMITED: "scale-up limited by the scale-up rate policy",
    Reason.SCALE_DOWN_RATE_LIMITED: "scale-down limited by the scale-down rate policy",
    Reason.AT_MIN_REPLICAS: "recommendation clamped to the minimum replicas",
    Reason.AT_MAX_REPLICAS: "recommendation clamped to the maximum replicas",
    Reason.METRICS_STALE: "metrics are missing or stale: hold the current replicas (never read as zero)",
    Reason.METRICS_PARTIAL: (
        "metrics are incomplete (ready pods without a sample, or the SLO guard's latency missing): no scale-down; "
        "a scale-up on the fresh data still goes"
    ),
    Reason.SCALING_DISABLED: "the Deployment is scaled to zero by hand: autoscaling is disabled for it",
    Reason.DECISION_FAILED: (
        "the decision could not be computed from this service's spec and data (e.g. a target so small that it "
        "divides by zero): the current replicas are kept, the other services are decided as usual"
    ),
    Reason.FORECAST_FLOOR: "forecast demand at now + cold start needs more replicas: scale up ahead of demand",
    Reason.FORECAST_UNRELIABLE: "forecast error is above its threshold: reactive scaling only",
    Reason.FORECAST_HOLD: (
        "scale-down held: the forecast needs these replicas again before a replacement could serve, or would add "
        "them back within a cold start (longer while lower-priority GPU work waits to take them)"
    ),
    Reason.FORECAST_MISSING: "no forecast fitted yet (too little history): reactive scaling only",
    Reason.FORECAST_STALE: "the latest forecast is too old or does not reach now + lead time: reactive scaling only",
    Reason.PREEMPT_FOR_INFERENCE: "low-priority training preempted (whole gang) to free GPUs for inference",
    Reason.BURST_SCALE_UP: "cluster is short of GPUs: add burst nodes",
    Reason.BURST_SCALE_DOWN: "burst nodes no longer needed: give them back",
    Reason.BURST_NODE_NOT_REGISTERED: (
        "a burst node the provider counts never registered within the provision timeout: give it back (its Machine, "
        "not a running node) and back the pool off before growing it again"
    ),
    Reason.BURST_NODE_NOT_READY: (
        "a burst node registered but not ready within the provision timeout (no GPUs reported, its kubelet NotReady): "
        "give it back and back the pool off before growing it again"
    ),
    Reason.RESUME_TRAINING: (
        "GPUs taken from training are free again and the forecast keeps them free for the gang's minimum runtime: "
        "resume it"
    ),
    Reason.REBALANCE: "move GPU work to keep whole nodes free against fragmentation",
    Reason.SCALE_DOWN_CHOICE: (
        "a scale-down's replicas chosen while lower-priority GPU work waits: those on the nodes with the most free "
        "GPUs are marked with a low pod-deletion-cost, so that the ReplicaSet deletes them first and a whole node "
        "frees sooner (a mark of ours on a replica not chosen now is removed)"
    ),
    Reason.STATIC_PEAK: "static provisioning for the trace's peak",
    Reason.ORACLE: "oracle: provisioned for the known future demand at now + cold start",
}

assert set(_TEXT) == set(Reason), "every Reason needs its human text"
