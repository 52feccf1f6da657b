"""The forecast benchmark in --quick mode, so it cannot rot (figures are not asserted: speed is not a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_forecast

pytestmark = pytest.mark.skipif(
    not list(bench_forecast.TRACES.glob(bench_forecast.SERVEGEN_GLOB)), reason="shared traces not available"
)


def test_quick_benchmark_runs_and_reports_every_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert bench_forecast.main(["--quick", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [b["trace"].split(" (")[0] for b in payload["backtests"]] == [
        "ServeGen m-large",
        "Azure LLM 2023 conv",
        "Azure LLM 2023 code",
    ]
    for report in payload["backtests"]:
        rows = {row["model"]: row for row in report["rows"]}
        assert set(rows) == set(bench_forecast.MODELS)
        assert all("error" not in row for row in rows.values()), rows
        assert rows[report["baseline"]]["pinball_ratio"] == pytest.approx(1.0)
    assert payload["backtests"][1]["baseline_label"] == "SeasonalNaive(1d)->naive"
    refit = payload["refit"]
    assert refit["series"] == 6 and refit["workers"] == 2
    assert set(refit["models"]) == set(bench_forecast.MODELS)
    assert all(m["failures"] == 0 for m in refit["models"].values())
    assert "Refit cost" in capsys.readouterr().out


def test_servegen_sum_matches_the_documented_trace() -> None:
    total, start = bench_forecast.servegen_total()
    assert total.size == 2016 and start == 0.0  # 14 days of 600 s windows
    assert 150 < float(sum(sorted(total)[1007:1009]) / 2) < 220  # SOURCES.md: aggregate median ~187 req/s
    assert 500 < total.max() < 650  # ~583 req/s


def test_azure_binning_conserves_requests() -> None:
    rates, start = bench_forecast.azure_rates("code", step_s=10.0)
    assert round(rates.sum() * 10) == 8819  # rows in the code trace
    assert start % 10 == 0
