"""Benchmark: capacity arbitration on the packaged mixed scenario (inference + training on a full cluster).

For this project's controller (``predictive``: forecasts + capacity arbitration) and the two baselines beside it --
``kube-preemption`` (the same replica scaling, the kube-scheduler's pod-by-pod DefaultPreemption and a
Cluster-Autoscaler-like node loop) and ``burst-only`` (no preemption, the node loop alone) -- over several training
seeds (the jobs drawn from the Philly runtimes) and, with ``--paths``, several inference paths (the scenario's one
inference service with its trace scaled or its cold start changed: where the replicas happen to sit decides how many
whole nodes training gets), it prints: share of requests within the SLO, training GPU-hours done and lost, gangs
stopped, burst GPU-hours and money, the total cost in one currency (burst money + lost training GPU-hours x their
value + requests outside the SLO), then the means over all runs, the spread of training done and total cost across
runs, the means per path (more than one path), the ratio of lost work against ``kube-preemption``, the median wall
time per run and the peak RSS.

    python -m benchmarks.bench_arbitration                  # 3 seeds, 3 days each (about 4 minutes here)
    python -m benchmarks.bench_arbitration --seeds 12 --days 1
    python -m benchmarks.bench_arbitration --paths wide --policies predictive,kube-preemption   # 6 paths x 3 seeds
    python -m benchmarks.bench_arbitration --paths base,scale0.08,cold60 --model-params reversion_periods=6
    python -m benchmarks.bench_arbitration --capacity chooseScaleDownReplicas=true
    python -m benchmarks.bench_arbitration --quick          # one seed, 6 hours (what the tests run)

Paths (``--paths``, comma-separated): ``base`` (the scenario as packaged), ``scaleX`` (the service's
``simulation.traceScale`` set to X, e.g. ``scale0.08``; the packaged one is 0.1), ``coldN`` (its
``spec.coldStartSeconds`` set to N, e.g. ``cold60``; packaged 90); ``wide`` is
``base,scale0.08,scale0.09,scale0.12,cold60,cold120``.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autoscaler.sim.run import run_scenario
from autoscaler.sim.scenario import SCENARIO_DIR, Scenario, load_scenario

POLICIES = ("predictive", "kube-preemption", "burst-only")
FIELDS = (
    ("slo_attainment", "in SLO", "{:.2%}"),
    ("training_gpu_hours", "train done", "{:,.0f}"),
    ("lost_training_gpu_hours", "train lost", "{:,.1f}"),
    ("preemptions", "stopped", "{:,d}"),
    ("burst_gpu_hours", "burst GPU-h", "{:,.1f}"),
    ("burst_cost", "burst $", "{:,.0f}"),
    ("total_cost", "total $", "{:,.0f}"),
)
PATH_PRESETS = {"wide": ("base", "scale0.08", "scale0.09", "scale0.12", "cold60", "cold120")}
_PATH = re.compile(r"(?P<kind>scale|cold)(?P<value>[0-9]+(?:\.[0-9]+)?)")


def parse_paths(text: str) -> list[str]:
    """The inference paths named in ``text`` (comma-separated, presets expanded, in order, each once)."""
    paths: list[str] = []
    for token in (part.strip() for part in text.split(",")):
        if not token:
            continue
        for name in PATH_PRESETS.get(token, (token,)):
            match = _PATH.fullmatch(name)
            if name != "base" and (match is None or float(match["value"]) <= 0):
                raise argparse.ArgumentTypeError(
                    f"unknown inference path {name!r}: expected base, scaleX (X > 0, e.g. scale0.08), "
                    f"coldN (N > 0 seconds, e.g. cold60) or one of the presets {', '.join(PATH_PRESETS)}"
                )
            if name not in paths:
                paths.append(name)
    if not paths:
        raise argparse.ArgumentTypeError("no inference path given")
    return paths


def parse_fields(text: str, *, json_values: bool) -> dict[str, Any]:
    """``key=value[,key=value]`` as a dict; values parsed as JSON scalars with ``json_values`` (text when not JSON),
    else kept as text for pydantic to convert."""
    fields: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{item!r}: expected key=value")
        if json_values:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                parsed = value
            if isinstance(parsed, (dict, list)):
                raise argparse.ArgumentTypeError(f"{key}={value}: a scalar is expected (number, true/false, text)")
            fields[key] = parsed
        else:
            fields[key] = value
    return fields


def _validated(block: BaseModel, updates: dict[str, Any], what: str) -> Any:
    """``block`` with ``updates`` (by alias) validated as the scenario loader would (model_copy does not validate):
    an unknown or wrong field raises ValueError naming it."""
    try:
        return type(block).model_validate({**block.model_dump(by_alias=True), **updates})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join((what, *(str(p) for p in item['loc'])))}: {item['msg']}" for item in error.errors()
        )
        raise ValueError(problems) from None


def on_path(scenario: Scenario, path: str) -> Scenario:
    """``scenario`` with its single inference service on ``path`` (see the module's docstring)."""
    if path == "base":
        return scenario
    match = _PATH.fullmatch(path)
    assert match is not None, path
    if len(scenario.services) != 1:
        raise ValueError(f"path {path}: the scenario has {len(scenario.services)} services, the paths perturb one")
    service = scenario.services[0]
    value = float(match["value"])
    if match["kind"] == "scale":
        update = {"simulation": _validated(service.simulation, {"traceScale": value}, "simulation")}
    else:
        update = {"spec": _validated(service.spec, {"coldStartSeconds": value}, "spec")}
    entry = _validated(service, {k: v.model_dump(by_alias=True) for k, v in update.items()}, "service")
    return scenario.model_copy(update={"services": [entry]})


def _mean_cells(rows: list[dict[str, Any]]) -> str:
    means = {key: statistics.fmean(float(r[key]) for r in rows) for key, _, _ in FIELDS}
    return "".join(
        f" {(fmt.format(round(means[key])) if key == 'preemptions' else fmt.format(means[key])):>12}"
        for key, _, fmt in FIELDS
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="12,13,14", help="comma-separated training seeds")
    parser.add_argument("--days", type=float, default=None, help="simulated days per run (3; 0.25 with --quick)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--paths", default=["base"], type=parse_paths, metavar="PATH,...",
        help="inference paths, comma-separated: base, scaleX (traceScale X), coldN (coldStartSeconds N); "
        "preset wide = " + ",".join(PATH_PRESETS["wide"]),
    )
    parser.add_argument(
        "--model-params", default={}, type=lambda t: parse_fields(t, json_values=True), metavar="KEY=VALUE,...",
        help="forecaster constructor parameters set in forecasting.modelParams (JSON scalars), "
        "e.g. reversion_periods=6",
    )
    parser.add_argument(
        "--capacity", default={}, type=lambda t: parse_fields(t, json_values=False), metavar="FIELD=VALUE,...",
        help="override fields of the scenario's capacity block in every run (camelCase, as in the scenario file), "
        "e.g. chooseScaleDownReplicas=true",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one seed, 6 hours unless --days says (the test suite's smoke run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = "12"
    if args.days is None:
        args.days = 0.25 if args.quick else 3.0
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    policies = [p for p in args.policies.split(",") if p.strip()]
    paths: list[str] = args.paths

    base_scenario, base_dir = load_scenario(SCENARIO_DIR / "mixed-training.yaml")
    assert base_scenario.training is not None and base_scenario.training.generate is not None
    settings: list[str] = []
    try:
        if args.model_params:
            params = {**base_scenario.forecasting.model_params, **args.model_params}
            forecasting = _validated(base_scenario.forecasting, {"modelParams": params}, "forecasting")
            base_scenario = base_scenario.model_copy(update={"forecasting": forecasting})
            settings.append(f"modelParams {json.dumps(forecasting.model_params, sort_keys=True)}")
        if args.capacity:
            capacity = _validated(base_scenario.capacity, args.capacity, "capacity")
            base_scenario = base_scenario.model_copy(update={"capacity": capacity})
            settings.append("capacity " + ",".join(f"{k}={v}" for k, v in args.capacity.items()))
        scenarios = {path: on_path(base_scenario, path) for path in paths}
    except ValueError as exc:
        parser.error(str(exc))
    print(
        f"mixed-training: {args.days:g} days at {base_scenario.step_seconds:g} s, seeds {seeds}, "
        f"paths {paths}" + "".join(f"; {s}" for s in settings)
    )
    pw = max(4, *(len(p) for p in paths))
    header = (
        f"{'seed':>4} {'path':<{pw}} {'policy':<16}" + "".join(f" {label:>12}" for _, label, _ in FIELDS)
        + f" {'wall s':>7}"
    )
    print(header)
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    by_path: dict[tuple[str, str], list[dict[str, Any]]] = {(path, p): [] for path in paths for p in policies}
    keys: dict[str, list[tuple[int, str]]] = {p: [] for p in policies}
    walls: list[float] = []
    for seed in seeds:
        for path in paths:
            scenario = scenarios[path]
            assert scenario.training is not None and scenario.training.generate is not None
            generate = scenario.training.generate.model_copy(update={"seed": seed})
            training = scenario.training.model_copy(update={"generate": generate})
            scenario = scenario.model_copy(update={"training": training, "duration_seconds": args.days * 86400.0})
            for name in policies:
                started = time.perf_counter()
                result = run_scenario(scenario, Path(base_dir), (name,))
                wall = time.perf_counter() - started
                walls.append(wall)
                figures = result.report["policies"][name]
                results[name].append(figures)
                by_path[(path, name)].append(figures)
                keys[name].append((seed, path))
                cells = "".join(f" {fmt.format(figures[key]):>12}" for key, _, fmt in FIELDS)
                print(f"{seed:>4} {path:<{pw}} {name:<16}{cells} {wall:>7.1f}", flush=True)
    runs = len(seeds) * len(paths)
    print(f"mean over {runs} run(s) ({len(seeds)} seed(s) x {len(paths)} path(s))")
    means: dict[str, dict[str, float]] = {}
    for name in policies:
        means[name] = {key: statistics.fmean(float(r[key]) for r in results[name]) for key, _, _ in FIELDS}
        print(f"{'':>4} {'':<{pw}} {name:<16}{_mean_cells(results[name])}")
    print("spread across runs (min-max)")
    for name in policies:
        done = [float(r["training_gpu_hours"]) for r in results[name]]
        total = [float(r["total_cost"]) for r in results[name]]
        print(
            f"{'':>4} {'':<{pw}} {name:<16} train done {min(done):,.0f}-{max(done):,.0f} "
            f"({(max(done) - min(done)) / statistics.fmean(done):.1%} of the mean); "
            f"total $ {min(total):,.0f}-{max(total):,.0f}"
        )
    if len(paths) > 1:
        print(f"mean per path over {len(seeds)} seed(s)")
        for path in paths:
            for name in policies:
                print(f"{'':>4} {path:<{pw}} {name:<16}{_mean_cells(by_path[(path, name)])}")
    if "predictive" in means and "kube-preemption" in means:
        ours, kube = means["predictive"], means["kube-preemption"]
        kube_lost = kube["lost_training_gpu_hours"]
        ratio = ours["lost_training_gpu_hours"] / kube_lost if kube_lost else 0.0
        print(
            f"lost training GPU-hours, predictive / kube-preemption: {ratio:.2f} (target <= 0.5); "
            f"SLO {ours['slo_attainment']:.2%} vs {kube['slo_attainment']:.2%}"
        )
        paired = dict(zip(keys["kube-preemption"], results["kube-preemption"], strict=True))
        pairs = [(r, paired[k]) for k, r in zip(keys["predictive"], results["predictive"], strict=True)]
        cheaper = sum(1 for o, k in pairs if o["total_cost"] < k["total_cost"])
        print(f"predictive's total cost below kube-preemption's on {cheaper} of {len(pairs)} run(s) (same seed, path)")
        cheapest = min(means, key=lambda n: means[n]["total_cost"])
        print(f"lowest mean total cost: {cheapest} ({means[cheapest]['total_cost']:,.0f} $)")
    print(f"median wall per run {statistics.median(walls):.1f} s over {len(walls)} runs")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
