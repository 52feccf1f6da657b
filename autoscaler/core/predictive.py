"""Predictive scaling, the pure part: turn the latest demand forecast into a replica floor at now + lead time.

The floor only ever raises the reactive recommendation (``decide_service``); scale-down stays on the reactive path and
its stabilisation window. A forecast that is too old, whose horizon does not reach now + lead, or whose recent error
is above its threshold is not used: the service scales reactively and the decision says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autoscaler.core.decide import ReplicaFloor
from autoscaler.core.hpa import ceil_replicas
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.core.reasons import Reason
from forecast.types import Forecast


@dataclass(frozen=True, slots=True)
class ForecastInput:
    """The latest fit of one service's demand (request rate, requests/s), as the refit job published it."""

    forecast: Forecast
    fitted_at: float  # Unix seconds when the fit finished (a refit, or an update that re-conditioned it)
    reliable: bool = True  # False when recent forecast error is above the threshold (see forecast.assess_reliability)
    reliability_detail: str = ""
    # Unix seconds when the model's parameters were last fitted (a refit); an update re-conditions them on newer data
    # but cannot renew them, so a fit's age for staleness counts from here. None: ``fitted_at`` (a refit's own).
    refitted_at: float | None = None

    @property
    def refit_time(self) -> float:
        """When the parameters were fitted: the time a fit's age (``stale_after_periods``) is counted from."""
        return self.fitted_at if self.refitted_at is None else self.refitted_at


@dataclass(frozen=True, slots=True)
class PredictiveSettings:
    """How a service uses its forecast."""

    rate_per_replica: float  # requests/s one replica should carry (the reactive target when scaling on request rate)
    quantile: float = 0.9  # forecast quantile provisioned for
    refit_period_s: float = 3600.0  # how often the refit job runs, seconds
    max_fit_age_periods: float = 3.0  # a fit older than this many refit periods is stale
    shadow: bool = False  # report the floor, do not apply it
    # scale-down accounts for the cost of coming back: never below what the forecast needs within the lead time,
    # and without a usable forecast a stabilisation window of at least the lead time
    cold_start_aware: bool = True
    # ... from now to now + this many lead times (1: until a replica asked for now could serve; 2: also the replicas
    # the floor of a tick within the next lead time would add back -- a scale-down undone within its cold start),
    # lead times
    hold_leads: float = 2.0
    # and, while lower-priority GPU work waits for GPUs, what it needs this many seconds further (up to the
    # forecast's end), as ``ReplicaFloor.contended_hold``: a GPU given back goes to that work at once, and taking it
    # back before the work's next checkpoint loses what it did since the last one
    contended_hold_s: float = 0.0


MEDIAN_LEVEL = 0.5  # the level a provisioned quantile's excess is measured from (calibrated_excess)

# The share of a replica's saturation throughput a utilisation-less signal (queue depth) is provisioned at.
DEFAULT_UTILISATION = 0.7


def rate_per_replica(policy: ServicePolicy, throughput_per_replica: float | None = None) -> float | None:
    """Requests/s one replica should carry at the forecast, the one rule for the controller and the simulator:
    ``spec.forecast.ratePerReplica`` when set, else the target of a request-rate policy; else, when the replica's
    saturation throughput is known (the simulator knows it, the controller does not), the utilisation target's share
    of it (``DEFAULT_UTILISATION`` for a queue-depth policy). None: no floor can be computed."""
    if policy.forecast is not None and policy.forecast.rate_per_replica is not None:
        return policy.forecast.rate_per_replica
    if policy.metric is MetricKind.REQUEST_RATE:
        return policy.target
    if throughput_per_replica is None:
        return None
    if policy.metric is MetricKind.GPU_UTILIZATION:
        return throughput_per_replica * policy.target / 100.0
    if policy.metric is MetricKind.ENGINE_ACTIVE:
        return throughput_per_replica * policy.target
    return throughput_per_replica * DEFAULT_UTILISATION


def lead_time_s(
    configured_cold_start_s: float,
    observed_cold_starts_s: Sequence[float] = (),
    node_boot_s: float = 0.0,
    needs_new_nodes: bool = False,
    min_observations: int = 5,
) -> float:
    """Seconds between asking for a replica and it serving: the p95 of observed pod bind-to-ready times (nearest
    rank) once there are ``min_observations`` of them, else the configured estimate; plus node boot when the
    replica needs capacity that is not there yet."""
    cold_start = configured_cold_start_s
    if len(observed_cold_starts_s) >= min_observations:
        ordered = sorted(observed_cold_starts_s)
        cold_start = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return cold_start + (node_boot_s if needs_new_nodes else 0.0)


# provisioned_input's last answers by the identity of the fit they narrowed: a fit is published once a minute and read
# at every tick in between (the simulator's 15 s ticks built the same narrowed Forecast four times: 5 % of its run)
_NARROWED: dict[tuple[int, float, float], tuple[ForecastInput, ForecastInput]] = {}
_NARROWED_KEPT = 64  # entries, about two per service (the fit being read and the one before)


def provisioned_input(latest: ForecastInput, quantile: float, excess_share: float) -> ForecastInput:
    """The fit the floor reads: its ``quantile`` level narrowed to the median plus ``excess_share`` of its excess
    over it (``core.headroom.calibrated_excess``: the share the measured coverage needed), the levels between the
    two dropped. The fit itself when the share is 1, or when the fit lacks the median or the level (then the floor
    says why, as it always did)."""
    if excess_share >= 1.0:
        return latest
    key = (id(latest), quantile, excess_share)
    kept = _NARROWED.get(key)
    if kept is not None and kept[0] is latest:  # the same object (its id cannot be reused while it is kept here)
        return kept[1]
    narrowed = _narrowed(latest, quantile, excess_share)
    if len(_NARROWED) >= _NARROWED_KEPT:
        _NARROWED.clear()
    _NARROWED[key] = (latest, narrowed)
    return narrowed


def _narrowed(latest: ForecastInput, quantile: float, excess_share: float) -> ForecastInput:
    forecast = latest.forecast
    median = forecast.quantiles.get(MEDIAN_LEVEL)
    upper = forecast.quantiles.get(quantile)
    if median is None or upper is None or quantile <= MEDIAN_LEVEL:
        return latest  # nothing to narrow between: the floor reads (and says) the fit as it is
    share = max(0.0, excess_share)
    narrowed = tuple(m + share * max(0.0, u - m) for m, u in zip(median, upper, strict=True))
    # the levels between say nothing calibrated (and could cross the narrowed one): dropped
    levels = {lv: v for lv, v in forecast.quantiles.items() if not MEDIAN_LEVEL < lv < quantile}
    levels[quantile] = narrowed
    calibrated = Forecast(forecast.start, forecast.step_s, levels, forecast.model)
    return replace(latest, forecast=calibrated)


def forecast_floor(
    policy: ServicePolicy,
    latest: ForecastInput | None,
    settings: PredictiveSettings,
    now: float,
    lead_s: float,
    window_s: float = 0.0,
) -> ReplicaFloor | None:
    """The replicas the forecast asks for at ``now + lead_s`` (peak over ``window_s`` after it), or an unusable
    floor saying why the forecast is not used. None when the service has no forecast at all."""
    if latest is None:
        return None
    # Without a usable forecast a scale-down waits at least a lead time (cold start) of lower recommendations.
    down_window = 0.0 if settings.shadow or not settings.cold_start_aware else lead_s
    max_age = settings.max_fit_age_periods * settings.refit_period_s
    age = now - latest.refit_time
    if age > max_age:
        why = f"fit is {age:.0f}s old (limit {max_age:.0f}s)"
        return ReplicaFloor(0, Reason.FORECAST_STALE, why, usable=False, down_window_s=down_window)
    if not latest.reliable:
        return ReplicaFloor(
            0, Reason.FORECAST_UNRELIABLE, latest.reliability_detail, usable=False, down_window_s=down_window
        )
    target_time = now + lead_s
    forecast = latest.forecast
    if not forecast.covers(target_time):
        return ReplicaFloor(
            0,
            Reason.FORECAST_STALE,
            f"forecast horizon ends at {forecast.end:.0f}, before now + lead {target_time:.0f}",
            usable=False,
            down_window_s=down_window,
        )
    demand = forecast.max_over(target_time, target_time + window_s, settings.quantile)
    replicas = _replicas(demand, policy, settings)
    hold = contended = 0
    contended_end = target_time
    hold_window_s = lead_s
    if settings.cold_start_aware:
        # The demand between now and the floor's own window: a replica needed again before it could be ready.
        # ... or wanted back within its cold start (``hold_leads`` 2): the floor of a tick up to a lead time from now
        # reads the demand up to a lead time after that tick, so a replica removed now that the forecast wants by
        # now + 2 leads is added back before a replacement could even have started (issue 14 item 2).
        hold_window_s = max(lead_s, min(settings.hold_leads * lead_s, forecast.end - now))
        hold = max(
            replicas, _replicas(forecast.max_over(now, now + hold_window_s, settings.quantile), policy, settings)
        )
        contended_end = max(target_time, min(target_time + settings.contended_hold_s, forecast.end))
        if contended_end > target_time:
            contended = max(hold, _replicas(forecast.max_over(now, contended_end, settings.quantile), policy, settings))
    detail = (
        f"{forecast.model} P{settings.quantile * 100:g} forecast {demand:.4g} req/s at now+{lead_s:.0f}s "
        f"/ {settings.rate_per_replica:g} per replica"
    )
    return ReplicaFloor(
        replicas, Reason.FORECAST_FLOOR, detail, shadow=settings.shadow, hold=hold, hold_window_s=hold_window_s,
        contended_hold=contended, contended_window_s=contended_end - now,
    )


def _replicas(demand: float, policy: ServicePolicy, settings: PredictiveSettings) -> int:
    replicas = ceil_replicas(max(demand, 0.0) / settings.rate_per_replica - 1e-9)
    return min(max(replicas, policy.min_replicas), policy.max_replicas)
