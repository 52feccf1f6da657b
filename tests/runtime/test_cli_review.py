"""Findings of a review of the CLI against the README: exit codes that disagreed with the rest of the project, and a
``--help`` that contradicted itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("AUTOSCALER_"):
            monkeypatch.delenv(key)


def test_backtest_trace_shorter_than_the_horizon_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace too short for --horizon was reported as "baseline seasonal_naive failed" with exit 1 (a failed run),
    while every other bad input of the command (and of the project) exits 2 naming what to change."""
    trace = tmp_path / "short.csv"
    trace.write_text("timestamp,rate\n0,1\n60,2\n120,3\n")
    assert main(["backtest", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "--horizon" in err and "short.csv" in err and "3 steps" in err
    assert "baseline" not in err and "Traceback" not in err


def test_backtest_trace_just_long_enough_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "ok.csv"
    trace.write_text("timestamp,rate\n" + "".join(f"{60 * i},{1 + i % 3}\n" for i in range(4)))
    assert main(["backtest", str(trace), "--models", "last_value", "--horizon", "180", "--origins", "1"]) == 0
    assert "selected:" in capsys.readouterr().out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    env.update({"PYTHONPATH": str(REPO), "AUTOSCALER_PROMETHEUS_URL": "http://127.0.0.1:9"})
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_run_without_a_cluster_configuration_exits_2_as_plan_does(tmp_path: Path) -> None:
    """``plan`` exits 2 when there is no cluster configuration (a kubeconfig that does not exist); ``run`` exited 1,
    the code its help gives to a tick that could not read, although it is a setting that will not fix itself."""
    missing = str(tmp_path / "no-such-kubeconfig")
    plan = _cli("plan", "--kubeconfig", missing)
    assert plan.returncode == 2 and "does not exist" in plan.stderr, plan.stderr
    run = _cli("run", "--once", "--kubeconfig", missing)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, run.stdout + run.stderr
    assert "does not exist" in run.stdout + run.stderr


def test_run_help_lists_the_exit_code_of_a_missing_cluster_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "2 invalid settings or no cluster configuration" in " ".join(capsys.readouterr().out.split())


def test_observe_help_states_no_default_of_none(capsys: pytest.CaptureFixture[str]) -> None:
    """``observe --help`` said "default: now (default: None)" for --time, and "(default: None)" for options whose
    default comes from the AUTOSCALER_PROMETHEUS_* settings."""
    with pytest.raises(SystemExit):
        main(["observe", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: [])" not in text
    assert "AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS" in text and "default: table" in text and "default: 50" in text


def test_observe_refuses_an_empty_bearer_token_file(capsys: pytest.CaptureFixture[str]) -> None:
    """``--bearer-token-file ""`` was parsed to ``Path(".")`` before the settings' empty-path check could see it, so
    the working directory was read as the token file at the first request, the error naming no option."""
    assert main(["observe", "--prometheus-url", "http://127.0.0.1:9", "--bearer-token-file", ""]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert "bearer_token_file" in text and "must not be empty" in text, text
