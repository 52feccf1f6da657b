"""CountLevel after an idle stretch: the Pearson residuals of the one-step errors divide by max(level, 1 /
count_interval_s), so one burst after zeros gives error**2 * count_interval_s (~6e8 here) and a dispersion of
millions; the negative binomial at the forecast level then has shape n ~ 1e-6, i.e. P(0) > 99.9 %, and every
quantile the scaler may provision for (P90, P99) is 0 although the model's own mean forecast is 20 and the last
observation 1000."""

from __future__ import annotations

import numpy as np
import pytest

from forecast.smoothing import CountLevel


@pytest.mark.parametrize("level", [0.9, 0.99])
def test_a_burst_after_idle_is_not_forecast_as_zero_demand(level: float) -> None:
    y = np.r_[np.zeros(799), 1000.0]
    model = CountLevel(quantiles=(0.5, level)).fit(y, start=0.0, step_s=600.0)
    upper = model.predict(3).quantiles[level]
    assert model.level_ == pytest.approx(20.0)  # the model's own point forecast (mean)
    assert min(upper) >= model.level_, (upper, model.level_, model.dispersion_)
