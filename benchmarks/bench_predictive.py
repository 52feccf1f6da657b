"""Benchmark (issue 5): every policy on real traces at several cold starts.

Traces: ServeGen language/m-large (14 days, summed across clients; the packaged trace), Azure LLM inference 2023
conv and code (about 1 hour each, request logs binned at 15 s; packaged). Cold starts 30 s, 90 s and 300 s.
For each: share of requests within the SLO and GPU-hours / oracle for oracle, predictive, reactive, hpa, static,
and the predictive policy's forecast error at its lead time. Target for predictive at 90 s: >= 99.5 % of requests
within SLO at <= 1.10x the oracle's GPU-hours, and fewer GPU-hours than hpa at equal or better SLO attainment.

    python -m benchmarks.bench_predictive [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from autoscaler.sim.policies import POLICY_NAMES
from autoscaler.sim.run import run_scenario
from autoscaler.sim.scenario import parse_scenario

# Per trace: packaged trace, rate scale, forecasting history (s), minimum history (s), scale-down window (s).
# Azure traces last an hour: forecasts start after 5 minutes, and their bursty traffic keeps the HPA's 300 s
# scale-down window (ServeGen's smoother demand is run with 60 s, as in the packaged default scenario).
TRACES: dict[str, dict[str, Any]] = {
    "servegen-m-large": {"trace": "builtin:servegen-m-large", "scale": 0.1, "history": 7 * 86400.0, "min": 1800.0,
                         "down": 60},
    "azure-conv": {"trace": "builtin:azure-llm-2023-conv", "scale": 1.0, "history": 3600.0, "min": 300.0,
                   "down": 300},
    "azure-code": {"trace": "builtin:azure-llm-2023-code", "scale": 1.0, "history": 3600.0, "min": 300.0,
                   "down": 300},
}


def scenario(spec: dict[str, Any], cold_start: float, duration: float | None) -> dict[str, Any]:
    trace, scale, history = spec["trace"], spec["scale"], spec["history"]
    data: dict[str, Any] = {
        "name": f"{trace}-cold{cold_start:g}",
        "stepSeconds": 15,
        "metricsDelaySeconds": 30,
        "nodePools": [
            {"name": "onprem", "gpusPerNode": 8, "nodes": 3},
            {"name": "burst", "gpusPerNode": 8, "nodes": 0, "burst": True, "maxNodes": 4, "bootSeconds": 300,
             "pricePerGpuHour": 4.1},
        ],
        "forecasting": {"model": "last_value", "refitSeconds": 3600 if history > 3600 else 600,
                        "updateSeconds": 300 if history > 3600 else 60, "historySeconds": history,
                        "minHistorySeconds": spec["min"]},
        "services": [
            {
                "metadata": {"name": "chat", "namespace": "bench"},
                "spec": {
                    "targetRef": {"name": "chat"},
                    "minReplicas": 1,
                    "maxReplicas": 40,
                    "metric": {"type": "request_rate", "target": 2.9},
                    "latency": {"sloSeconds": 4.0},
                    "coldStartSeconds": cold_start,
                    "forecast": {"mode": "active", "quantile": 0.95},
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": spec["down"]}},
                },
                "simulation": {"trace": trace, "traceScale": scale, "throughputPerReplica": 3.5,
                               "baseLatencySeconds": 2.0},
            }
        ],
    }
    if duration is not None:
        data["durationSeconds"] = duration
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 day of ServeGen, one cold start (smoke run)")
    parser.add_argument("--json", type=Path, help="write all figures as JSON here")
    parser.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated subset of {', '.join(TRACES)}")
    args = parser.parse_args(argv)
    cold_starts = (90.0,) if args.quick else (30.0, 90.0, 300.0)
    results: dict[str, Any] = {}
    print(f"{'trace':<17} {'cold':>5}  " + "  ".join(f"{name:>19}" for name in POLICY_NAMES) + "   fc MAE   secs")
    print(f"{'':<17} {'s':>5}  " + "  ".join(f"{'SLO   GPUh/oracle':>19}" for _ in POLICY_NAMES))
    for trace_name in args.traces.split(","):
        spec = TRACES[trace_name]
        for cold in cold_starts:
            duration = 86400.0 if args.quick and trace_name.startswith("servegen") else None
            data = scenario(spec, cold, duration)
            began = time.perf_counter()
            result = run_scenario(parse_scenario(data), Path("."), POLICY_NAMES)
            seconds = time.perf_counter() - began
            figures = result.report["policies"]
            results[f"{trace_name}/cold{cold:g}"] = figures
            cells = [
                f"{figures[n]['slo_attainment']:>8.2%} {figures[n]['gpu_hours_vs_oracle']:>9.3f}x" for n in POLICY_NAMES
            ]
            mae = figures["predictive"]["forecast_mae"]
            print(f"{trace_name:<17} {cold:>5g}  " + "  ".join(cells) + f"   {mae if mae is None else f'{mae:6.2f}'}"
                  f"  {seconds:5.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
