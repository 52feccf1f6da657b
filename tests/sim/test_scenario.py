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
        ("stepSeconds", 0, "stepSeconds: Input should be greater than or equal to 1"),
        ("nodePools", [], "nodePools: List should have at least 1 item"),
        ("nodePools.0.gpusPerNode", "eight", "nodePools.0.gpusPerNode: Input should be a valid integer"),
        ("services.0.spec.maxReplicas", 0, "services.0.spec.maxReplicas: Input should be greater than or equal to 1"),
        ("services.0.spec.minReplicas", 50, "minReplicas (50) must be <= maxReplicas (30)"),
        ("services.0.spec.metric.type", "cpu", "services.0.spec.metric.type: Input should be 'gpu_utilization'"),
        ("services.0.spec.metric", {"type": "gpu_utilization", "target": 150}, "must be <= 100"),
        ("services.0.spec.latency", _DELETE, "spec.latency.sloSeconds is required"),
        ("services.0.spec.latency", {"sloSeconds": 0.5}, "must exceed simulation.baseLatencySeconds"),
        ("services.0.spec.replicas", 3, "services.0.spec.replicas: Extra inputs are not permitted"),
        ("services.0.simulation.throughputPerReplica", -1, "throughputPerReplica: Input should be greater than or "),
        ("nodePools.1.maxNodes", _DELETE, None),  # valid: a burst pool without maxNodes stays at its nodes
        ("forecasting", {"model": "prophet"}, "forecasting: model: unknown forecaster 'prophet'"),
        ("forecasting", {"model": "phase_naive", "modelParams": {"perod_s": 600}}, "modelParams: PhaseNaive.__init__"),
        ("forecasting", {"model": "phase_naive", "modelParams": {"period_s": 600}}, None),
        ("forecasting", {"model": "last_value", "modelParams": {"quantiles": [0.5]}}, "modelParams: quantiles come"),
        # More minimum history than the training window keeps: predictive never forecast (replayed reactive)
        ("forecasting", {"historySeconds": 3600, "minHistorySeconds": 18000},
         "forecasting: minHistorySeconds (18000) must be <= historySeconds (3600)"),
        ("forecasting", {"historySeconds": 3600, "minHistorySeconds": 3600}, None),
        # Per-replica targets and rates: at least 1e-06 (smaller ones round to 0 at the untrusted target ratio)
        ("services.0.spec.metric", {"type": "request_rate", "target": 5e-324},
         "services.0.spec.metric.target: Input should be greater than or equal to 0.000001"),
        ("gpuScoring", "BinPack", "gpuScoring: Input should be 'LeastAllocated', 'MostAllocated' or 'Fragmentation'"),
        ("gpuScoring", "Fragmentation", None),
        ("gpuScoring", "MostAllocated", None),
        ("rebalance", {"enabled": True}, None),
        ("rebalance", {"enabled": 1}, "rebalance.enabled: Input should be true or false"),
        ("rebalance", {"maxMovesPerHour": -2}, "rebalance.maxMovesPerHour: Input should be greater than or equal to 0"),
        ("rebalance", {"maxMovesPerPass": 9}, "rebalance: maxMovesPerPass (9) must be <= maxMovesPerHour (8)"),
        ("rebalance", {"burstEmptyBelow": -0.1}, "rebalance.burstEmptyBelow: Input should be greater than or equal"),
        ("rebalance", {"every": 60}, "rebalance.every: Extra inputs are not permitted"),
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


def _pools(*pools: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": f"p{i}", **pool} for i, pool in enumerate(pools)]


def _jobs(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": [{"name": f"j{i}", "workSeconds": 3600, **job} for i, job in enumerate(jobs)]}


EMPTY_POLICIES = "at least one rate policy (omit it for the defaults, or selectPolicy: Disabled)"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        # A policy the HPA API would refuse: an empty rate-policy list never scales in that direction.
        ("services.0.spec.behavior", {"scaleUp": {"policies": []}},
         f"services.0.spec.behavior.scaleUp.policies: {EMPTY_POLICIES}"),
        ("services.0.spec.behavior", {"scaleDown": {"policies": []}},
         f"services.0.spec.behavior.scaleDown.policies: {EMPTY_POLICIES}"),
        ("services.0.spec.behavior", {"scaleDown": {"selectPolicy": "Disabled"}}, None),
        # A replica that fits no node pool's nodes is never placed (the run reported 0 % within SLO).
        ("services.0.spec.gpusPerReplica", 16,
         "services.0.spec.gpusPerReplica (16) exceeds every node pool's gpusPerNode (8)"),
        ("services.0.spec.gpusPerReplica", 8, None),
        # p1 (16 GPUs a node) never has a node
        ("nodePools", _pools({"gpusPerNode": 8, "nodes": 2}, {"gpusPerNode": 16, "nodes": 0}),
         "services.0.spec.gpusPerReplica (16) exceeds the gpusPerNode (8) of node pool 'p0', the only pool that can"),
        ("nodePools", _pools({"gpusPerNode": 8, "nodes": 2}, {"gpusPerNode": 16, "nodes": 0, "burst": True,
                                                              "maxNodes": 1}), None),  # p1 can burst: it fits
        ("nodePools", _pools({"gpusPerNode": 8, "nodes": 2}, {"gpusPerNode": 16, "nodes": 1}), None),
        ("nodePools", _pools({"gpusPerNode": 8, "nodes": 2}, {"gpusPerNode": 4, "nodes": 2}),
         "services.0.spec.gpusPerReplica (16) exceeds every node pool's gpusPerNode (at most 8)"),
        # A training gang that can never be placed whole never finishes (burst pools take inference only: the
        # fixed pool's 2 nodes are all training has).
        ("training", _jobs({"gpusPerPod": 64}),
         "training.jobs.0.gpusPerPod (64) exceeds the gpusPerNode (8) of node pool 'fixed', the only pool training "
         "can use (burst pools take inference only): the job could never start"),
        ("training", _jobs({"gpusPerPod": 8, "pods": 3}),
         "training.jobs.0.pods (3) x gpusPerPod (8): the node pools training can use (not the burst pools) hold at "
         "most 2 such pods at once"),
        ("training", _jobs({"gpusPerPod": 8, "pods": 2}), None),
        ("training", {"generate": {"gpusPerPod": 16}},
         "training.generate.gpusPerPod (16) exceeds the gpusPerNode (8) of node pool 'fixed'"),
        ("training", {"generate": {"pods": [1, 8], "podsWeights": [1.0, 0.0]}}, None),  # 8 is never drawn
        ("training", {"generate": {"pods": [1, 8]}}, "training.generate.pods (8) x gpusPerPod (8)"),
        # A cluster that can never have a node places nothing.
        ("nodePools", _pools({"nodes": 0}),
         "nodePools: no pool can ever have a node (every pool has nodes: 0, and none is a burst pool"),
        ("nodePools", _pools({"nodes": 0}, {"nodes": 0, "burst": True}), "nodePools: no pool can ever have a node"),
        ("nodePools", _pools({"nodes": 0}, {"nodes": 0, "burst": True, "maxNodes": 1}), None),
        # maxNodes on a pool that does not burst was silently ignored.
        ("nodePools.0.maxNodes", 4,
         "nodePools.0.maxNodes: 4 has no effect without burst: true (a pool that does not burst keeps its nodes)"),
        ("nodePools.1.burst", False, "nodePools.1.maxNodes: 2 has no effect without burst: true"),
    ],
)
def test_scenarios_that_could_never_place_or_scale_are_refused(path: str, value: Any, expected: str | None) -> None:
    data = mutate(path, value)
    if path == "nodePools" and any("gpusPerNode" in pool for pool in value):
        data["services"][0]["spec"]["gpusPerReplica"] = 16  # a replica only the 16-GPU pool can host
    if expected is None:
        parse_scenario(data)
        return
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, "bad.yaml")
    message = str(caught.value)
    assert message.startswith("bad.yaml: invalid scenario\n  ")
    assert expected in message, message


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


# ---- issue 17, defects 5 and 6: hostile input to `autoscaler simulate` -----------------------------------------------
# Each runs the real command in-process: bad input is exit code 2 and a clear error naming the field, never a
# traceback (an exception escaping main() fails the test), and nothing is written outside the output folder.


def _simulate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from autoscaler.cli import main

    code = main(["simulate", *argv, "--policies", "static", "--no-plot", "--no-progress"])
    return code, capsys.readouterr().err


def _tiny(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    from tests.sim.conftest import write_rate_trace

    write_rate_trace(tmp_path / "trace.csv", [10.0] * 30)
    data = scenario_dict("trace.csv")
    data.update(overrides)
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _assert_clear_error(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err


def test_trace_path_that_is_a_directory_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _tiny(tmp_path)
    (tmp_path / "traces").mkdir()
    data["services"][0]["simulation"]["trace"] = "traces"
    code, err = _simulate([str(_write(tmp_path, data))], capsys)
    _assert_clear_error(code, err, "services.0.simulation.trace", "is a directory")


def test_scenario_that_is_not_utf8_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\nstepSeconds: 15\n")
    code, err = _simulate([str(path)], capsys)
    _assert_clear_error(code, err, "latin1.yaml:1:10", "not UTF-8")


def test_tiny_step_is_refused_before_anything_is_allocated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _simulate([str(_write(tmp_path, _tiny(tmp_path, stepSeconds=1.0e-09)))], capsys)
    _assert_clear_error(code, err, "stepSeconds")


def test_more_steps_than_the_maximum_are_refused_naming_step_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autoscaler.sim.scenario import MAX_STEPS

    data = _tiny(tmp_path, stepSeconds=1, durationSeconds=MAX_STEPS + 1)
    code, err = _simulate([str(_write(tmp_path, data))], capsys)
    _assert_clear_error(code, err, "stepSeconds", f"{MAX_STEPS:,}")


def test_boolean_step_is_not_a_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _simulate([str(_write(tmp_path, _tiny(tmp_path, stepSeconds=True)))], capsys)
    _assert_clear_error(code, err, "stepSeconds: Input should be a number, not a boolean")


def test_infinite_throughput_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny(tmp_path)
    data["services"][0]["simulation"]["throughputPerReplica"] = float("inf")
    code, err = _simulate([str(_write(tmp_path, data))], capsys)
    _assert_clear_error(code, err, "services.0.simulation.throughputPerReplica", "finite")


def test_name_cannot_escape_the_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "a" / "b" / "work"  # ../../evil from work/out lands in tmp_path/a, still inside tmp_path
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    path = _write(tmp_path, _tiny(tmp_path, name="../../evil"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, err = _simulate([str(path)], capsys)
    _assert_clear_error(code, err, "name")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_default_output_paths_stay_inside_the_output_folder(tmp_path: Path) -> None:
    """Second line of defence behind the name check: the writer refuses a path that resolves outside out/."""
    from autoscaler.commands.simulate import OutputPathError, default_output

    out = tmp_path / "out"
    assert default_output("ok-name", ".json", out) == out / "ok-name.json"
    for name in ("../evil", "../../evil", "/abs/evil", "a/../../evil", ""):
        with pytest.raises(OutputPathError, match="outside the output folder"):
            default_output(name, "" if name == "" else ".json", out)
    out.mkdir()
    (out / "planted.json").symlink_to(tmp_path / "elsewhere.json")  # a symlink left in the output folder
    with pytest.raises(OutputPathError, match="outside the output folder"):
        default_output("planted", ".json", out)


def test_scenario_name_must_be_a_safe_file_name() -> None:
    for name in ("../x", "..", ".hidden", "a/b", "/abs", "a\\b", "-x", "x" * 101, "new\nline", "a\x00b"):
        with pytest.raises(ScenarioError, match=r"name: .* is not a safe file name"):
            parse_scenario(scenario_dict("t.csv", name=name))
    for name in ("tiny", "v1.2_final", "builtin:servegen-m-large-cold90", "x" * 100):
        assert parse_scenario(scenario_dict("t.csv", name=name)).name == name


def test_the_run_size_limits_are_documented_in_the_help() -> None:
    from autoscaler.cli import build_parser
    from autoscaler.sim.scenario import MAX_REPLICA_STEPS, MAX_SERVICE_STEPS, MAX_STEPS

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    description = " ".join(subparsers.choices["simulate"].description.split())
    for limit in (MAX_STEPS, MAX_SERVICE_STEPS, MAX_REPLICA_STEPS):
        assert f"{limit:,}" in description


def test_the_hpa_baseline_runs_without_a_behavior_block_unless_the_scenario_gives_it_one() -> None:
    from autoscaler.sim.policies import HpaBaseline
    from autoscaler.sim.registry import make_policy

    data = copy.deepcopy(scenario_dict("trace.csv"))
    assert parse_scenario(data).baselines.hpa_behavior is False
    data["baselines"] = {"hpaBehavior": True}
    assert parse_scenario(data).baselines.hpa_behavior is True
    data["baselines"] = {"hpaBehavior": 1}
    with pytest.raises(ScenarioError, match=r"baselines\.hpaBehavior"):
        parse_scenario(data)
    for behavior in (False, True):
        policy = make_policy("hpa", hpa_behavior=behavior)
        assert isinstance(policy, HpaBaseline) and policy.behavior is behavior


def test_rates_too_large_to_resample_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rates near float64's maximum pass the reader (finite, >= 0); resampling them to a coarser step overflowed
    outside the loader's error handling: a traceback and exit 1."""
    from tests.sim.conftest import write_rate_trace

    data = _tiny(tmp_path, stepSeconds=120)
    write_rate_trace(tmp_path / "trace.csv", [1e308, 1e308] + [1.0] * 198)
    code, err = _simulate([str(_write(tmp_path, data))], capsys)
    _assert_clear_error(code, err, "services.0.simulation.trace", "too large to resample")
