"""Benchmark (issue 14): the default forecaster, chosen by measurement on every shared serving trace.

The controller and the simulator use one default model (``forecast.model`` / a scenario's ``forecasting.model``).
This compares the two cheap candidates a default can be, ``last_value`` and ``phase_naive`` (the last value, with
quantiles learnt per phase of the windows the demand jumps at, when the history shows such windows), by rolling-origin
backtest on every trace of the predictive trace matrix (``benchmarks/traces_matrix.py``: ServeGen language, reason
and multimodal, Azure LLM conv and code, Alibaba GenAI 2026 QPS, the Azure Functions sample summed), at 60 s, over
the leads a cold start needs (1-5 minutes), refitting every hour and re-conditioning in between as the controller
does; on the whole trace and on its first 3 hours (a new service). Printed per trace: mean pinball loss at P99 and
P90 of both models (and the ratio phase_naive / last_value: below 1 = phase_naive better) and P99 coverage.

    python -m benchmarks.bench_default_model [--traces a,b] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.traces_matrix import SHARED_TRACES, SOURCES, _per_minute
from forecast.backtest import evaluate, rolling_origin_backtest
from forecast.registry import make_model

MODELS = ("last_value", "phase_naive")
LEVELS = (0.1, 0.5, 0.9, 0.99)
HORIZON_STEPS = 5  # 1-5 minutes at 60 s: the leads a cold start (plus metrics delay) needs
NEW_SERVICE_STEPS = 180  # the first 3 hours


def backtest(model: str, y: Any) -> dict[str, float]:
    n = len(y)
    origins = min(300, max(10, n // 2 - HORIZON_STEPS))
    every = max(1, (n // 2 - HORIZON_STEPS) // origins)
    started = time.perf_counter()
    result = rolling_origin_backtest(
        make_model(model, quantiles=LEVELS), y, step_s=60.0, horizon_steps=HORIZON_STEPS,
        n_origins=origins, origin_every=every, refit_every=60,
    )
    quality = {
        level: evaluate(model, result.actuals, result.predictions[i : i + 1], [level])
        for i, level in enumerate(result.levels)
    }
    return {
        "p99_pinball": quality[0.99].mean_pinball,
        "p90_pinball": quality[0.9].mean_pinball,
        "p99_coverage": quality[0.99].upper_coverage,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=",".join(SOURCES), help="comma-separated trace names")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    print("| trace | span | P99 pinball last_value | phase_naive | ratio | P90 pinball last_value | phase_naive | "
          "ratio | P99 coverage lv / pn |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.traces.split(","):
        y = _per_minute(SOURCES[name](Path(SHARED_TRACES)))
        spans = [("whole", y)]
        if y.size > NEW_SERVICE_STEPS + 20:
            spans.append(("first 3 h", y[:NEW_SERVICE_STEPS]))
        for span, values in spans:
            lv, pn = (backtest(m, values) for m in MODELS)
            row = {"trace": name, "span": span, "minutes": int(values.size), "last_value": lv, "phase_naive": pn}
            rows.append(row)
            print(
                f"| {name} | {span} ({values.size} min) | {lv['p99_pinball']:.4f} | {pn['p99_pinball']:.4f} | "
                f"{pn['p99_pinball'] / lv['p99_pinball']:.3f} | {lv['p90_pinball']:.4f} | {pn['p90_pinball']:.4f} | "
                f"{pn['p90_pinball'] / lv['p90_pinball']:.3f} | {lv['p99_coverage']:.3f} / {pn['p99_coverage']:.3f} |",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
