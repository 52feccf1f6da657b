"""Keep the observe benchmark runnable: its --quick mode runs here, against a real Prometheus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_observe.py"


def test_bench_observe_quick(prom_binaries: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--ticks", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    assert figures["queries_per_tick"] == 7
    assert figures["gpus_observed"] == figures["gpus"] == 2000
    assert figures["services_stale"] == 0
    assert "seconds_per_tick_median" in proc.stdout
