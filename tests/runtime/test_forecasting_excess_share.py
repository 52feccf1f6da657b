"""Issue 14: the controller publishes the calibrated share of the provisioned quantile's excess
(``core.headroom.calibrated_excess``) from its live scores of the accountability window, as the simulator does."""

from __future__ import annotations

import pytest

from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.forecasting import ForecastService, _Score, _ServiceState
from autoscaler.settings import ForecastSettings

NOW = 1_000_000.0


def test_the_live_scores_of_the_window_give_the_share() -> None:
    policy = ServicePolicy(
        "ml", "chat", metric=MetricKind.REQUEST_RATE, target=5.0, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99)
    )
    settings = ForecastSettings(model="last_value", workers=1, min_history_seconds=0, bootstrap_origins=0)
    service = ForecastService(settings, FakeMetricsSource(), lambda: [policy], refit_interval_s=900.0)
    window = settings.accountability_window_seconds
    state = _ServiceState(quantile=0.99)
    # long ago, far above the band (outside the window: says nothing); in the window, at 40 % of the excess
    state.scores.extend(_Score(NOW - window - 60.0 - i, 30.0, 20.0, 10.0, 20.0) for i in range(50))
    state.scores.extend(_Score(NOW - i * 60.0, 14.0, 20.0, 10.0, 20.0) for i in range(200))
    assert service._excess_share(state, 0.99, NOW) == pytest.approx(0.4)
    few = _ServiceState(quantile=0.99)
    few.scores.extend(_Score(NOW - i * 60.0, 14.0, 20.0, 10.0, 20.0) for i in range(99))
    assert service._excess_share(few, 0.99, NOW) == 1.0  # a P99 needs 100 scores
