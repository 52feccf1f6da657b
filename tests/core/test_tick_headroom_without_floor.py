"""core/tick.py read_forecasts, the `rate is None` branch: an ACTIVE forecasting service scaled on GPU utilisation
without spec.forecast.ratePerReplica can never get a forecast floor (the controller knows no per-replica
throughput), yet once its forecast is published and covers the demand, `_earned` gives it EARNED headroom (the full,
hot target) and the floor that carried the lead-time scale-down window is dropped.

Before any fit the same service runs at 0.75 x target with a scale-down window of at least the lead time (cold
start). Publishing a forecast that cannot be turned into replicas thus lowers a scale-down safeguard, and the
EARNED state contradicts core/headroom.py ("a hot target is only safe when a forecast floor supplies the headroom")
and _earned's docstring ("one the floor cannot use this tick ... earns nothing")."""

from __future__ import annotations

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.headroom import HeadroomState
from autoscaler.core.model import (
    ControllerState,
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    Observation,
    PodMetrics,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.predictive import ForecastInput
from autoscaler.core.tick import PublishedForecast, TickInput, decide_tick
from forecast.types import Forecast

NOW = 10_000.0
POLICY = ServicePolicy(
    namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.GPU_UTILIZATION, target=70.0,
    cold_start_s=600.0,  # lead 600 s > the spec's default 300 s scale-down window
    forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99),  # no ratePerReplica: no floor can be computed
)


def _published() -> PublishedForecast:
    values = [20.0] * 120
    forecast = Forecast(start=NOW - 60.0, step_s=60.0, quantiles={0.5: values, 0.99: values}, model="flat")
    return PublishedForecast(
        POLICY.key, ForecastInput(forecast, fitted_at=NOW - 60.0), "flat", 0.99, scored=200, coverage=0.999,
        coverage_samples=200,
    )


def _tick(published: PublishedForecast | None) -> tuple[int, object]:
    # 4 replicas at 20 % utilisation: reactive wants 2. Four replicas were recommended 400 s ago (inside a 600 s
    # lead-time window, outside the spec's 300 s one).
    obs = ServiceObservation(POLICY.key, 4, 4, pods=PodMetrics(4, 80.0))
    tick = TickInput(
        NOW, Observation(NOW, {POLICY.key: obs}), ClusterSnapshot(NOW), {POLICY.key: POLICY},
        {POLICY.key: published} if published else {},
    )
    state = ControllerState({POLICY.key: ServiceState(((NOW - 400.0, 4),))})
    plan, _ = decide_tick(tick, state)
    return plan.decisions[0].desired_replicas, plan.forecasts[POLICY.key]


def test_a_forecast_that_cannot_give_a_floor_does_not_lower_the_scale_down_window() -> None:
    without, _ = _tick(None)
    assert without == 4  # held: the scale-down window is at least the 600 s lead
    with_forecast, view = _tick(_published())
    assert with_forecast >= without, (
        f"published forecast (no floor possible) scaled down to {with_forecast}; without it the service held at "
        f"{without} (view: floor={view.floor}, headroom={view.headroom})"
    )


def test_no_floor_means_no_earned_headroom() -> None:
    _, view = _tick(_published())
    assert view.floor is None or not view.floor.usable
    assert view.headroom is not None
    assert view.headroom.state is not HeadroomState.EARNED, view.headroom
