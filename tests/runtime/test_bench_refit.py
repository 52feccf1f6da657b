"""The refit benchmark's --quick mode runs, so the benchmark cannot rot (its figures are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_refit


def test_quick_refit_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "refit.json"
    assert bench_refit.main(["--quick", "--series", "6", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    for expected in ("s per round", "last_value", "holt_winters", "speed-up", "peak RSS"):
        assert expected in out
    assert out_json.read_text().count('"workers"') == 2 * len(bench_refit.QUICK_MODELS)
