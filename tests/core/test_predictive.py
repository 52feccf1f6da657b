"""The forecast floor: lead time, staleness, reliability, shadow mode, and that it only raises."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.decide import decide_service
from autoscaler.core.model import MetricKind, ServiceObservation, ServicePolicy, ServiceState
from autoscaler.core.predictive import ForecastInput, PredictiveSettings, forecast_floor, lead_time_s
from autoscaler.core.reasons import Reason
from forecast.types import Forecast

POLICY = ServicePolicy(namespace="ml", name="chat", min_replicas=1, max_replicas=40,
                       metric=MetricKind.REQUEST_RATE, target=2.5)
SETTINGS = PredictiveSettings(rate_per_replica=2.5, quantile=0.9, refit_period_s=600.0)


def ramp_forecast(start: float = 0.0) -> Forecast:
    # 60 s steps, P50 10 -> 69 req/s, P90 20 % higher
    median = [10.0 + i for i in range(60)]
    return Forecast(start=start, step_s=60.0, quantiles={0.5: median, 0.9: [v * 1.2 for v in median]}, model="hw")


@pytest.mark.parametrize(
    ("observed", "boot", "needs_nodes", "expected"),
    [
        ((), 0.0, False, 90.0),  # configured estimate
        ((60.0, 61.0, 62.0, 63.0), 0.0, False, 90.0),  # too few observations
        ((60.0, 61.0, 62.0, 63.0, 200.0), 0.0, False, 200.0),  # nearest-rank p95 of 5 is the largest
        (tuple(float(x) for x in range(1, 101)), 0.0, False, 95.0),
        ((), 300.0, True, 390.0),  # plus node boot when capacity must be added
        ((), 300.0, False, 90.0),
    ],
)
def test_lead_time(observed: tuple[float, ...], boot: float, needs_nodes: bool, expected: float) -> None:
    assert lead_time_s(90.0, observed, boot, needs_nodes) == expected


def test_floor_reads_the_quantile_at_now_plus_lead() -> None:
    floor = forecast_floor(POLICY, ForecastInput(ramp_forecast(), fitted_at=0.0), SETTINGS, now=600.0, lead_s=90.0)
    assert floor is not None and floor.usable and floor.reason is Reason.FORECAST_FLOOR
    # now + lead = 690 s -> step 11 -> P90 = 21 * 1.2 = 25.2 req/s -> ceil(25.2 / 2.5) = 11
    assert floor.replicas == 11
    assert "P90 forecast 25.2 req/s at now+90s" in floor.detail


def test_floor_clamped_to_bounds() -> None:
    small = dataclasses.replace(POLICY, max_replicas=5)
    floor = forecast_floor(small, ForecastInput(ramp_forecast(), 0.0), SETTINGS, 600.0, 90.0)
    assert floor is not None and floor.replicas == 5


@pytest.mark.parametrize(
    ("latest", "now", "reason", "text"),
    [
        (ForecastInput(ramp_forecast(), fitted_at=0.0), 1801.0, Reason.FORECAST_STALE, "old (limit 1800s)"),
        (ForecastInput(ramp_forecast(), 0.0, reliable=False, reliability_detail="pinball 1.4x naive"), 60.0,
         Reason.FORECAST_UNRELIABLE, "pinball 1.4x naive"),
        (ForecastInput(ramp_forecast(), fitted_at=3500.0), 3550.0, Reason.FORECAST_STALE, "horizon ends"),
    ],
)
def test_unusable_forecasts_fall_back_to_reactive(latest: ForecastInput, now: float, reason: Reason, text: str) -> None:
    floor = forecast_floor(POLICY, latest, SETTINGS, now, 90.0)
    assert floor is not None and not floor.usable and floor.reason is reason and text in floor.detail
    obs = ServiceObservation("ml/chat", 4, 4, metric_total=10.0)
    decision, _ = decide_service(POLICY, obs, ServiceState(), now, floor)
    assert decision.desired_replicas == 4  # reactive: 10 / 2.5 = 4
    assert decision.reason is Reason.WITHIN_TOLERANCE
    assert "reactive only" in decision.detail and text in decision.detail


def test_no_forecast_is_no_floor() -> None:
    assert forecast_floor(POLICY, None, SETTINGS, 0.0, 90.0) is None


def test_forecast_raises_but_never_lowers_and_scale_down_stays_stabilised() -> None:
    latest = ForecastInput(ramp_forecast(), 0.0)
    state = ServiceState()
    obs = ServiceObservation("ml/chat", 20, 20, metric_total=50.0)  # reactive wants 20
    floor = forecast_floor(POLICY, latest, SETTINGS, 0.0, 90.0)  # forecast wants ceil(12*1.2/2.5) = 6
    assert floor is not None and floor.replicas == 6
    decision, state = decide_service(POLICY, obs, state, 0.0, floor)
    assert decision.desired_replicas == 20
    # load falls: reactive wants 4, the forecast 6; the down-stabilisation window still holds 20 for 300 s
    low = ServiceObservation("ml/chat", 20, 20, metric_total=10.0)
    decision, state = decide_service(POLICY, low, state, 60.0, forecast_floor(POLICY, latest, SETTINGS, 60.0, 90.0))
    assert (decision.desired_replicas, decision.reason) == (20, Reason.SCALE_DOWN_STABILISED)


def test_shadow_mode_reports_without_acting() -> None:
    shadow = dataclasses.replace(SETTINGS, shadow=True)
    floor = forecast_floor(POLICY, ForecastInput(ramp_forecast(), 0.0), shadow, 600.0, 90.0)
    obs = ServiceObservation("ml/chat", 4, 4, metric_total=10.0)
    decision, _ = decide_service(POLICY, obs, ServiceState(), 600.0, floor)
    assert decision.desired_replicas == 4
    assert "shadow forecast floor 11" in decision.detail


@pytest.mark.parametrize(
    ("metric", "target", "rate", "throughput", "expected"),
    [
        (MetricKind.REQUEST_RATE, 3.2, None, None, 3.2),
        (MetricKind.REQUEST_RATE, 3.2, 2.5, None, 2.5),
        (MetricKind.GPU_UTILIZATION, 70.0, None, None, None),  # the controller: no throughput, no floor
        (MetricKind.GPU_UTILIZATION, 70.0, None, 3.5, 3.5 * 0.7),  # the simulator knows the throughput
        (MetricKind.ENGINE_ACTIVE, 0.5, None, 4.0, 2.0),
        (MetricKind.QUEUE_DEPTH, 2.0, None, 4.0, 4.0 * 0.7),
    ],
)
def test_rate_per_replica_is_one_rule_for_controller_and_simulator(
    metric: MetricKind, target: float, rate: float | None, throughput: float | None, expected: float | None
) -> None:
    from autoscaler.core.model import ForecastPolicy
    from autoscaler.core.predictive import rate_per_replica

    policy = ServicePolicy("ml", "chat", metric=metric, target=target, forecast=ForecastPolicy(rate_per_replica=rate))
    got = rate_per_replica(policy, throughput)
    assert got == (pytest.approx(expected) if expected is not None else None)
