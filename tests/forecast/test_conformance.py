"""The scikit-learn contract, checked for every forecaster (in the spirit of sktime's estimator checks)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from forecast.base import BaseForecaster
from forecast.registry import available_models, make_model
from tests.forecast.conftest import START, STEP_S, daily_series

# Every registered model, each built the way the CLI builds it, plus a non-default configuration of each
# statistical/ML model so resampling and calibration paths are checked too.
ESTIMATORS: dict[str, BaseForecaster] = {name: make_model(name, horizon_steps=6) for name in available_models()}
ESTIMATORS["holt_winters_resampled"] = make_model("holt_winters", resample_s=1800.0, period_s=None)
ESTIMATORS["fourier_arima_resampled"] = make_model("fourier_arima", order=(1, 0, 0), max_fit_samples=300)
ESTIMATORS["quantile_gbm_uncalibrated"] = make_model("quantile_gbm", calibration_fraction=0.0, max_iter=20)
ESTIMATORS["count_level_fixed_alpha"] = make_model("count_level", alphas=(0.3,), count_interval_s=60.0, burn_in=0)
ESTIMATORS["last_value_clipped"] = make_model("last_value", clip_outliers=4.0, quantiles=(0.05, 0.5, 0.95))

IDS = list(ESTIMATORS)


@pytest.fixture(scope="module")
def y() -> np.ndarray:
    return daily_series(days=5.0)


@pytest.fixture(params=IDS)
def estimator(request: pytest.FixtureRequest) -> BaseForecaster:
    return clone(ESTIMATORS[request.param])


def test_every_registered_model_is_covered() -> None:
    assert set(available_models()) <= set(ESTIMATORS)
    assert len(available_models()) >= 7


def test_init_stores_exactly_its_parameters(estimator: BaseForecaster) -> None:
    signature = inspect.signature(type(estimator).__init__)
    names = [p for p in signature.parameters if p != "self"]
    assert all(signature.parameters[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in names)
    # Nothing but the parameters is set by __init__ (sklearn's check_no_attributes_set_in_init).
    fresh = type(estimator)()
    assert set(vars(fresh)) == set(names)
    for name in names:
        assert getattr(fresh, name) is signature.parameters[name].default


def test_label_is_available_before_fit(estimator: BaseForecaster) -> None:
    # Backtests and the refit job label a model before fitting it.
    assert isinstance(estimator.label(), str) and estimator.label()


def test_init_does_no_validation(estimator: BaseForecaster) -> None:
    # Invalid values are accepted by __init__ and only rejected by fit.
    bad = type(estimator)(quantiles=(1.5, -2.0))
    assert bad.quantiles == (1.5, -2.0)
    with pytest.raises(ValueError):
        bad.fit(daily_series(days=3.0), start=START, step_s=STEP_S)


def test_clone_round_trip(estimator: BaseForecaster) -> None:
    twin = clone(estimator)
    assert twin is not estimator
    assert type(twin) is type(estimator)
    assert twin.get_params() == estimator.get_params()


def test_set_params_changes_a_parameter(estimator: BaseForecaster) -> None:
    estimator.set_params(quantiles=(0.2, 0.8))
    assert estimator.get_params()["quantiles"] == (0.2, 0.8)


def test_predict_before_fit_raises(estimator: BaseForecaster) -> None:
    with pytest.raises(NotFittedError):
        estimator.predict(3)
    with pytest.raises(NotFittedError):
        estimator.update([1.0, 2.0, 3.0], start=START)


def test_fit_returns_self_sets_underscore_attributes_and_keeps_params(estimator: BaseForecaster, y: np.ndarray) -> None:
    params_before = estimator.get_params()
    assert estimator.fit(y, start=START, step_s=STEP_S) is estimator
    learnt = set(vars(estimator)) - set(params_before)
    assert learnt, "fit must store what it learnt"
    assert all(name.endswith("_") for name in learnt), sorted(learnt)
    assert estimator.get_params() == params_before


def test_input_is_not_mutated(estimator: BaseForecaster, y: np.ndarray) -> None:
    data = y.copy()
    data[10] = np.nan  # the gap-filling path must work on a copy too
    kept = data.copy()
    as_list = data.tolist()
    estimator.fit(data, start=START, step_s=STEP_S)
    estimator.update(data, start=START)
    np.testing.assert_array_equal(data, kept)
    estimator.fit(as_list, start=START, step_s=STEP_S)
    assert np.array_equal(np.asarray(as_list), kept, equal_nan=True)


@pytest.mark.parametrize("horizon", [1, 6, 20])
def test_forecast_shape_continuity_and_monotone_quantiles(
    estimator: BaseForecaster, y: np.ndarray, horizon: int
) -> None:
    forecast = estimator.fit(y, start=START, step_s=STEP_S).predict(horizon)
    assert len(forecast) == horizon
    assert forecast.step_s == STEP_S
    # Index continuity: the first forecast step is the one right after the last observation.
    assert forecast.start == pytest.approx(START + y.size * STEP_S, rel=0, abs=1e-6)
    assert forecast.levels == tuple(sorted(estimator.quantiles))
    values = np.array([forecast.quantiles[level] for level in forecast.levels])
    assert np.all(np.isfinite(values))
    assert np.all(np.diff(values, axis=0) >= 0), "quantiles must be non-decreasing in the level"
    assert np.all(values >= 0), "nonnegative=True clips at zero"
    assert forecast.model


def test_forecast_is_in_the_right_range(estimator: BaseForecaster, y: np.ndarray) -> None:
    # A sanity bound any of these models meets on a clean daily cycle of amplitude 50 around 100.
    forecast = estimator.fit(y, start=START, step_s=STEP_S).predict(6)
    median = np.array(forecast.values(0.5))
    assert np.all((median > 20) & (median < 200)), median


def test_update_moves_the_forecast_origin(estimator: BaseForecaster, y: np.ndarray) -> None:
    estimator.fit(y[:-12], start=START, step_s=STEP_S)
    params = dict(vars(estimator))
    estimator.update(y, start=START)
    forecast = estimator.predict(4)
    assert forecast.start == pytest.approx(START + y.size * STEP_S, rel=0, abs=1e-6)
    with pytest.raises(ValueError):
        estimator.update(y, start=START, step_s=STEP_S * 2)
    # update keeps the learnt configuration (no parameter re-estimation of the constructor's params).
    assert estimator.get_params() == clone(estimator).get_params()
    assert set(vars(estimator)) >= set(params)


def test_fitting_is_deterministic(estimator: BaseForecaster, y: np.ndarray) -> None:
    first = clone(estimator).fit(y, start=START, step_s=STEP_S).predict(5)
    second = clone(estimator).fit(y, start=START, step_s=STEP_S).predict(5)
    assert first == second


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [np.nan, np.nan, np.nan]])
def test_bad_series_are_rejected(estimator: BaseForecaster, bad: list[object]) -> None:
    with pytest.raises(ValueError):
        estimator.fit(bad, start=START, step_s=STEP_S)


@pytest.mark.parametrize("horizon", [0, -1, 2.5])
def test_bad_horizon_is_rejected(estimator: BaseForecaster, y: np.ndarray, horizon: float) -> None:
    estimator.fit(y, start=START, step_s=STEP_S)
    with pytest.raises(ValueError):
        estimator.predict(horizon)  # type: ignore[arg-type]


def test_a_model_whose_levels_are_independent_gives_the_same_values_with_fewer_levels(
    estimator: BaseForecaster, y: np.ndarray
) -> None:
    """``levels_independent`` lets the simulator fit only the level it reads: the values at that level must be the
    same as with the band beside it, after a fit and after updates (the kept residual sets slide per level)."""
    if not type(estimator).levels_independent:
        pytest.skip("levels may cross (or were not checked): the simulator fits the whole band")
    gaps = y.copy()
    gaps[50:53] = np.nan  # a gap: the values at each level must still not depend on the others
    gaps[::37] *= 3.0  # bursts, so that spreads are skewed and levels far apart
    for level in (0.9, 0.99):
        full = clone(estimator).set_params(quantiles=(0.1, 0.5, 0.9, level) if level != 0.9 else (0.1, 0.5, 0.9))
        alone = clone(estimator).set_params(quantiles=(level,))
        for model in (full, alone):
            model.fit(gaps[:-30], start=START, step_s=STEP_S)
        assert alone.predict(6).values(level) == full.predict(6).values(level)
        for end in range(gaps.size - 29, gaps.size + 1, 7):
            full.update(gaps[:end], start=START)
            alone.update(gaps[:end], start=START)
            assert alone.predict(6).values(level) == full.predict(6).values(level), end


def test_levels_independent_is_claimed_by_the_residual_quantile_models() -> None:
    claimed = {name for name in available_models() if type(make_model(name)).levels_independent}
    # the models the simulator fits at one level; quantile regression (levels learnt apart, may cross) is not one
    assert {"last_value", "seasonal_naive", "phase_naive"} <= claimed
    assert "quantile_gbm" not in claimed
