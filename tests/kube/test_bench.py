"""The Kubernetes benchmark keeps running (``--quick``), and its accounting adds up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_kube_quick(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_kube.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["gpu_nodes_read"] == 500 and summary["gpu_pods_read"] == 1995  # 5 evicted in the warm-up tick
    assert summary["policies"] == 100
    # 2,000 pods in pages of 500 (4 calls), 500 nodes (1), deployments, PDBs, priority classes, policies (1 each),
    # HPAs, Jobs (1 each) and JobSets, PyTorchJobs, TFJobs, Kueue Workloads (a 404 each: CRDs not installed)
    assert summary["read_calls_per_tick"] == 16
    assert summary["api_calls_per_tick"] == summary["read_calls_per_tick"] + summary["write_calls_per_tick"]
    assert summary["evicted_per_tick"] + summary["blocked_per_tick"] >= 5
    assert 0 < summary["seconds_per_tick_median"] < 30
    assert summary["peak_python_mib_one_tick"] > 0
