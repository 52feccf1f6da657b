"""The simulator benchmark's --quick mode runs, so the benchmark cannot rot (its figures are not asserted)."""

from __future__ import annotations

import pytest

from benchmarks import bench_simulate


def test_quick_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_simulate.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for expected in ("service-steps/s", "reactive", "hpa", "oracle", "peak RSS"):
        assert expected in out
