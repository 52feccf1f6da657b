"""BaseForecaster.update runs _prepare (which overwrites start_, n_obs_, last_value_, forecast_start_) before
_update; when _update raises, the model keeps its old fitted state but claims the new origin, so a later predict
returns the old forecast shifted in time (stamped as if conditioned on the new data)."""

import pytest

from forecast.statistical import FourierARIMA, HoltWinters
from tests.forecast.conftest import START, STEP_S, daily_series


@pytest.mark.parametrize("make", [HoltWinters, FourierARIMA], ids=["holt_winters", "fourier_arima"])
def test_a_failed_update_leaves_the_model_as_it_was(make) -> None:
    y = daily_series(days=5.0)
    model = make().fit(y[:600], start=START, step_s=STEP_S)
    before = model.predict(6)
    newer_start = START + (y.size - 1) * STEP_S
    with pytest.raises(ValueError):
        model.update(y[-1:], start=newer_start)  # one sample: too short for statsmodels' re-conditioning
    after = model.predict(6)
    # either still the old, consistent forecast, or no forecast at all -- not the old values at a new origin
    assert after.start == before.start, (after.start, before.start)
    assert after == before
