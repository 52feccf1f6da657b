"""A scale-down never removes a replica the forecast wants back within its cold start (stop 47, issue 14 item 2).

The scale-down hold read the forecast from now to now + lead: a replica needed before a replacement asked for now
could serve. The floor of each tick reads the demand at that tick + lead, so a replica removed now that the forecast
wants at now + lead + 60 s was removed, and the tick 60 s later added it back -- a scale-down undone within its cold
start (the simulator's "scale-downs undone within a cold start": 350 of the default scenario's 3,136). The hold now
reads up to ``hold_leads`` lead times from now (``forecast.scale_down_hold_leads``, default 2; the simulator's
``forecast.scaleDownHoldLeads``), as far as the forecast reaches.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.decide import decide_service
from autoscaler.core.model import (
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.predictive import ForecastInput, PredictiveSettings, forecast_floor
from forecast.types import Forecast

CHAT = ServicePolicy(
    namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=3.2,
    cold_start_s=90.0, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99), priority=1000,
)  # fmt: skip


def _dip(minutes_low: int, steps: int = 30) -> Forecast:
    """32 req/s in minute 0 (10 replicas at 3.2), 16 req/s (5) for ``minutes_low`` minutes, 32 again after."""
    values = [32.0] + [16.0] * minutes_low + [32.0] * (steps - 1 - minutes_low)
    return Forecast(start=0.0, step_s=60.0, quantiles={0.5: values, 0.99: values}, model="dip")


@pytest.mark.parametrize(
    ("minutes_low", "hold_leads", "now", "hold", "window"),
    [
        # at now = 60 s, lead 90 s: the floor reads minute 2 (16 req/s: 5 replicas); minute 3 is back at 32
        pytest.param(2, 1.0, 60.0, 5, 90.0, id="one lead: the hold sees only the dip, 5"),
        pytest.param(2, 2.0, 60.0, 10, 180.0, id="two leads: the 32 at minute 3 is within reach, 10"),
        # a dip of 5 minutes: at now = 60 s, two leads reach minute 4 only -- still in the dip, the scale-down goes
        pytest.param(5, 2.0, 60.0, 5, 180.0, id="a longer dip: two leads see no rise, 5"),
        pytest.param(5, 4.0, 60.0, 10, 360.0, id="four leads reach the rise at minute 6, 10"),
        # the forecast ends at 1,800 s: the hold reads no further
        pytest.param(2, 10.0, 1500.0, 10, 300.0, id="past the forecast's end: cut there"),
    ],
)
def test_the_hold_reads_up_to_hold_leads_lead_times(
    minutes_low: int, hold_leads: float, now: float, hold: int, window: float
) -> None:
    settings = PredictiveSettings(3.2, 0.99, refit_period_s=1e9, hold_leads=hold_leads)
    floor = forecast_floor(CHAT, ForecastInput(_dip(minutes_low), 0.0), settings, now, 90.0)
    assert floor is not None and floor.usable
    assert (floor.hold, floor.hold_window_s) == (hold, window)


def test_without_cold_start_awareness_nothing_is_held() -> None:
    settings = PredictiveSettings(3.2, 0.99, refit_period_s=1e9, cold_start_aware=False, hold_leads=2.0)
    floor = forecast_floor(CHAT, ForecastInput(_dip(2), 0.0), settings, 60.0, 90.0)
    assert floor is not None and floor.hold == 0


def _ticks(hold_leads: float) -> list[int]:
    """The replicas written at each tick (15 s) over the dip of ``_dip(2)``, from 10 replicas, with a metric that
    follows the demand and no scale-down window: the hold alone decides when replicas go."""
    policy = dataclasses.replace(CHAT, scale_down=dataclasses.replace(CHAT.scale_down, stabilisation_s=0.0))
    forecast = _dip(2)
    settings = PredictiveSettings(3.2, 0.99, refit_period_s=1e9, hold_leads=hold_leads)
    state, replicas, written = ServiceState(), 10, []
    for tick in range(4, 17):  # 60 s to 240 s
        now = tick * 15.0
        demand = forecast.quantiles[0.5][int(now // 60)]
        floor = forecast_floor(policy, ForecastInput(forecast, 0.0), settings, now, 90.0)
        obs = ServiceObservation(policy.key, replicas, replicas, request_rate=demand, metric_total=demand)
        decision, state = decide_service(policy, obs, state, now, floor)
        replicas = decision.desired_replicas
        written.append(replicas)
    return written


def test_over_ticks_one_lead_scales_down_and_back_two_leads_holds() -> None:
    one, two = _ticks(1.0), _ticks(2.0)
    assert min(one) < 10 and one[-1] == 10  # down in the dip, and back before minute 3's rise: undone
    assert two == [10] * len(two)
