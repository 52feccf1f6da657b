"""Scenario files: bad input names the field and the problem."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from autoscaler.sim.scenario import ScenarioError, default_scenario_path, load_scenario, parse_scenario
from tests.sim.conftest import scenario_dict


def mutate(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(scenario_dict("trace.csv"))
    target: Any = data
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    last = parts[-1]
    if value is _DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("stepSeconds", 0, "stepSeconds: Input should be greater than 0"),
        ("nodePools", [], "nodePools: List should have at least 1 item"),
        ("nodePools.0.gpusPerNode", "eight", "nodePools.0.gpusPerNode: Input should be a valid integer"),
        ("services.0.spec.maxReplicas", 0, "services.0.spec.maxReplicas: Input should be greater than or equal to 1"),
        ("services.0.spec.minReplicas", 50, "minReplicas (50) must be <= maxReplicas (30)"),
        ("services.0.spec.metric.type", "cpu", "services.0.spec.metric.type: Input should be 'gpu_utilization'"),
        ("services.0.spec.metric", {"type": "gpu_utilization", "target": 150}, "must be <= 100"),
        ("services.0.spec.latency", _DELETE, "spec.latency.sloSeconds is required"),
        ("services.0.spec.latency", {"sloSeconds": 0.5}, "must exceed simulation.baseLatencySeconds"),
        ("services.0.spec.replicas", 3, "services.0.spec.replicas: Extra inputs are not permitted"),
        ("services.0.simulation.throughputPerReplica", -1, "throughputPerReplica: Input should be greater than 0"),
        ("nodePools.1.maxNodes", _DELETE, None),  # valid: a burst pool without maxNodes stays at its nodes
        ("forecasting", {"model": "prophet"}, "forecasting: model: unknown forecaster 'prophet'"),
        ("forecasting", {"model": "phase_naive", "modelParams": {"perod_s": 600}}, "modelParams: PhaseNaive.__init__"),
        ("forecasting", {"model": "phase_naive", "modelParams": {"period_s": 600}}, None),
        ("forecasting", {"model": "last_value", "modelParams": {"quantiles": [0.5]}}, "modelParams: quantiles come"),
    ],
)
def test_invalid_scenarios_name_field_and_problem(path: str, value: Any, expected: str | None) -> None:
    data = mutate(path, value)
    if expected is None:
        parse_scenario(data)
        return
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, "bad.yaml")
    message = str(caught.value)
    assert message.startswith("bad.yaml: invalid scenario")
    assert expected in message


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nnodePools: [\n  {name: a\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"broken.yaml:\d+:\d+: not valid YAML"):
        load_scenario(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.yaml")


def test_duplicate_services_rejected() -> None:
    data = scenario_dict("t.csv")
    data["services"].append(copy.deepcopy(data["services"][0]))
    with pytest.raises(ScenarioError, match="two services scale the same namespace/Deployment"):
        parse_scenario(data)


def test_packaged_default_scenario_is_valid() -> None:
    scenario, base = load_scenario(default_scenario_path())
    assert scenario.services[0].simulation.trace.startswith("builtin:")
    assert base == default_scenario_path().parent
