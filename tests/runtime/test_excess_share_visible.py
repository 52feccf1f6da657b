"""The calibrated share of the forecast quantile's excess is visible where the earned headroom is (issue 14: the
state, the reason and the current headroom in ``autoscaler plan``, the GPUScalingPolicy status and a metric): the
floor's reason names it, ``status.lastForecast.excessShare`` and ``gpu_autoscaler_forecast_excess_share`` carry it."""

from __future__ import annotations

import pytest
from test_forecasting import DAY, DAY0, JUMP, PEAK, REFIT, TICK, World, forecast_settings, policy, series
from test_review42_calibrated import UPDATE, _run

from autoscaler.adapters.kubernetes.status import ForecastModel
from autoscaler.core.model import ForecastMode
from autoscaler.forecasting import ForecastService


def steady(t: float) -> float:
    return PEAK


def _world(**settings: object) -> World:
    """One active P99 service on steady noisy demand, its forecasts updated every minute (``last_value``'s P99
    over-covers it: a share below 1)."""
    world = World([policy(mode=ForecastMode.ACTIVE, quantile=0.99)], demand=steady)
    world.metrics.set_history("ml/chat", "request_rate", series(steady, DAY0, DAY0 + 4 * DAY, noise=1.0))
    world.service = ForecastService(
        forecast_settings(model="last_value", **settings), world.metrics, lambda: world.policies,
        refit_interval_s=REFIT, tick_interval_s=TICK, update_interval_s=UPDATE, telemetry=world.telemetry,
    )  # fmt: skip
    world.controller.forecasts = world.service
    return world


def test_the_share_reaches_the_status_and_the_metric() -> None:
    world = _world()
    end = _run(world.service, JUMP, 12)
    share = world.service.published["ml/chat"].excess_share
    assert share < 1.0  # last_value's P99 over-covered the steady noisy demand
    world.tick(end)
    view = world.controller.last_report.forecasts["ml/chat"]  # type: ignore[union-attr]
    assert view.excess_share == share and view.floor is not None and "calibrated:" in view.floor.detail
    assert world.sample("gpu_autoscaler_forecast_excess_share", namespace="ml", service="chat") == pytest.approx(share)
    status = world.status.status[("ml", "chat-policy")]["lastForecast"]
    assert status["excessShare"] == pytest.approx(round(share, 4))
    ForecastModel.model_validate(status)  # the CRD's schema takes it


def test_without_calibration_the_share_is_one() -> None:
    world = _world(calibrated_excess=False)
    end = _run(world.service, JUMP, 12)
    world.tick(end)
    view = world.controller.last_report.forecasts["ml/chat"]  # type: ignore[union-attr]
    assert view.excess_share == 1.0 and view.floor is not None and "calibrated" not in view.floor.detail
    assert world.sample("gpu_autoscaler_forecast_excess_share", namespace="ml", service="chat") == 1.0
