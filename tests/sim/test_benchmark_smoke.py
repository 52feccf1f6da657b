"""The simulator benchmark's --quick mode runs, so the benchmark cannot rot (its figures are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_simulate


def test_quick_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_simulate.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for expected in ("service-steps/s", "reactive", "hpa", "oracle", "peak RSS"):
        assert expected in out


def test_quick_predictive_benchmark_prints_every_policy_and_the_causal_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import bench_predictive

    argv = ["--quick", "--traces", "servegen-m-large,azure-conv", "--specs", "hot-p99,p95"]
    assert bench_predictive.main(argv) == 0
    out = capsys.readouterr().out
    for expected in ("predictive", "hpa", "hot-p99", "p95", "causal bound"):
        assert expected in out
    servegen_rows = [line for line in out.splitlines() if line.startswith("servegen-m-large")]
    azure_rows = [line for line in out.splitlines() if line.startswith("azure-conv")]
    assert len(servegen_rows) == 2 and len(azure_rows) == 2
    # ServeGen's 10-minute windows give a bound; the Azure request log has no window edges.
    assert all("margin" in row for row in servegen_rows)
    assert all("no change period" in row for row in azure_rows)


def test_quick_trace_matrix_prints_the_criteria_per_row(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_predictive, traces_matrix

    if not traces_matrix.SHARED_TRACES.is_dir():
        pytest.skip(f"{traces_matrix.SHARED_TRACES}: the public traces are not beside the clone")
    assert bench_predictive.main(["--matrix", "--quick", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    for expected in ("pred SLO", "hpa GPU-h÷o", "SLO≥hpa-0.1", "GPU≤hpa", "≥99.5%@90", "headroom", "wall time"):
        assert expected in out
    rows = [line for line in out.splitlines() if line.startswith(traces_matrix.QUICK_TRACES)]
    assert len(rows) == 2


def test_quick_arbitration_benchmark_prints_the_three_policies_and_the_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import bench_arbitration

    assert bench_arbitration.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for expected in ("predictive", "kube-preemption", "burst-only", "lowest mean total cost", "peak RSS"):
        assert expected in out


def test_arbitration_benchmark_runs_each_inference_path_and_prints_their_means(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import bench_arbitration

    argv = ["--quick", "--days", "0.05", "--paths", "base,scale0.09", "--policies", "predictive"]
    assert bench_arbitration.main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "paths ['base', 'scale0.09']" in lines[0]
    for path in ("base", "scale0.09"):
        assert any(line.split()[:3] == ["12", path, "predictive"] for line in lines)  # the run's row
        assert any(line.split()[:2] == [path, "predictive"] for line in lines)  # its mean per path
    for expected in ("mean over 2 run(s)", "spread across runs", "train done", "mean per path", "peak RSS"):
        assert expected in out


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--paths", "base,scalefoo", "scalefoo"),
        ("--paths", "warm60", "warm60"),
        ("--capacity", "chooseScaleDownReplica=true", "chooseScaleDownReplica"),
        ("--model-params", "reversion_period=6", "reversion_period"),
    ],
)
def test_arbitration_benchmark_refuses_an_unknown_name_before_running(
    capsys: pytest.CaptureFixture[str], option: str, value: str, named: str
) -> None:
    from benchmarks import bench_arbitration

    with pytest.raises(SystemExit) as exited:
        bench_arbitration.main(["--quick", option, value])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert named in captured.err and captured.out == ""


def test_quick_rebalance_benchmark_prints_every_configuration_and_holds_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import bench_rebalance

    assert bench_rebalance.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for expected in ("MostAllocated +rebalance", "LeastAllocated", "stranded", "moves/h max", "held", "peak RSS"):
        assert expected in out


def test_quick_actions_benchmark_prints_the_budget_and_every_bracket(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import json

    from benchmarks import bench_actions

    out_json = tmp_path / "actions.json"
    assert bench_actions.main(["--quick", "--days", "0.25", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    for expected in ("budget", "clairvoyant", "smoothed in hindsight", "tuned causal", "peak RSS"):
        assert expected in out
    figures = json.loads(out_json.read_text())
    for rows in figures["smoothing"].values():
        for row in rows:
            low, high = row["gpu_hours_vs_oracle"]
            assert low <= high + 1e-9
            assert row["changes"] <= row["changes_allowed"]
