"""``autoscaler backtest``: options, table, JSON, and errors, on small canonical trace files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoscaler.cli import main
from tests.forecast.conftest import daily_series


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Three days of a daily cycle at 600 s, as a canonical rate series."""
    y = daily_series(days=3.0, noise=8.0)
    path = tmp_path / "rates.csv"
    lines = ["timestamp,rate"] + [f"{i * 600},{v:.3f}" for i, v in enumerate(y)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_table_and_json(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bt.json"
    code = main(
        [
            "backtest",
            str(trace),
            "--models",
            "last_value,holt_winters",
            "--horizon",
            "3600",
            "--origins",
            "6",
            "--origin-every",
            "1800",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "432 steps of 600 s" in text
    assert "horizon 6 steps (3600 s), 6 origins every 1800 s" in text
    for column in ("MAE", "pinball/base", "P10-P90 cov", "P90 cov", "fit s"):
        assert column in text
    names = ("last_", "holt", "seas")
    rows = {line.split()[0].rstrip("*"): line for line in text.splitlines() if line.startswith(names)}
    assert set(rows) == {"seasonal_naive", "last_value", "holt_winters"}  # the baseline is always added
    assert "1.000" in rows["seasonal_naive"]
    payload = json.loads(out.read_text())
    assert payload["horizon_steps"] == 6 and payload["step_s"] == 600.0
    assert len(payload["origin_times"]) == 6
    assert payload["origin_times"][1] - payload["origin_times"][0] == 1800.0
    models = {m["name"]: m for m in payload["models"]}
    assert models["seasonal_naive"]["pinball_ratio"] == pytest.approx(1.0)
    assert models["holt_winters"]["n"] == 36
    assert 0.0 <= models["holt_winters"]["upper_coverage"] <= 1.0
    # Holt-Winters smooths the noise that copying yesterday doubles.
    assert models["holt_winters"]["pinball_ratio"] < 1.0
    assert payload["best"] in models


def test_step_option_resamples(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backtest", str(trace), "--models", "last_value", "--step", "1200", "--origins", "3"]) == 0
    assert "216 steps of 1200 s" in capsys.readouterr().out


def test_refit_every_and_train_window(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "bt.json"
    args = ["backtest", str(trace), "--models", "holt_winters", "--origins", "6", "--refit-every", "3"]
    assert main([*args, "--train-window", "86400", "--json", str(out)]) == 0
    models = {m["name"]: m for m in json.loads(out.read_text())["models"]}
    assert models["holt_winters"]["fits"] == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--models", "prophet"], "unknown model"),
        (["--horizon", "0"], "--horizon must be a positive"),
        (["--quantiles", "0.5,1.5"], "--quantiles"),
        (["--origins", "0"], "--origins"),
    ],
)
def test_bad_options_exit_2(trace: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backtest", str(trace), *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backtest", str(tmp_path / "nope.csv")]) == 2
    assert "error" in capsys.readouterr().err


def test_help_names_units_and_models(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["backtest", "--help"])
    text = capsys.readouterr().out
    for needle in ("--horizon SECONDS", "--step SECONDS", "--origins N", "--json OUT", "quantile_gbm", "in seconds"):
        assert needle in text


def test_short_request_log_uses_the_naive_fallback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    times = np.sort(1_700_000_000 + rng.uniform(0, 1800, 3000))
    path = tmp_path / "log.csv"
    path.write_text("timestamp\n" + "\n".join(f"{t:.3f}" for t in times) + "\n")
    code = main(["backtest", str(path), "--models", "last_value", "--step", "10", "--horizon", "120", "--origins", "5"])
    assert code == 0
    assert "SeasonalNaive(1d)->naive" in capsys.readouterr().out
