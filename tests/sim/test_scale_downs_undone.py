"""Scale-downs undone within a cold start (``sim.engine.scale_downs_undone``; stop 47, issue 14 item 2).

Issue 14 counts scaling actions because "each scale-down that is undone within a cold start wastes a cold start of
GPU time". The action count does not say which scale-downs those are: a scale-down whose replica is wanted back
five minutes later (after a 90 s cold start) saves GPU-time, one wanted back before a replacement could even have
started saves nothing and costs a cold start. The simulator now counts the latter per policy (report row
"scale-downs undone within a cold start", JSON ``scale_downs`` and ``scale_downs_undone``, the trace matrix's
``undone p/h`` column).
"""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.sim.engine import scale_downs_undone


@pytest.mark.parametrize(
    ("series", "within", "expected"),
    [
        pytest.param([], 4, (0, 0), id="empty"),
        pytest.param([3], 4, (0, 0), id="one step"),
        pytest.param([3, 3, 3], 4, (0, 0), id="flat"),
        pytest.param([5, 4, 4, 5], 2, (1, 1), id="back above within 2 steps: undone"),
        pytest.param([5, 4, 4, 4, 5], 2, (1, 0), id="back only after 3 steps: kept"),
        pytest.param([5, 4, 4, 4, 5], 3, (1, 1), id="the same with a 3-step cold start: undone"),
        pytest.param([5, 3, 4], 2, (1, 1), id="partly back (3 -> 4 of 5): undone"),
        pytest.param([5, 4, 3, 3, 3], 2, (2, 0), id="two steps down, never back"),
        pytest.param([5, 4, 3, 4, 3], 2, (3, 1), id="down, down, up, down: the second undone, the third not"),
        pytest.param([2, 4, 1], 3, (1, 0), id="a fall at the last step: nothing after it"),
        pytest.param([4, 2, 4], 0, (1, 0), id="no cold start: nothing can be undone within it"),
    ],
)
def test_scale_downs_undone(series: list[int], within: int, expected: tuple[int, int]) -> None:
    assert scale_downs_undone(np.array(series, dtype=np.int32), within) == expected


def test_a_series_fuzzed_against_counting_by_hand() -> None:
    rng = np.random.default_rng(47)
    for _ in range(300):
        series = rng.integers(0, 6, size=int(rng.integers(0, 40)))
        within = int(rng.integers(0, 6))
        downs = undone = 0
        for step in range(1, len(series)):
            if series[step] < series[step - 1]:
                downs += 1
                ahead = series[step + 1 : step + 1 + within]
                undone += int(within > 0 and ahead.size > 0 and ahead.max() > series[step])
        assert scale_downs_undone(series, within) == (downs, undone), (series.tolist(), within)


def test_the_report_counts_them_per_policy() -> None:
    """A short run of the packaged default scenario (90 s cold start, 15 s steps): each policy's counts are its
    replica series' (the JSON report's, the table's row). Even the oracle undoes a few: it drops a replica for 30 s
    where the demand dips between two rises."""
    import copy

    import yaml

    from autoscaler.sim.report import format_table
    from autoscaler.sim.run import run_scenario
    from autoscaler.sim.scenario import default_scenario_path, parse_scenario

    data = copy.deepcopy(yaml.safe_load(default_scenario_path().read_text(encoding="utf-8")))
    data["durationSeconds"] = 6 * 3600
    result = run_scenario(parse_scenario(data), default_scenario_path().parent, ("oracle", "hpa", "reactive"))
    for name, figures in result.report["policies"].items():
        counted = scale_downs_undone(result.runs[name].timelines[0].spec, 6)
        assert (figures["scale_downs"], figures["scale_downs_undone"]) == counted, name
        assert figures["scale_downs"] <= figures["scale_actions"], name
    assert result.report["policies"]["reactive"]["scale_downs"] > 0
    assert "scale-downs undone within a cold start" in format_table(result.report)


def _forecasting(**fields: object) -> dict:  # type: ignore[type-arg]
    import copy

    import yaml

    from autoscaler.sim.scenario import default_scenario_path

    data = copy.deepcopy(yaml.safe_load(default_scenario_path().read_text(encoding="utf-8")))
    data["forecasting"].update(fields)
    return data


def test_the_scale_down_hold_is_a_scenario_setting() -> None:
    """``forecasting.scaleDownHoldLeads`` (the controller's ``forecast.scale_down_hold_leads``, default 2 lead
    times): how far a scale-down's hold reads the forecast (tests/core/test_scale_down_hold_leads.py)."""
    from autoscaler.sim.scenario import ScenarioError, parse_scenario

    assert parse_scenario(_forecasting()).forecasting.scale_down_hold_leads == 2.0
    assert parse_scenario(_forecasting(scaleDownHoldLeads=1)).forecasting.scale_down_hold_leads == 1.0
    for bad in (0.5, 11, "two"):
        with pytest.raises(ScenarioError, match="scaleDownHoldLeads"):
            parse_scenario(_forecasting(scaleDownHoldLeads=bad))
