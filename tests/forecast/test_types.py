from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from forecast.backtest import evaluate
from forecast.types import Forecast, ForecastQuality, assess_reliability, pinball_loss


def make(start: float = 1000.0, step: float = 60.0) -> Forecast:
    return Forecast(
        start=start,
        step_s=step,
        quantiles={0.9: (30.0, 40.0, 50.0), 0.1: (10.0, 20.0, 30.0), 0.5: (20.0, 30.0, 40.0)},
        model="m",
    )


def test_levels_sorted_and_horizon() -> None:
    f = make()
    assert f.levels == (0.1, 0.5, 0.9)
    assert len(f) == 3
    assert f.horizon_s == 180.0
    assert f.end == 1180.0
    assert f.origin == 940.0
    assert f.times() == (1000.0, 1060.0, 1120.0)


def test_at_picks_the_step_containing_the_time() -> None:
    f = make()
    assert f.at(1000.0, 0.5) == 20.0
    assert f.at(1059.999, 0.5) == 20.0
    assert f.at(1060.0, 0.5) == 30.0  # a boundary belongs to the step it starts
    assert f.at(1179.9, 0.9) == 50.0


@pytest.mark.parametrize("time", [999.9, 1180.0, 5000.0, math.nan])
def test_at_outside_the_horizon_raises(time: float) -> None:
    with pytest.raises(ValueError):
        make().at(time, 0.5)
    assert not make().covers(time)


def test_at_interpolates_between_levels_and_refuses_outside_them() -> None:
    f = make()
    assert f.at(1000.0, 0.3) == pytest.approx(15.0)
    assert f.at(1000.0, 0.7) == pytest.approx(25.0)
    with pytest.raises(ValueError, match="outside the forecast's levels"):
        f.at(1000.0, 0.95)
    with pytest.raises(ValueError):
        f.at(1000.0, 0.05)
    assert f.values(0.3) == pytest.approx((15.0, 25.0, 35.0))


def test_max_over_takes_the_peak_across_steps() -> None:
    f = make()
    assert f.max_over(1000.0, 1100.0, 0.9) == 40.0
    assert f.max_over(900.0, 5000.0, 0.5) == 40.0  # clipped to the horizon
    with pytest.raises(ValueError):
        f.max_over(2000.0, 3000.0, 0.5)
    with pytest.raises(ValueError):
        f.max_over(1100.0, 1000.0, 0.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"quantiles": {}},
        {"quantiles": {0.5: ()}},
        {"quantiles": {1.0: (1.0,)}},
        {"quantiles": {0.1: (1.0, 2.0), 0.9: (1.0,)}},
        {"quantiles": {0.1: (5.0,), 0.9: (1.0,)}},  # crossing
        {"quantiles": {0.5: (math.nan,)}},
        {"step_s": 0.0},
        {"start": math.inf},
    ],
)
def test_invalid_forecasts_are_rejected(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"start": 0.0, "step_s": 60.0, "quantiles": {0.5: (1.0,)}, "model": "m"}
    base.update(kwargs)
    with pytest.raises(ValueError):
        Forecast(**base)  # type: ignore[arg-type]


def test_rounding_level_crossings_are_straightened() -> None:
    f = Forecast(start=0.0, step_s=1.0, quantiles={0.1: (1.0 + 1e-12,), 0.9: (1.0,)}, model="m")
    assert f.quantiles[0.1][0] <= f.quantiles[0.9][0]


def test_forecast_is_immutable_and_owns_its_data() -> None:
    source = {0.5: [1.0, 2.0]}
    f = Forecast(start=0.0, step_s=1.0, quantiles=source, model="m")
    source[0.5][0] = 99.0
    assert f.quantiles[0.5] == (1.0, 2.0)
    with pytest.raises(AttributeError):
        f.start = 5.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        f.quantiles[0.5] = (3.0,)  # type: ignore[index]


def test_json_round_trip() -> None:
    f = make()
    again = Forecast.from_dict(json.loads(json.dumps(f.to_dict())))
    assert again == f


def test_types_module_imports_no_scientific_stack() -> None:
    code = (
        "import sys, forecast, forecast.types;"
        "bad = [m for m in ('numpy', 'pandas', 'sklearn', 'statsmodels') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pinball_loss_penalises_the_right_side() -> None:
    assert pinball_loss(10.0, 8.0, 0.9) == pytest.approx(1.8)  # under-forecast at P90 is expensive
    assert pinball_loss(10.0, 12.0, 0.9) == pytest.approx(0.2)
    assert pinball_loss(10.0, 10.0, 0.5) == 0.0


def test_quality_from_observations_matches_the_numpy_scorer() -> None:
    rng = np.random.default_rng(1)
    actual = rng.normal(10, 3, 200)
    lo, mid, hi = np.full(200, 7.0), np.full(200, 10.0), np.full(200, 13.0)
    actual[5] = math.nan  # a missing scrape is skipped by both
    pure = ForecastQuality.from_observations("m", actual.tolist(), {0.1: lo.tolist(), 0.5: mid, 0.9: hi})
    vec = evaluate("m", actual, np.stack([lo, mid, hi]), (0.1, 0.5, 0.9))
    assert pure.n == vec.n == 199
    assert pure.mae == pytest.approx(vec.mae)
    assert pure.interval_coverage == pytest.approx(vec.interval_coverage)
    assert pure.upper_coverage == pytest.approx(vec.upper_coverage)
    for level in (0.1, 0.5, 0.9):
        assert pure.pinball[level] == pytest.approx(vec.pinball[level])
    inside = np.mean((actual[np.isfinite(actual)] >= 7) & (actual[np.isfinite(actual)] <= 13))
    assert pure.interval_coverage == pytest.approx(inside)


def test_quality_mae_interpolates_the_median_when_absent() -> None:
    q = ForecastQuality.from_observations("m", [5.0], {0.25: [0.0], 0.75: [10.0]})
    assert q.mae == pytest.approx(0.0)  # median interpolated at 5


def quality(pinball: float, n: int = 100, upper: float = 0.9, model: str = "gbm") -> ForecastQuality:
    return ForecastQuality(model, n, 1.0, {0.1: pinball, 0.9: pinball}, 0.8, upper, (0.1, 0.9))


def test_reliable_when_clearly_better_than_baseline() -> None:
    reliable, reason = assess_reliability(quality(0.5), quality(1.0, model="snaive"), max_ratio=0.8)
    assert reliable
    assert "0.50x" in reason


def test_unreliable_when_worse_than_the_threshold() -> None:
    reliable, reason = assess_reliability(quality(0.9), quality(1.0, model="snaive"), max_ratio=0.8)
    assert not reliable
    assert "0.90x" in reason and "snaive" in reason


def test_unreliable_without_enough_evidence() -> None:
    reliable, reason = assess_reliability(quality(0.1, n=5), quality(1.0), min_samples=30)
    assert not reliable
    assert "only 5" in reason


def test_unreliable_on_poor_coverage_or_nan() -> None:
    assert not assess_reliability(quality(0.5, upper=0.6), quality(1.0), min_upper_coverage=0.8)[0]
    assert not assess_reliability(quality(math.nan), quality(1.0))[0]
    assert not assess_reliability(quality(0.5), quality(0.0))[0]  # baseline was exact, model was not
    assert assess_reliability(quality(0.0), quality(0.0))[0]
