"""The trace matrix of ``bench_predictive.py --matrix`` (issue 14): every serving-like public trace, one scenario.

Each trace's request-rate series is derived at run time from the public files in ``../shared/traces`` (never copied
into this repository: the Alibaba GenAI trace is for research use only), scaled so that its mean equals the packaged
default scenario's mean demand (ServeGen m-large x 0.1, 19.6 req/s), and replayed through a scenario equal to the
packaged default (``autoscaler/sim/scenarios/default.yaml``: the same node pools and service spec -- request-rate
target 3.2, P95 latency SLO 4 s, active P99 ``phase_naive`` forecast, 60 s scale-down window) except:

- the trace (a rate-series CSV in a temporary directory) and its ``traceScale``;
- the forecasts learn from the finished requests (``simulation.forecastLearnsFrom: finished``), as the controller's
  history of its default counter reads them, not from the arrivals;
- the cold start (30, 90 or 300 s);
- for traces of an hour or less, the forecasting history the one-hour Azure rows of ``bench_predictive`` use (an hour
  of history, forecasts from 5 minutes, refit every 10 minutes);
- at a 300 s cold start, a 900 s forecast horizon (the default's 600 s does not reach now + cold start + node boot +
  update period, and a forecast that does not cover now + lead is unusable).

Traces (``name``: source; how the series is made):

- ``servegen-m-large`` / ``-reason`` / ``-multimodal``: ServeGen ``language/m-large`` (14 days), ``reason/deepseek-r1``
  (1 day), ``multimodal/mm-image`` (1 day); every client's arrivals drawn from its fitted inter-arrival distribution
  and summed per 60 s (``autoscaler.traces.convert.convert_servegen``, seed 0: the packaged default trace is this
  series for m-large);
- ``azure-llm-conv`` / ``-code``: Azure LLM inference 2023 request logs (about an hour), binned at 60 s
  (``read_azure_llm`` + ``bin_requests``);
- ``alibaba-genai-qps``: Alibaba GenAI 2026 ``qps.tar.gz`` (about 22 hours): the ``Generative Requests`` samples
  summed across containers per time step (57 s); a time step without a sample has no generative requests. The
  ``API Requests`` rows (the API layer's own count of much the same traffic, correlation 0.9) are left out;
  (:func:`read_genai_qps`, written here: the product has no reader for it);
- ``azure-functions``: the Azure Functions 2019 invitro sample, invocations of its 1,000 functions summed per minute
  (``read_azure_functions``);
- ``new-servegen-*``: the first hour of each ServeGen trace, a "new service" without history.
"""

from __future__ import annotations

import copy
import csv
import io
import math
import multiprocessing
import os
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import yaml

from autoscaler.traces.formats import RateSeries, TraceFormatError, bin_requests, load_trace, write_rate_series

#: Where the public traces live: ``../shared/traces`` beside the clone, or $GPU_AUTOSCALER_SHARED_TRACES.
SHARED_TRACES = Path(
    os.environ.get("GPU_AUTOSCALER_SHARED_TRACES", Path(__file__).resolve().parent.parent.parent / "shared" / "traces")
)
COLD_STARTS = (30.0, 90.0, 300.0)
DEFAULT_HPA_TARGET = 70.0  # percent GPU utilisation: the simulator's HPA baseline unless the scenario sets another
#: the HPA's frontier (``--hpa-frontier``): GPU utilisation targets, percent, besides the default 70
HPA_FRONTIER_TARGETS = (30.0, 40.0, 50.0, 60.0, 80.0)
POLICIES = ("oracle", "predictive", "hpa")
SLO_TOLERANCE = 0.001  # predictive's share within SLO may be this far below the HPA's (0.1 points)
SERVEGEN_TARGET = 0.995  # the share within SLO the ServeGen rows must reach at 90 s
SERVEGEN_TARGET_COLD = 90.0
NEW_SERVICE_S = 3600.0
SHORT_TRACE_S = 3600.0  # traces of at most this long get the one-hour forecasting history
HEADROOM_STATES = ("earned", "partial", "learning", "untrusted", "degraded")


# ---------------------------------------------------------------------------------------------------------------------
# Readers


def read_genai_qps(path: Path, request_type: str = "Generative Requests") -> RateSeries:
    """Alibaba GenAI 2026 ``qps.tar.gz`` (one CSV ``timestamp_anon,value,container_ip,request_type``): the ``value``
    of the rows of ``request_type`` summed across containers per time step, as a rate series on the samples' own grid
    (the smallest gap between distinct timestamps, 57 s upstream); a step without a row is 0."""
    with tarfile.open(path, "r:gz") as archive:
        members = [m for m in archive.getmembers() if m.isfile() and m.name.endswith(".csv")]
        if len(members) != 1:
            raise ValueError(f"{path}: expected one CSV in the archive, found {len(members)}")
        stream = archive.extractfile(members[0])
        assert stream is not None
        rows = list(csv.reader(io.TextIOWrapper(stream, encoding="utf-8")))
    header = [cell.strip() for cell in rows[0]]
    if header[:4] != ["timestamp_anon", "value", "container_ip", "request_type"]:
        expected = "timestamp_anon,value,container_ip,request_type"
        raise TraceFormatError(str(path), 1, 1, f"expected {expected!r}, got {','.join(header)!r}")
    picked = [(float(row[0]), float(row[1])) for row in rows[1:] if len(row) >= 4 and row[3] == request_type]
    if not picked:
        raise ValueError(f"{path}: no rows of request type {request_type!r}")
    stamps = np.array([t for t, _ in picked])
    values = np.array([v for _, v in picked])
    distinct = np.unique(np.concatenate((stamps, [float(row[0]) for row in rows[1:] if row])))
    step = float(np.diff(distinct).min())
    origin = float(distinct[0])
    index = np.round((stamps - origin) / step).astype(np.int64)
    if np.abs((stamps - origin) / step - index).max() > 1e-6:
        raise ValueError(f"{path}: timestamps are not on a {step:g} s grid")
    sums = np.bincount(index, weights=values, minlength=round((distinct[-1] - origin) / step) + 1).astype(np.float64)
    return RateSeries(origin, step, sums, source=f"Alibaba GenAI 2026 {path.name}: {request_type} summed")


def _servegen(folder: str) -> Callable[[Path], RateSeries]:
    def read(shared: Path) -> RateSeries:
        from autoscaler.traces.convert import convert_servegen

        return convert_servegen([shared / "alibaba-servegen" / folder], step_s=60.0, seed=0)

    return read


def _azure_llm(name: str) -> Callable[[Path], RateSeries]:
    def read(shared: Path) -> RateSeries:
        from autoscaler.traces.convert import read_azure_llm

        log = read_azure_llm(shared / "azure-llm-inference-2023" / f"AzureLLMInferenceTrace_{name}.csv")
        return bin_requests(log.times, 60.0, source=f"Azure LLM 2023 {name}")

    return read


def _genai(shared: Path) -> RateSeries:
    return read_genai_qps(shared / "alibaba-genai-v2026" / "qps.tar.gz")


def _functions(shared: Path) -> RateSeries:
    from autoscaler.traces.convert import read_azure_functions

    return read_azure_functions(shared / "azure-functions-2019-invitro-sample" / "1000_inv.csv.gz")


@dataclass(frozen=True)
class MatrixTrace:
    name: str
    source: str  # the key of SOURCES it is read from
    first_hour: bool = False  # a "new service": only the first hour

    @property
    def servegen(self) -> bool:
        return self.source.startswith("servegen")


SOURCES: dict[str, Callable[[Path], RateSeries]] = {
    "servegen-m-large": _servegen("language/m-large"),
    "servegen-reason": _servegen("reason/deepseek-r1"),
    "servegen-multimodal": _servegen("multimodal/mm-image"),
    "azure-llm-conv": _azure_llm("conv"),
    "azure-llm-code": _azure_llm("code"),
    "alibaba-genai-qps": _genai,
    "azure-functions": _functions,
}
TRACES: dict[str, MatrixTrace] = {
    **{name: MatrixTrace(name, name) for name in SOURCES},
    **{f"new-{name}": MatrixTrace(f"new-{name}", name, True) for name in SOURCES if name.startswith("servegen")},
}
QUICK_TRACES = ("servegen-reason", "azure-llm-code")
QUICK_SECONDS = 2 * 3600.0


# ---------------------------------------------------------------------------------------------------------------------
# Scenarios


def default_scenario() -> dict[str, Any]:
    from autoscaler.sim.scenario import default_scenario_path

    data = yaml.safe_load(default_scenario_path().read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def default_mean_demand(data: dict[str, Any]) -> float:
    """The packaged default scenario's mean demand, req/s: its trace's mean times its traceScale."""
    from autoscaler.sim.run import resolve_trace
    from autoscaler.sim.scenario import default_scenario_path

    simulation = data["services"][0]["simulation"]
    series = load_trace(resolve_trace(simulation["trace"], default_scenario_path().parent))
    return float(series.rates.mean()) * float(simulation.get("traceScale", 1.0))


def matrix_scenario(
    base: dict[str, Any], trace_path: Path, scale: float, span_s: float, cold_start: float,
    duration: float | None = None,
) -> dict[str, Any]:
    data = copy.deepcopy(base)
    data["name"] = f"matrix-{trace_path.stem}-cold{cold_start:g}"
    data.pop("description", None)
    service = data["services"][0]
    service["spec"]["coldStartSeconds"] = cold_start
    service["simulation"]["trace"] = str(trace_path)
    service["simulation"]["traceScale"] = scale
    # the forecasts learn from the finished requests, as the controller's history of its default counter reads them
    # (the rows run in pool workers, in process anyway: no forecasting workers to lose)
    service["simulation"]["forecastLearnsFrom"] = "finished"
    forecasting = data["forecasting"]
    if span_s <= SHORT_TRACE_S + 1e-6:
        forecasting.update(historySeconds=3600.0, minHistorySeconds=300.0, refitSeconds=600)
    boot = max((float(p.get("bootSeconds", 0)) for p in data["nodePools"] if p.get("burst")), default=0.0)
    if cold_start + boot + float(forecasting["updateSeconds"]) >= float(forecasting["horizonSeconds"]):
        forecasting["horizonSeconds"] = 900
    if duration is not None:
        data["durationSeconds"] = duration
    return data


@dataclass
class Prepared:
    trace: MatrixTrace
    path: Path
    scale: float
    span_s: float
    cv: float  # coefficient of variation of the 60 s series
    peak_to_mean: float
    source: str


def prepare(
    names: Sequence[str], shared: Path, out_dir: Path, target_mean: float, log: Callable[[str], None] = print
) -> dict[str, Prepared]:
    """Each trace's series, written as a rate-series CSV in ``out_dir``, with the traceScale that gives it the
    target mean demand."""
    cache: dict[str, RateSeries] = {}
    prepared: dict[str, Prepared] = {}
    for name in names:
        trace = TRACES[name]
        if trace.source not in cache:
            began = time.perf_counter()
            cache[trace.source] = SOURCES[trace.source](shared)
            log(f"# read {trace.source}: {cache[trace.source].source} ({time.perf_counter() - began:.1f} s)")
        series = cache[trace.source]
        if trace.first_hour:
            keep = math.ceil(NEW_SERVICE_S / series.step_s - 1e-9)
            series = RateSeries(series.start, series.step_s, series.rates[:keep], f"{series.source}, first hour")
        mean = float(series.rates.mean())
        if not mean > 0:
            raise ValueError(f"{name}: the series has no demand")
        path = out_dir / f"{name}.csv"
        write_rate_series(series, path, decimals=6)
        on_minutes = series.rates if abs(series.step_s - 60.0) < 1e-9 else _per_minute(series)
        prepared[name] = Prepared(
            trace, path, target_mean / mean, series.duration_s, float(on_minutes.std() / on_minutes.mean()),
            float(on_minutes.max() / on_minutes.mean()), series.source,
        )
    return prepared


def _per_minute(series: RateSeries) -> np.ndarray:
    from autoscaler.traces.formats import resample

    return np.asarray(resample(series, 60.0).rates)


# ---------------------------------------------------------------------------------------------------------------------
# One row


Job = tuple[str, str, float, float, float, float | None, dict[str, Any], tuple[str, ...], tuple[float, ...]]


def run_row(job: Job) -> dict[str, Any]:
    """Oracle, predictive and hpa (and whatever else ``policies`` lists) on one (trace, cold start); then the HPA
    alone at each GPU utilisation target of ``hpa_targets`` (its frontier, ``hpa_at_slo``)."""
    import autoscaler.sim.run as run_module
    from autoscaler.sim.scenario import parse_scenario

    name, path, scale, span_s, cold, duration, base, policies, hpa_targets = job
    data = matrix_scenario(base, Path(path), scale, span_s, cold, duration)
    states: Counter[str] = Counter()
    make_policy = run_module.make_policy  # type: ignore[attr-defined]

    def counting(policy_name: str, *args: Any, **kwargs: Any) -> Any:
        # The predictive policy's plan carries each tick's headroom (core.headroom) in its forecast views: count them.
        policy = make_policy(policy_name, *args, **kwargs)
        if policy_name == "predictive":
            plan = policy.plan

            def plan_and_count(*a: Any, **k: Any) -> Any:
                result = plan(*a, **k)
                for view in result.forecasts.values():
                    headroom = getattr(view, "headroom", None)
                    states["none" if headroom is None else str(headroom.state.value)] += 1
                return result

            policy.plan = plan_and_count  # type: ignore[method-assign]
        return policy

    began = time.perf_counter()
    with mock.patch.object(run_module, "make_policy", counting):
        result = run_module.run_scenario(parse_scenario(data), Path("."), policies)
    figures = result.report["policies"]
    ticks = sum(states.values())
    row: dict[str, Any] = {
        "trace": name,
        "cold_start": cold,
        "simulated_hours": result.steps * result.step_s / 3600.0,
        "trace_scale": scale,
        "mean_rate": result.report["scenario"]["services"][0]["mean_rate"],
        "peak_rate": result.report["scenario"]["services"][0]["peak_rate"],
        "seconds": time.perf_counter() - began,
        "headroom_shares": {s: states[s] / ticks for s in (*HEADROOM_STATES, "none") if states[s]} if ticks else {},
        "policies": {
            p: {
                "slo_attainment": figures[p]["slo_attainment"],
                "gpu_hours": figures[p]["gpu_hours"],
                "gpu_hours_vs_oracle": figures[p]["gpu_hours_vs_oracle"],
                "scale_actions": figures[p]["scale_actions"],
                "scale_downs": figures[p]["scale_downs"],
                "scale_downs_undone": figures[p]["scale_downs_undone"],
                "burst_gpu_hours": figures[p]["burst_gpu_hours"],
                "forecast_mae": figures[p].get("forecast_mae"),
                "decisions_by_reason": figures[p]["decisions_by_reason"],
            }
            for p in policies
        },
    }
    if hpa_targets:
        default_target = float(data.get("baselines", {}).get("hpaTargetUtilization", DEFAULT_HPA_TARGET))
        hpa = row["policies"]["hpa"]
        frontier = [{"target": default_target, "slo_attainment": hpa["slo_attainment"], "gpu_hours": hpa["gpu_hours"]}]
        for target in hpa_targets:
            if abs(target - default_target) < 1e-9:
                continue
            at = copy.deepcopy(data)
            at.setdefault("baselines", {})["hpaTargetUtilization"] = target
            figures_at = run_module.run_scenario(parse_scenario(at), Path("."), ("hpa",)).report["policies"]["hpa"]
            frontier.append(
                {"target": target, "slo_attainment": figures_at["slo_attainment"], "gpu_hours": figures_at["gpu_hours"]}
            )
        row["hpa_frontier"] = sorted(frontier, key=lambda point: point["target"])
        row["seconds"] = time.perf_counter() - began
    return row


def hpa_at_slo(frontier: Sequence[dict[str, Any]], slo: float) -> dict[str, Any] | None:
    """The cheapest HPA of the frontier (one run per utilisation target) whose share of requests within SLO is at
    least ``slo`` less the criterion's tolerance (0.1 point): what the HPA needs, tuned by hand to that SLO, among
    the targets run; None when no target reaches it (the HPA does not get there at any target tried)."""
    reaching = [p for p in frontier if p["slo_attainment"] >= slo - SLO_TOLERANCE - 1e-12]
    return min(reaching, key=lambda p: (p["gpu_hours"], -p["target"])) if reaching else None


def judge(row: dict[str, Any], servegen: bool) -> dict[str, Any]:
    """The three criteria of issue 14 on one row: True, False, or None (not applicable)."""
    pred, hpa = row["policies"]["predictive"], row["policies"]["hpa"]
    slo_ok = pred["slo_attainment"] >= hpa["slo_attainment"] - SLO_TOLERANCE - 1e-12
    gpu_ok = pred["gpu_hours"] <= hpa["gpu_hours"] + 1e-9
    target_ok = (
        pred["slo_attainment"] >= SERVEGEN_TARGET - 1e-12
        if servegen and row["cold_start"] == SERVEGEN_TARGET_COLD else None
    )
    reasons = []
    if not slo_ok:
        reasons.append(f"SLO {pred['slo_attainment']:.2%} < hpa {hpa['slo_attainment']:.2%} - 0.1 pt")
    if not gpu_ok:
        reasons.append(f"GPU-h {pred['gpu_hours']:.1f} > hpa {hpa['gpu_hours']:.1f}")
    if target_ok is False:
        reasons.append(f"SLO {pred['slo_attainment']:.2%} < {SERVEGEN_TARGET:.1%}")
    verdict: dict[str, Any] = {
        "slo_vs_hpa": slo_ok, "gpu_vs_hpa": gpu_ok, "servegen_995_at_90s": target_ok, "failures": reasons,
    }  # fmt: skip
    if "hpa_frontier" in row:
        matched = hpa_at_slo(row["hpa_frontier"], pred["slo_attainment"])
        verdict["hpa_at_slo"] = matched
        # not one of the criteria: how the predictive policy's GPU-hours compare with the HPA's at its SLO
        verdict["gpu_vs_hpa_at_slo"] = True if matched is None else pred["gpu_hours"] <= matched["gpu_hours"] + 1e-9
    return verdict


# ---------------------------------------------------------------------------------------------------------------------
# The matrix


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "FAIL")


def _headroom_cell(shares: dict[str, float]) -> str:
    short = {"earned": "E", "partial": "P", "learning": "L", "untrusted": "U", "degraded": "D", "none": "-"}
    return " ".join(f"{short[s]}{v:.0%}" for s, v in shares.items()) or "-"


def _ratio(value: float, reference: float) -> str:
    """``value`` ÷ ``reference`` to two decimals; "-" without a reference (the oracle made no scaling action)."""
    return f"{value / reference:.2f}" if reference else "-"


def _matched_cell(row: dict[str, Any]) -> str:
    """The HPA tuned to the predictive policy's SLO: its GPU-hours ÷ the oracle's and its target, or "none" when no
    target tried reaches that SLO."""
    matched = row["verdict"].get("hpa_at_slo")
    if matched is None:
        return "none"
    oracle = row["policies"]["oracle"]["gpu_hours"]
    return f"{matched['gpu_hours'] / oracle:.3f} ({matched['target']:g} %)"


def _undone_cell(predictive: Mapping[str, Any], hpa: Mapping[str, Any]) -> str:
    """The scale-downs undone within a cold start, the predictive policy's / the HPA's ("-": a row measured before
    they were counted)."""
    if "scale_downs_undone" not in predictive or "scale_downs_undone" not in hpa:
        return "-"
    return f"{predictive['scale_downs_undone']} / {hpa['scale_downs_undone']}"


def format_rows(rows: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    frontier = any("hpa_frontier" in row for row in rows)
    head = ["trace", "cold s", "h", "oracle GPU-h", "pred SLO", "pred GPU-h÷o", "pred acts", "acts÷o", "hpa SLO",
            "hpa GPU-h÷o", "hpa acts", "undone p/h", "SLO≥hpa-0.1", "GPU≤hpa", "≥99.5%@90", "headroom E/P/L/U/D",
            "secs"]
    if frontier:
        head[-1:-1] = ["hpa@pred SLO GPU-h÷o", "GPU≤hpa@SLO"]
    table = [head]
    for row in rows:
        p, h, o = row["policies"]["predictive"], row["policies"]["hpa"], row["policies"]["oracle"]
        v = row["verdict"]
        cells = [
            row["trace"], f"{row['cold_start']:g}", f"{row['simulated_hours']:.0f}", f"{o['gpu_hours']:.1f}",
            f"{p['slo_attainment']:.2%}", f"{p['gpu_hours_vs_oracle']:.3f}", str(p["scale_actions"]),
            _ratio(p["scale_actions"], o["scale_actions"]),
            f"{h['slo_attainment']:.2%}", f"{h['gpu_hours_vs_oracle']:.3f}", str(h["scale_actions"]),
            _undone_cell(p, h),
            _mark(v["slo_vs_hpa"]), _mark(v["gpu_vs_hpa"]), _mark(v["servegen_995_at_90s"]),
            _headroom_cell(row["headroom_shares"]),
        ]
        if frontier:
            cells += [_matched_cell(row), _mark(v.get("gpu_vs_hpa_at_slo"))] if "hpa_frontier" in row else ["-", "-"]
        table.append([*cells, f"{row['seconds']:.0f}"])
    if markdown:
        lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
        lines += ["| " + " | ".join(r) + " |" for r in table[1:]]
        return "\n".join(lines)
    widths = [max(len(r[c]) for r in table) for c in range(len(head))]
    return "\n".join(
        "  ".join(cell.rjust(w) if c else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in table
    )


def run_matrix(
    names: Sequence[str], cold_starts: Sequence[float], *, quick: bool = False, workers: int = 2,
    shared: Path = SHARED_TRACES, policies: tuple[str, ...] = POLICIES, max_days: float | None = None,
    hpa_targets: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """``hpa_targets``: GPU utilisation targets, percent, the HPA is also run at alone on every row (its frontier:
    ``hpa_at_slo``); none: only the default target."""
    unknown = [n for n in names if n not in TRACES]
    if unknown:
        raise ValueError(f"unknown trace {unknown[0]!r} (known: {', '.join(TRACES)})")
    if not shared.is_dir():
        raise FileNotFoundError(f"{shared}: the public traces are not there (set GPU_AUTOSCALER_SHARED_TRACES)")
    base = default_scenario()
    target_mean = default_mean_demand(base)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trace-matrix-") as tmp:
        prepared = prepare(names, shared, Path(tmp), target_mean)
        print(f"# target mean demand {target_mean:.2f} req/s (the default scenario's); series ready in "
              f"{time.perf_counter() - began:.1f} s")
        for p in prepared.values():
            print(f"#   {p.trace.name}: {p.span_s / 3600:.1f} h, traceScale {p.scale:.4g}, cv {p.cv:.2f} at 60 s, "
                  f"peak/mean {p.peak_to_mean:.1f}")
        jobs = []
        for name in names:
            p = prepared[name]
            duration: float | None = None
            if quick:
                duration = min(p.span_s, QUICK_SECONDS)
            elif max_days is not None and p.span_s > max_days * 86400.0:
                duration = max_days * 86400.0
            for cold in cold_starts:
                jobs.append((name, str(p.path), p.scale, p.span_s, cold, duration, base, policies, tuple(hpa_targets)))
        # Longest first, so that the two workers finish together.
        jobs.sort(key=lambda j: -(j[5] if j[5] is not None else prepared[j[0]].span_s))
        rows: list[dict[str, Any]] = []
        processes = max(1, min(workers, len(jobs)))
        if processes == 1:
            results = map(run_row, jobs)
            rows = _collect(results, prepared, len(jobs))
        else:
            with multiprocessing.get_context("fork").Pool(processes) as pool:
                rows = _collect(pool.imap_unordered(run_row, jobs), prepared, len(jobs))
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: (order[r["trace"]], r["cold_start"]))
    return rows


def _collect(results: Any, prepared: dict[str, Prepared], total: int) -> list[dict[str, Any]]:
    rows = []
    for row in results:
        p = prepared[row["trace"]]
        row["verdict"] = judge(row, p.trace.servegen)
        row["trace_cv"], row["trace_peak_to_mean"], row["source"] = p.cv, p.peak_to_mean, p.source
        rows.append(row)
        pred, hpa = row["policies"]["predictive"], row["policies"]["hpa"]
        print(f"# [{len(rows)}/{total}] {row['trace']} cold {row['cold_start']:g}: predictive "
              f"{pred['slo_attainment']:.2%} / {pred['gpu_hours_vs_oracle']:.3f}x, hpa {hpa['slo_attainment']:.2%} / "
              f"{hpa['gpu_hours_vs_oracle']:.3f}x ({row['seconds']:.0f} s)", flush=True)
    return rows
