"""Review 42 of issue 14's calibrated excess (``core.headroom.calibrated_excess``, ``core.predictive.
provisioned_input``, ``core.tick.read_forecasts``): the defects found (strict xfails at review, fixed in the same
stop) and what was checked and found right, pinned."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from autoscaler.core.arbitrate import EXPECTED_LEVEL
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.headroom import calibrated_excess, excess_ratio
from autoscaler.core.model import (
    DEFAULT_SCALE_DOWN,
    ControllerState,
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    Observation,
    PodMetrics,
    ServiceObservation,
    ServicePolicy,
)
from autoscaler.core.predictive import MEDIAN_LEVEL, ForecastInput, provisioned_input
from autoscaler.core.tick import PublishedForecast, TickInput, decide_tick
from forecast.types import Forecast

NOW = 36_000.0


def _policy(quantile: float, mode: ForecastMode = ForecastMode.ACTIVE) -> ServicePolicy:
    return ServicePolicy(
        namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=2.0,
        cold_start_s=90.0, scale_down=dataclasses.replace(DEFAULT_SCALE_DOWN, stabilisation_s=60.0),
        forecast=ForecastPolicy(mode, quantile),
    )  # fmt: skip


def _pub(levels: dict[float, float], quantile: float, share: float) -> PublishedForecast:
    forecast = Forecast(NOW - 60.0, 60.0, {q: (v,) * 60 for q, v in levels.items()}, "flat")
    latest = ForecastInput(forecast, fitted_at=NOW - 60.0, reliable=True, reliability_detail="live: ok")
    return PublishedForecast(
        "ml/chat", latest, "flat", quantile, pinball_ratio=0.8, relative_error=0.1, scored=500, coverage=0.999,
        coverage_samples=500, excess_share=share,
    )  # fmt: skip


def _plan(policy: ServicePolicy, pub: PublishedForecast, current: int = 5, rate: float = 8.0):  # type: ignore[no-untyped-def]
    obs = ServiceObservation(policy.key, current, current, pods=PodMetrics(current, rate), request_rate=rate)
    tick = TickInput(NOW, Observation(NOW, {policy.key: obs}), ClusterSnapshot(NOW), {policy.key: policy},
                     {policy.key: pub})  # fmt: skip
    plan, _ = decide_tick(tick, ControllerState())
    return plan


# ---- defect: a quantile at or below the median says it is calibrated when nothing was narrowed ---------------------


def test_a_median_quantile_publishes_a_share_of_zero() -> None:
    """The source of the defect below: P50's band over the median is zero-wide, so each score's ratio is -inf when
    the median covered it; with the median covering 20 of 30, the share is 0 (published as ``excess_share``)."""
    scores = [(9.0, 10.0, 10.0)] * 20 + [(11.0, 10.0, 10.0)] * 10
    assert calibrated_excess(scores, 0.5, 30) == (0.0, 30)


@pytest.mark.parametrize(
    ("levels", "quantile", "share"),
    [
        ({0.1: 4.0, 0.3: 6.0, 0.5: 8.0, 0.9: 10.0}, 0.5, 0.0),  # P50: a zero-wide band, share 0 published
        ({0.1: 4.0, 0.3: 6.0, 0.5: 8.0, 0.9: 10.0}, 0.3, 0.0),  # below the median
        ({0.1: 4.0, 0.9: 12.0, 0.99: 20.0}, 0.99, 0.5),  # the median interpolated (8), not stored
        ({0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.99: 20.0}, 0.95, 0.5),  # P95 interpolated (15), not stored
    ],
)
def test_a_floor_says_it_is_calibrated_only_when_it_is(levels: dict[float, float], quantile: float,
                                                       share: float) -> None:  # fmt: skip
    view = _plan(_policy(quantile), _pub(levels, quantile, share)).forecasts["ml/chat"]
    raw = _plan(_policy(quantile), _pub(levels, quantile, 1.0)).forecasts["ml/chat"]
    floor = view.floor
    assert floor is not None and floor.usable and view.demand is not None and raw.demand is not None
    assert "calibrated" not in floor.detail or view.demand < raw.demand, (floor.detail, view.demand, raw.demand)


# ---- checked and right -------------------------------------------------------------------------------------------


def test_the_narrowed_level_lies_between_the_median_and_the_quantile_and_keeps_what_the_tick_reads() -> None:
    """At every step and every share: median <= narrowed <= the fitted quantile (never above the P99); the median
    (capacity arbitration's EXPECTED_LEVEL) and the levels outside (P50, P99) are kept, so nothing the tick or the
    arbitration reads is lost."""
    rng = random.Random(42)
    for _ in range(200):
        steps = 12
        med = [rng.uniform(0.0, 50.0) for _ in range(steps)]
        p90 = [m + rng.uniform(0.0, 5.0) for m in med]
        p99 = [u + rng.uniform(0.0, 10.0) for u in p90]
        p999 = [u + rng.uniform(0.0, 3.0) for u in p99]
        p10 = [m - rng.uniform(0.0, 5.0) for m in med]
        forecast = Forecast(0.0, 60.0, {0.1: p10, 0.5: med, 0.9: p90, 0.99: p99, 0.999: p999}, "r")
        share = rng.choice([0.0, rng.random(), 0.999999])
        got = provisioned_input(ForecastInput(forecast, fitted_at=0.0), 0.99, share).forecast
        assert set(got.levels) == {0.1, EXPECTED_LEVEL, 0.99, 0.999}
        for i in range(steps):
            t = i * 60.0
            narrowed = got.at(t, 0.99)
            assert med[i] - 1e-9 <= narrowed <= p99[i] + 1e-9
            assert narrowed == pytest.approx(med[i] + share * (p99[i] - med[i]))
            assert got.at(t, MEDIAN_LEVEL) == med[i] and got.at(t, 0.999) == p999[i] and got.at(t, 0.1) == p10[i]


def test_the_share_covers_the_quantile_of_its_own_scores() -> None:
    """Split-conformal in-sample: whenever the share is below 1, the narrowed level (median + share x excess)
    covers at least the quantile's share of the very scores it was measured on -- the coverage the raw quantile is
    judged on (trust) is therefore never the only one that meets the quantile: the earned state is not overstated on
    the window it is measured on. Zero-width bands and ties included."""
    rng = random.Random(3)
    for _ in range(300):
        q = rng.choice([0.9, 0.95, 0.99])
        n = rng.randint(100, 400)
        scores = []
        for _ in range(n):
            m = rng.uniform(5.0, 15.0)
            u = m if rng.random() < 0.05 else m + rng.choice([0.5, 1.0, 3.0])
            a = m + rng.gauss(0.0, 0.6)
            if rng.random() < 0.1:
                a = round(a)
            scores.append((a, m, u))
        share, count = calibrated_excess(scores, q, 30)
        assert count == n and 0.0 <= share <= 1.0
        if share < 1.0:
            covered = sum(1 for a, m, u in scores if a <= m + share * max(0.0, u - m) + 1e-12)
            assert covered / n >= q, (q, n, share, covered)


def test_excess_ratio_without_a_band() -> None:
    assert excess_ratio(9.0, 10.0, 10.0) == -math.inf
    assert excess_ratio(10.0, 10.0, 10.0) == -math.inf  # the median covered it
    assert excess_ratio(10.5, 10.0, 10.0) == math.inf
    assert excess_ratio(12.0, 10.0, 14.0) == pytest.approx(0.5)


@pytest.mark.parametrize("share", [0.0, 0.3])
def test_shadow_mode_changes_no_decision(share: float) -> None:
    """A SHADOW service's floor is calibrated (it shows what the active floor would be) but never applied: the
    desired replicas are those without calibration, whatever the share."""
    levels = {0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.99: 20.0}
    for current, rate in ((5, 8.0), (12, 2.0), (2, 18.0)):
        with_share = _plan(_policy(0.99, ForecastMode.SHADOW), _pub(levels, 0.99, share), current, rate)
        without = _plan(_policy(0.99, ForecastMode.SHADOW), _pub(levels, 0.99, 1.0), current, rate)
        assert [d.desired_replicas for d in with_share.decisions] == [d.desired_replicas for d in without.decisions]
        floor = with_share.forecasts["ml/chat"].floor
        assert floor is not None and floor.shadow


def test_the_hold_and_the_demand_read_the_narrowed_level() -> None:
    """The cold-start-aware hold (the peak over [now, now + lead]) and the view's demand read the calibrated level,
    as the floor does: 8 + 0.5 x (20 - 8) = 14 req/s, 7 replicas at 2 per replica (P99 as fitted: 10)."""
    levels = {0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.99: 20.0}
    view = _plan(_policy(0.99), _pub(levels, 0.99, 0.5)).forecasts["ml/chat"]
    assert view.floor is not None and view.floor.replicas == 7 and view.floor.hold == 7
    assert view.demand == pytest.approx(14.0)
    raw = _plan(_policy(0.99), _pub(levels, 0.99, 1.0)).forecasts["ml/chat"]
    assert raw.floor is not None and raw.floor.replicas == 10 and raw.demand == pytest.approx(20.0)


def test_a_share_published_at_another_quantile_is_not_applied() -> None:
    """pub.quantile != spec quantile (changed since the refit): the share says nothing about the new level."""
    levels = {0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.95: 14.0, 0.99: 20.0}
    view = _plan(_policy(0.95), _pub(levels, 0.99, 0.1)).forecasts["ml/chat"]
    assert view.floor is not None and view.floor.replicas == 7  # P95 14 req/s as fitted
    assert "calibrated" not in view.floor.detail


def test_capacity_arbitration_reads_the_narrowed_level_and_still_the_median(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``decide_tick`` hands the arbitration: the calibrated fit, at the spec's quantile (the narrowed level)
    and at EXPECTED_LEVEL (the median, kept); the P90 dropped is read by nothing there."""
    from autoscaler.core import tick as tick_module
    from autoscaler.core.arbitrate import CapacityConfig

    seen: dict[str, object] = {}
    real = tick_module.arbitrate

    def spy(arb, state, config):  # type: ignore[no-untyped-def]
        seen.update(arb.forecasts)
        return real(arb, state, config)

    monkeypatch.setattr(tick_module, "arbitrate", spy)
    levels = {0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.99: 20.0}
    p = _policy(0.99)
    obs = ServiceObservation(p.key, 5, 5, pods=PodMetrics(5, 8.0), request_rate=8.0)
    tick = TickInput(NOW, Observation(NOW, {p.key: obs}), ClusterSnapshot(NOW), {p.key: p},
                     {p.key: _pub(levels, 0.99, 0.25)})  # fmt: skip
    decide_tick(tick, ControllerState(), tick_module.TickConfig(capacity=CapacityConfig()))
    forecast, quantile, _lead = seen["ml/chat"]  # type: ignore[misc]
    assert quantile == 0.99
    assert forecast.max_over(NOW, NOW + 600.0, quantile) == pytest.approx(11.0)  # 8 + 0.25 x 12
    assert forecast.max_over(NOW, NOW + 600.0, EXPECTED_LEVEL) == 8.0
