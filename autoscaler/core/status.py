"""What the controller hands to a GPUScalingPolicy status writer: pure records, no wire format.

The Kubernetes adapter (``autoscaler.adapters.kubernetes.status``) turns them into the status subresource
(``merge_status``); the condition types are the ones ``kubectl get`` / ``kubectl describe`` show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoscaler.core.model import Action, EvictPod, ResumeWorkload, ScaleDeployment, ScaleNodePool, SuspendWorkload

# Condition types (metav1.Condition ``type``), shown by ``kubectl get`` / ``kubectl describe``.
READY = "Ready"  # the policy is valid and its target was read this tick
METRICS_STALE = "MetricsStale"  # holding because metrics are missing or stale
AT_MAX_REPLICAS = "AtMaxReplicas"  # the recommendation was clamped to maxReplicas
INVALID_SPEC = "InvalidSpec"  # the spec failed validation; the message names the field
CONDITION_TYPES = (READY, METRICS_STALE, AT_MAX_REPLICAS, INVALID_SPEC)


@dataclass(frozen=True, slots=True)
class ConditionUpdate:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else ("True" if self.status else "False")


@dataclass(frozen=True, slots=True)
class LastAction:
    type: str
    reason: str
    message: str
    time: float
    detail: str = ""
    dry_run: bool = False
    from_replicas: int | None = None
    to_replicas: int | None = None

    @classmethod
    def from_action(cls, action: Action, now: float, *, dry_run: bool = False) -> LastAction:
        """The status record of a plan action: type, reason (machine and human) and detail."""
        from_r = to_r = None
        if isinstance(action, ScaleDeployment):
            from_r, to_r = action.previous_replicas, action.replicas
        elif isinstance(action, ScaleNodePool):
            from_r, to_r = action.previous_nodes, action.nodes
        assert isinstance(action, (ScaleDeployment, EvictPod, SuspendWorkload, ResumeWorkload, ScaleNodePool))
        return cls(
            type=type(action).__name__,
            reason=action.reason.value,
            message=action.reason.text,
            time=now,
            detail=action.detail,
            dry_run=dry_run,
            from_replicas=from_r,
            to_replicas=to_r,
        )


@dataclass(frozen=True, slots=True)
class ForecastRecord:
    time: float | None  # when the fit in force was made; None: no fit in force, only the headroom the tick ran at
    horizon_s: float
    quantile: float
    demand: float | None = None
    replicas: int | None = None
    model: str | None = None
    error: float | None = None
    pinball_ratio: float | None = None
    mode: str | None = None
    reliable: bool | None = None
    reason: str | None = None
    message: str | None = None
    headroom_state: str | None = None  # core.headroom.HeadroomState value
    headroom_ratio: float | None = None  # share of the spec's target the service runs at
    headroom_message: str | None = None
    # share of the quantile's excess over the median the floor provisions (calibrated excess; 1: the quantile)
    excess_share: float | None = None


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """Fields left as None are kept as they are; conditions are merged by type."""

    current_replicas: int | None = None
    desired_replicas: int | None = None
    last_action: LastAction | None = None
    last_forecast: ForecastRecord | None = None
    conditions: Sequence[ConditionUpdate] = ()
