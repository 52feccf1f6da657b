"""The latency model against textbook values and its own closed forms."""

from __future__ import annotations

import math

import pytest

from autoscaler.sim.latency import erlang_c, latency_quantile, replicas_needed, share_within


@pytest.mark.parametrize(
    ("servers", "load", "expected"),
    [
        (1, 0.5, 0.5),  # M/M/1: P(wait) = rho
        (2, 1.0, 1.0 / 3.0),  # M/M/2 at rho = 0.5: 2*rho^2/(1+rho) = 1/3
        (10, 8.0, 0.409),  # Erlang C table value for c=10, a=8 (0.4092)
    ],
)
def test_erlang_c_textbook_values(servers: int, load: float, expected: float) -> None:
    assert erlang_c(servers, load) == pytest.approx(expected, abs=1e-3)


def test_latency_is_infinite_when_overloaded_and_base_when_idle() -> None:
    assert latency_quantile(4, 40.0, 10.0, 1.0) == math.inf
    assert latency_quantile(4, 0.0, 10.0, 1.0) == 1.0
    assert latency_quantile(0, 1.0, 10.0, 1.0) == math.inf


def test_latency_quantile_matches_share_within() -> None:
    # P(T <= p95) must be 0.95 when queueing matters
    p95 = latency_quantile(5, 45.0, 10.0, 0.5)
    assert p95 > 0.5
    assert share_within(5, 45.0, 10.0, 0.5, p95) == pytest.approx(0.95, abs=1e-9)


def test_latency_falls_as_replicas_rise() -> None:
    values = [latency_quantile(c, 90.0, 10.0, 1.0) for c in range(10, 16)]
    assert values == sorted(values, reverse=True)
    assert values[0] > values[-1]


@pytest.mark.parametrize("rate", [0.5, 7.0, 45.0, 99.0, 400.0])
def test_replicas_needed_is_the_smallest_that_meets_the_slo(rate: float) -> None:
    c = replicas_needed(rate, 10.0, 1.0, 1.3, 0.95)
    assert latency_quantile(c, rate, 10.0, 1.0) <= 1.3
    if c > 1:
        assert latency_quantile(c - 1, rate, 10.0, 1.0) > 1.3


def test_replicas_needed_respects_bounds() -> None:
    assert replicas_needed(0.0, 10.0, 1.0, 2.0, min_replicas=2) == 2
    assert replicas_needed(1000.0, 10.0, 1.0, 2.0, max_replicas=20) == 20
    assert replicas_needed(5.0, 10.0, 1.0, 2.0, min_replicas=3) == 3


@pytest.mark.parametrize(("c", "rate"), [(0, 1.0), (3, 0.0), (5, 45.0), (12, 100.0), (4, 50.0)])
def test_latency_and_share_agrees_with_the_separate_functions(c: int, rate: float) -> None:
    from autoscaler.sim.latency import latency_and_share

    latency, share = latency_and_share(c, rate, 10.0, 0.5, 0.95, 0.8)
    assert latency == latency_quantile(c, rate, 10.0, 0.5, 0.95)
    assert share == pytest.approx(share_within(c, rate, 10.0, 0.5, 0.8))
