"""Review 32 of the scenario parser: each test reproduces a defect found in the review (it failed before the fix).

The rule: bad input gets a clear error naming the field and the problem, at parse time, never a traceback later.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.sim.scenario import ScenarioError, default_scenario_path, load_scenario, parse_scenario
from tests.sim.conftest import scenario_dict, write_rate_trace


def _refused(data: dict[str, Any], *expected: str) -> str:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    message = str(error.value)
    for text in expected:
        assert text in message, message
    return message


# ---- training.generate.podsWeights whose sum overflows ---------------------------------------------------------------


def _generated(weights: list[float]) -> dict[str, Any]:
    data = scenario_dict("trace.csv")
    data["training"] = {
        "generate": {"pods": [1, 2], "podsWeights": weights, "count": 3, "meanInterarrivalSeconds": 60}
    }
    return data


def test_pods_weights_whose_sum_overflows_are_refused_naming_the_field() -> None:
    """Defect: two finite weights of 1e308 were accepted; their sum is inf, every normalised weight 0, and
    ``autoscaler simulate`` died in numpy (``ValueError: Probabilities do not sum to 1``) with a traceback."""
    _refused(_generated([1e308, 1e308]), "training.generate", "podsWeights", "finite")


@pytest.mark.parametrize("weights", [[0.6, 0.4], [1.0, 0.0], [1e300, 1e300], [5e-324, 5e-324]])
def test_pods_weights_that_normalise_are_still_accepted(weights: list[float]) -> None:
    parse_scenario(_generated(weights))


def test_simulate_with_overflowing_weights_exits_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autoscaler.cli import main

    write_rate_trace(tmp_path / "trace.csv", [10.0] * 30)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(_generated([1e308, 1e308])), encoding="utf-8")
    code = main(["simulate", str(path), "--policies", "static", "--no-plot", "--no-progress",
                 "--json", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "training.generate" in err and "podsWeights" in err


# ---- settings of a node pool that does not burst, silently ignored -------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("pricePerGpuHour", 3.0), ("bootSeconds", 120), ("scaleDownUnneededSeconds", 60)],
)
def test_burst_settings_on_a_pool_that_does_not_burst_are_refused(key: str, value: float) -> None:
    """Defect: only ``maxNodes`` was refused on a pool without ``burst: true``; a price (the report's costs count
    burst pools only: an on-prem price of 3 $/GPU-hour silently cost nothing), a boot time or a scale-down delay (such
    a pool never adds or removes a node) were accepted and ignored."""
    data = scenario_dict("trace.csv")
    data["nodePools"][0][key] = value
    _refused(data, f"nodePools.0.{key}", "burst: true")


@pytest.mark.parametrize(
    ("key", "value"),
    [("pricePerGpuHour", 0), ("pricePerGpuHour", 0.0)],
)
def test_a_zero_price_on_a_pool_that_does_not_burst_is_accepted(key: str, value: float) -> None:
    """The packaged scenarios write ``pricePerGpuHour: 0`` on their on-prem pool: that says what the report does."""
    data = scenario_dict("trace.csv")
    data["nodePools"][0][key] = value
    parse_scenario(data)


def test_burst_settings_on_a_burst_pool_are_accepted() -> None:
    data = scenario_dict("trace.csv")
    data["nodePools"][1].update({"pricePerGpuHour": 3.0, "bootSeconds": 60, "scaleDownUnneededSeconds": 60})
    parse_scenario(data)


# ---- a service's apiVersion ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", ["gpuautoscaler.dev/v1alpah1", "gpuautoscaler.dev/v1beta1", "v1", ""])
def test_a_wrong_api_version_is_refused_naming_it(api_version: str) -> None:
    """Defect: ``kind`` had to be GPUScalingPolicy, but any ``apiVersion`` was accepted (a typo included), although
    the services are the custom resources the controller reads and a cluster refuses another version."""
    data = scenario_dict("trace.csv")
    data["services"][0]["apiVersion"] = api_version
    _refused(data, "services.0.apiVersion", "gpuautoscaler.dev/v1alpha1")


def test_the_api_version_may_be_given_or_left_out() -> None:
    data = scenario_dict("trace.csv")
    parse_scenario(data)
    given = copy.deepcopy(data)
    given["services"][0]["apiVersion"] = "gpuautoscaler.dev/v1alpha1"
    parse_scenario(given)


def test_the_packaged_scenarios_stay_valid() -> None:
    for path in sorted(default_scenario_path().parent.glob("*.yaml")):
        load_scenario(path)


def test_the_accepted_api_version_is_the_controllers() -> None:
    from autoscaler.policy import API_GROUP, API_VERSION
    from autoscaler.sim.scenario import ServiceEntry

    assert ServiceEntry.model_fields["api_version"].default == f"{API_GROUP}/{API_VERSION}"
    data = scenario_dict("trace.csv")
    data["services"][0]["apiVersion"] = f"{API_GROUP}/{API_VERSION}"
    parse_scenario(data)


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("servegen-m-large", "servegen-m-large-14d-60s.csv.gz"),
        ("servegen-m-large-14d-60s", "servegen-m-large-14d-60s.csv.gz"),
        ("philly-runtimes", "philly-runtimes-2000.csv.gz"),
        ("azure-llm-2023-conv", "azure-llm-2023-conv.csv.gz"),
        ("s", None),  # a prefix picked the servegen trace by chance
        ("servegen", None),
        ("azure-llm-2023-c", None),
        ("servegen-m-large-14d", None),
    ],
)
def test_a_builtin_trace_is_named_whole_not_by_a_prefix(name: str, file: str | None) -> None:
    from autoscaler.sim.run import resolve_trace

    if file is None:
        with pytest.raises(ScenarioError, match="no packaged trace of that name"):
            resolve_trace(f"builtin:{name}", Path("."))
    else:
        assert resolve_trace(f"builtin:{name}", Path(".")).name == file


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        (
            {
                "jobs": [
                    {"name": "a", "workSeconds": 60}, {"name": "b", "workSeconds": 60}, {"name": "a", "workSeconds": 9}
                ]
            },
            "jobs.2.name: 'a' is the name of an earlier job",
        ),
        (
            {"jobs": [{"name": "gen-0001", "workSeconds": 60}], "generate": {"runtimes": "builtin:philly-runtimes",
                                                                          "count": 3}},
            "jobs.0.name: 'gen-0001' is the name of a generated job",
        ),
    ],
)
def test_duplicate_training_job_names_are_refused_at_load_naming_the_job(
    training: dict[str, Any], expected: str
) -> None:
    """Duplicate names were refused only after the runtime trace was read, with no job named."""
    data = scenario_dict("trace.csv")
    data["training"] = training
    with pytest.raises(ScenarioError, match=expected):
        parse_scenario(data)
