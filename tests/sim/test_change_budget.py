"""The cheapest replica schedule under a budget of scaling actions (``bounds.cheapest_schedules``,
``bounds.change_budget``): exact against brute force on small inputs, bracketed on larger ones, and the
hindsight-tuned causal family held by a scale-down window (``tuned_observed_policy(hold_steps=...)``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autoscaler.sim.bounds import (
    _backward_window_max,
    change_budget,
    cheapest_schedules,
    tuned_observed_policy,
)
from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import load_scenario


def _schedules(lower: list[int]) -> list[tuple[int, int]]:
    """(replica-steps, changes) of every schedule >= lower with levels 0..max(lower)."""
    out = []
    for schedule in itertools.product(range(max(lower) + 1), repeat=len(lower)):
        if all(s >= low for s, low in zip(schedule, lower, strict=True)):
            out.append((sum(schedule), sum(1 for a, b in itertools.pairwise(schedule) if a != b)))
    return out


CASES = [
    [3],
    [0, 0, 0],
    [1, 2, 1],
    [2, 0, 2, 0, 2],
    [0, 3, 1, 3, 0, 1],
    [1, 1, 2, 2, 1, 1],
    [3, 0, 0, 0, 0, 3],
]


@pytest.mark.parametrize("lower", CASES)
@pytest.mark.parametrize("penalty", [0.0, 0.5, 1.0, 2.5, 7.0])
def test_cheapest_schedule_matches_brute_force(lower: list[int], penalty: float) -> None:
    ((cost, changes),) = cheapest_schedules(np.array(lower), [penalty])
    best = min(c + penalty * k for c, k in _schedules(lower))
    assert cost + penalty * changes == pytest.approx(best)
    # The schedule reported is a real one: its (cost, changes) pair is among the feasible schedules'.
    assert (cost, changes) in {(float(c), k) for c, k in _schedules(lower)}


def test_random_small_inputs_are_bracketed_by_the_budget() -> None:
    rng = np.random.default_rng(7)
    for _ in range(150):
        lower = [int(v) for v in rng.integers(0, 4, rng.integers(1, 7))]
        schedules = _schedules(lower)
        for allowed in range(len(lower)):
            exact = min(c for c, k in schedules if k <= allowed)
            (budget,) = change_budget(np.array(lower), [allowed], [0.5, 1.0, 2.0, 3.0, 5.0, 100.0])
            assert budget.lower <= exact + 1e-9 <= budget.upper + 1e-9
            assert budget.upper_changes <= allowed


def test_no_penalty_keeps_the_lower_series_and_a_larger_one_never_changes_more() -> None:
    rng = np.random.default_rng(3)
    lower = rng.integers(2, 12, 2000)
    solved = cheapest_schedules(lower, [0.0, 1.0, 4.0, 16.0, 64.0, 10_000.0])
    assert solved[0] == (float(lower.sum()), int(np.count_nonzero(np.diff(lower))))
    changes = [k for _, k in solved]
    costs = [c for c, _ in solved]
    assert changes == sorted(changes, reverse=True)
    assert costs == sorted(costs)
    # A penalty larger than any saving holds one level: the peak, all along.
    assert solved[-1] == (float(lower.max() * lower.size), 0)


def test_a_budget_of_the_lower_series_own_changes_costs_nothing_extra() -> None:
    lower = np.array([2, 2, 5, 5, 3, 3, 3, 6, 2])
    own = int(np.count_nonzero(np.diff(lower)))
    (budget,) = change_budget(lower, [own], [1.0, 2.0])
    assert budget.upper == budget.lower == float(lower.sum())


def test_negative_levels_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        cheapest_schedules(np.array([1, -1]), [1.0])


def test_backward_window_max_holds_each_value_for_the_window() -> None:
    values = np.array([1, 4, 2, 2, 0, 3, 1, 1])
    assert _backward_window_max(values, 1).tolist() == values.tolist()
    assert _backward_window_max(values, 3).tolist() == [1, 4, 4, 4, 2, 3, 3, 3]
    assert _backward_window_max(values, 100).tolist() == [1, 4, 4, 4, 4, 4, 4, 4]


def test_a_held_family_changes_less_within_its_budget(
    make_scenario: Callable[..., Path],
) -> None:
    from tests.sim.test_predictive import DELAY_S, FORECASTING, WINDOW_S, windowed_demand

    scenario, base = load_scenario(
        make_scenario(windowed_demand(), metricsDelaySeconds=DELAY_S, forecasting=FORECASTING)
    )
    services, start, _ = build_services(scenario, base)
    args = (services[0], start, scenario.step_seconds, DELAY_S, WINDOW_S, 0.95)
    free = tuned_observed_policy(*args)
    held = tuned_observed_policy(*args, hold_steps=(0, 8, 40), max_changes=free.changes // 2 if free else 0)
    assert free is not None and held is not None
    assert held.changes <= free.changes // 2
    assert held.slo_attainment >= 0.95
    # Fewer changes are paid for in GPU-hours: never cheaper than the free family's best.
    assert held.gpu_hours_vs_oracle >= free.gpu_hours_vs_oracle
    none_allowed = tuned_observed_policy(*args, max_changes=0)
    assert none_allowed is None or none_allowed.changes == 0
