"""The ``status`` of a GPUScalingPolicy: its wire format (pydantic, the CRD schema is generated from it) and the pure
merge of an update into the current status (conditions keep their ``lastTransitionTime`` unless they change).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.adapters.kubernetes._api import format_time

# The pure records callers hand to the writer live in the core; they are re-exported here.
from autoscaler.core.status import AT_MAX_REPLICAS as AT_MAX_REPLICAS
from autoscaler.core.status import CONDITION_TYPES as CONDITION_TYPES
from autoscaler.core.status import INVALID_SPEC as INVALID_SPEC
from autoscaler.core.status import METRICS_STALE as METRICS_STALE
from autoscaler.core.status import READY as READY
from autoscaler.core.status import ConditionUpdate as ConditionUpdate
from autoscaler.core.status import ForecastRecord as ForecastRecord
from autoscaler.core.status import LastAction as LastAction
from autoscaler.core.status import StatusUpdate as StatusUpdate

_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ConditionModel(_Wire):
    """metav1.Condition."""

    type: str = Field(
        min_length=1, max_length=316, description="condition type: Ready, MetricsStale, AtMaxReplicas, InvalidSpec"
    )
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=_REASON_PATTERN,
        description="machine-readable reason (the controller's Reason value)",
    )
    message: str = Field("", max_length=32768, description="human-readable detail")
    last_transition_time: str = Field(alias="lastTransitionTime", description="when status last changed (RFC 3339)")
    observed_generation: int | None = Field(None, alias="observedGeneration", ge=0)


class LastActionModel(_Wire):
    type: str = Field(description="ScaleDeployment, EvictPod, SuspendWorkload or ScaleNodePool")
    reason: str = Field(description="machine name of the reason (also the metric label)")
    message: str = Field("", description="the reason in words")
    detail: str = Field("", description="the numbers behind the decision")
    time: str = Field(description="when the action was taken (RFC 3339)")
    dry_run: bool = Field(False, alias="dryRun", description="true when only recommended (dry run / recommend-only)")
    from_replicas: int | None = Field(None, alias="fromReplicas", ge=0)
    to_replicas: int | None = Field(None, alias="toReplicas", ge=0)


class ForecastModel(_Wire):
    time: str | None = Field(
        None,
        description="when the forecast in force was made (RFC 3339); absent: no fit is in force (none yet, or "
        "withheld after a spec change), and the record says only the headroom the service runs at",
    )
    horizon_seconds: float = Field(alias="horizonSeconds", ge=0, description="how far ahead it looks, seconds")
    quantile: float = Field(gt=0, lt=1, description="forecast quantile provisioned for")
    demand: float | None = Field(None, description="forecast demand at the horizon, in the metric's unit")
    replicas: int | None = Field(None, ge=0, description="replicas the forecast asks for")
    model: str | None = Field(None, description="the forecaster that made it")
    error: float | None = Field(None, ge=0, description="its measured recent error (relative, 0.1 = 10 %)")
    pinball_ratio: float | None = Field(
        None, alias="pinballRatio", ge=0, description="recent pinball loss / the seasonal-naive baseline's"
    )
    mode: str | None = Field(None, description="shadow (reported, not applied) or active")
    reliable: bool | None = Field(None, description="false: its recent error is above the threshold (reactive only)")
    reason: str | None = Field(
        None, description="forecast_floor, forecast_unreliable or forecast_stale (the decision reason's value)"
    )
    message: str | None = Field(None, description="why, with the numbers")
    headroom_state: str | None = Field(
        None,
        alias="headroomState",
        description="active mode: how far the forecast has earned the spec's target: learning, earned, partial, "
        "degraded or untrusted",
    )
    headroom_ratio: float | None = Field(
        None, alias="headroomRatio", gt=0, le=1, description="the share of metric.target the service runs at"
    )
    headroom_message: str | None = Field(None, alias="headroomMessage", description="why, with the coverage")
    excess_share: float | None = Field(
        None,
        alias="excessShare",
        ge=0,
        le=1,
        description="the share of the forecast quantile's excess over the median the floor provisions: what the "
        "recent scores needed to cover that quantile (calibrated excess; 1 = the quantile as fitted)",
    )


class GPUScalingPolicyStatus(_Wire):
    observed_generation: int | None = Field(
        None, alias="observedGeneration", ge=0, description="the metadata.generation this status describes"
    )
    current_replicas: int | None = Field(None, alias="currentReplicas", ge=0, description="replicas now")
    desired_replicas: int | None = Field(None, alias="desiredReplicas", ge=0, description="replicas decided")
    last_scale_time: str | None = Field(None, alias="lastScaleTime", description="last time replicas were changed")
    last_action: LastActionModel | None = Field(None, alias="lastAction")
    last_forecast: ForecastModel | None = Field(None, alias="lastForecast")
    conditions: list[ConditionModel] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def merge_status(
    current: Mapping[str, Any] | None, update: StatusUpdate, *, generation: int | None, now: float
) -> dict[str, Any]:
    """The new ``status`` (plain JSON) from the current one and an update. Pure; the writer only skips the write
    when the result equals ``current``, so re-applying an update is a no-op."""
    status: dict[str, Any] = dict(current or {})
    if generation is not None:
        status["observedGeneration"] = generation
    if update.current_replicas is not None:
        status["currentReplicas"] = update.current_replicas
    if update.desired_replicas is not None:
        status["desiredReplicas"] = update.desired_replicas
    if update.last_action is not None:
        a = update.last_action
        record: dict[str, Any] = {"type": a.type, "reason": a.reason, "message": a.message, "time": format_time(a.time)}
        if a.detail:
            record["detail"] = a.detail
        if a.dry_run:
            record["dryRun"] = True
        if a.from_replicas is not None:
            record["fromReplicas"] = a.from_replicas
        if a.to_replicas is not None:
            record["toReplicas"] = a.to_replicas
        status["lastAction"] = record
        if not a.dry_run and a.to_replicas is not None and a.to_replicas != a.from_replicas:
            status["lastScaleTime"] = record["time"]
    if update.last_forecast is not None:
        f = update.last_forecast
        # written whole: a record without a fit (time None) drops the previous fit's fields
        forecast: dict[str, Any] = {"horizonSeconds": f.horizon_s, "quantile": f.quantile}
        if f.time is not None:
            forecast = {"time": format_time(f.time), **forecast}
        for key, value in (
            ("demand", f.demand),
            ("replicas", f.replicas),
            ("model", f.model),
            ("error", f.error),
            ("pinballRatio", f.pinball_ratio),
            ("mode", f.mode),
            ("reliable", f.reliable),
            ("reason", f.reason),
            ("message", f.message),
            ("headroomState", f.headroom_state),
            ("headroomRatio", f.headroom_ratio),
            ("headroomMessage", f.headroom_message),
            ("excessShare", f.excess_share),
        ):
            if value is not None:
                forecast[key] = value
        status["lastForecast"] = forecast
    if update.conditions:
        status["conditions"] = merge_conditions(
            status.get("conditions") or [], update.conditions, generation=generation, now=now
        )
    return status


def merge_conditions(
    current: Sequence[Mapping[str, Any]], updates: Sequence[ConditionUpdate], *, generation: int | None, now: float
) -> list[dict[str, Any]]:
    """meta.SetStatusCondition: ``lastTransitionTime`` moves only when ``status`` changes; order is stable."""
    merged = [dict(c) for c in current]
    for upd in updates:
        existing = next((c for c in merged if c.get("type") == upd.type), None)
        if existing is None:
            existing = {"type": upd.type}
            merged.append(existing)
        if existing.get("status") != upd.status_text or "lastTransitionTime" not in existing:
            existing["lastTransitionTime"] = format_time(now)
        existing["status"] = upd.status_text
        existing["reason"] = upd.reason
        existing["message"] = upd.message
        if generation is not None:
            existing["observedGeneration"] = generation
    return merged


def condition(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for cond in (status or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None
