"""What the simulated request-rate metric counts (``simulation.requestRateCounts``, stop 45).

The controller's default request counter (``vllm:request_success_total``) counts finished requests: in an overload
it reads what the ready replicas serve, not the demand. The simulator reported the arrivals, which flattered every
policy scaling on a request rate in the bursts (and measured an SLO-guard change as a gain that, against finished
requests, lost up to 16 points within the SLO on azure-llm-code: benchmarks/README.md, stop 45). The forecasts still
learn from the arrivals (``ServiceObservation.request_rate``), in process and in the forecasting workers alike,
unless ``simulation.forecastLearnsFrom: finished`` (stop 46: ``tests/sim/test_forecast_learns_from.py``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.sim.engine import _observe
from autoscaler.sim.policies import SimService
from autoscaler.sim.scenario import ScenarioError, default_scenario_path, parse_scenario

POLICY = ServicePolicy("inference", "chat", metric=MetricKind.REQUEST_RATE, target=3.0)


def service(finished: bool) -> SimService:
    return SimService(POLICY, np.zeros(4), throughput=3.5, base_latency_s=1.0, slo_s=4.0, quantile=0.95,
                      rate_counts_finished=finished)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "finished", "ready", "seen_ready", "rate", "metric"),
    [
        ("under capacity: every request finishes", True, 6, 6, 10.0, 10.0),
        ("overloaded: what the 6 ready serve", True, 6, 6, 30.0, 21.0),
        ("overloaded, 2 of the 6 ready since the sample: the 4 ready then", True, 6, 4, 30.0, 14.0),
        ("overloaded, a pod gone since the sample: the 5 still here", True, 5, 6, 30.0, 17.5),
        ("no ready replica: nothing finishes", True, 0, 0, 30.0, 0.0),
        ("exactly at capacity", True, 6, 6, 21.0, 21.0),
        ("arrivals: the whole demand, overloaded or not", False, 6, 6, 30.0, 30.0),
        ("arrivals, no ready replica", False, 0, 0, 30.0, 30.0),
    ],
)
def test_the_request_rate_read(case: str, finished: bool, ready: int, seen_ready: int, rate: float,
                               metric: float) -> None:  # fmt: skip
    obs = _observe(service(finished), MetricKind.REQUEST_RATE, 8, ready, 8 - ready, rate, 100.0, 5.0, 15.0,
                   seen_ready=seen_ready)  # fmt: skip
    assert obs.metric_total == pytest.approx(metric), case
    assert obs.request_rate == rate, case  # what the forecasts learn from: the arrivals either way


def scenario_with(**simulation: object) -> dict:  # type: ignore[type-arg]
    """The packaged default scenario's data with these ``simulation`` fields of its service set (None: left out)."""
    import yaml

    data = copy.deepcopy(yaml.safe_load(default_scenario_path().read_text(encoding="utf-8")))
    data["services"][0]["simulation"].update({k: v for k, v in simulation.items() if v is not None})
    return data


# (scenario field, parsed attribute, default, the other value, bad values): the simulation's two choices of count
FIELDS = [
    ("requestRateCounts", "request_rate_counts", "finished", "arrivals", ["completed", "", 1, "Finished"]),
    # what the forecasts learn from (stop 46, tests/sim/test_forecast_learns_from.py)
    ("forecastLearnsFrom", "forecast_learns_from", "arrivals", "finished", ["metric", "", 0, "Finished"]),
]


@pytest.mark.parametrize(("field", "attribute", "default", "other", "bads"), FIELDS, ids=[f[0] for f in FIELDS])
def test_the_default_and_the_other_value(field: str, attribute: str, default: str, other: str, bads: list) -> None:  # type: ignore[type-arg]
    parsed = [parse_scenario(scenario_with(**{field: value})).services[0].simulation for value in (None, other)]
    assert [getattr(p, attribute) for p in parsed] == [default, other]


@pytest.mark.parametrize(("field", "bad"), [(f[0], bad) for f in FIELDS for bad in f[4]], ids=lambda v: repr(v))
def test_a_bad_value_names_the_field(field: str, bad: object) -> None:
    with pytest.raises(ScenarioError, match=field):
        parse_scenario(scenario_with(**{field: bad}))
