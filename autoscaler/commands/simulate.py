"""``autoscaler simulate``: replay a scenario through every policy and compare them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autoscaler.sim.registry import CAPACITY_BASELINES, DEFAULT_POLICIES, POLICY_NAMES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay demand traces through the autoscaler and the baselines (no cluster needed)",
        description=(
            "Replay a scenario (node pools, inference services, demand traces) through the policies side by side "
            "and print their SLO attainment, GPU-hours and scaling actions. Without SCENARIO it runs the packaged "
            "default: 14 days of the Alibaba ServeGen m-large trace. The scenario is checked before anything is "
            "read or written (exit code 2 and the field at fault otherwise): a run is at most 1,000,000 steps "
            "(durationSeconds or the shortest trace / stepSeconds), 10,000,000 service-steps and 1,000,000,000 "
            "replica-steps, and its name must be a plain file name (the outputs stay inside out/)."
        ),
    )
    parser.add_argument(
        "scenario",
        nargs="?",
        metavar="SCENARIO",
        help="scenario YAML file (default: the packaged autoscaler/sim/scenarios/default.yaml)",
    )
    parser.add_argument(
        "--policies",
        default=None,
        help=(
            f"comma-separated policies to compare, of {', '.join(POLICY_NAMES)} (default: "
            f"{', '.join(DEFAULT_POLICIES)}, and {', '.join(CAPACITY_BASELINES)} when the scenario has training)"
        ),
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="OUT.json",
        help="where to write the JSON report (default: out/<scenario name>.json)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="OUT.png",
        help="where to write the plot (default: out/<scenario name>.png)",
    )
    parser.add_argument(
        "--forecast-workers",
        type=_workers,
        default=None,
        metavar="N",
        help=(
            "processes that compute the forecasts beside the run, 0 = none (default: 1 on a machine with 2 or more "
            "CPUs, else 0); the figures are the same to the last digit, only the wall time changes"
        ),
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(func=run)


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of processes, got {text!r}") from None
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"between 0 and 64, got {value}")
    return value


def default_forecast_workers() -> int:
    """One forecasting process beside the run when there is a second CPU for it, else none."""
    return 1 if (os.cpu_count() or 1) >= 2 else 0


OUTPUT_DIR = Path("out")


class OutputPathError(ValueError):
    """An output path that would land outside the output folder."""


def default_output(name: str, suffix: str, out_dir: Path = OUTPUT_DIR) -> Path:
    """``out_dir/<name><suffix>``, refused (OutputPathError) unless it resolves inside ``out_dir``.

    The scenario model already allows only safe names; this is the second line of defence (it also catches a
    symlink planted in the output folder)."""
    path = out_dir / f"{name}{suffix}"
    try:
        root = out_dir.resolve()
        resolved = path.resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop (Python < 3.13)
        raise OutputPathError(f"name: cannot resolve the output path {path}: {error}") from None
    if resolved == root or not resolved.is_relative_to(root):
        raise OutputPathError(f"name: {name!r} would write {resolved}, outside the output folder {root}")
    return path


# the file types matplotlib's savefig writes (FigureCanvasBase.get_supported_filetypes with the Agg, PDF, PS, SVG and
# PGF backends), by suffix: matplotlib picks the format from it
PLOT_SUFFIXES = frozenset({"png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp", "pgf"})


def _unplottable(path: Path) -> str | None:
    """Why the plot cannot be written at ``path`` as named (None: it can): checked before the (long) run."""
    if path.is_dir():
        return "is a directory (name the image file, e.g. out/report.png)"
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        return "has no suffix naming an image format (matplotlib would write another file: <path>.png)"
    if suffix not in PLOT_SUFFIXES:
        return f"unknown image format .{suffix} (one of: {', '.join(sorted(PLOT_SUFFIXES))})"
    return None


def run(args: argparse.Namespace) -> int:
    from autoscaler.sim.report import format_table, write_json
    from autoscaler.sim.run import run_scenario
    from autoscaler.sim.scenario import ScenarioError, default_scenario_path, load_scenario
    from autoscaler.traces import TraceFormatError

    policies = None if args.policies is None else [name.strip() for name in args.policies.split(",") if name.strip()]
    unknown = [name for name in policies or () if name not in POLICY_NAMES]
    if unknown or policies == []:
        print(
            f"autoscaler simulate: --policies: unknown policy {unknown[0] if unknown else ''!r} "
            f"(known: {', '.join(POLICY_NAMES)})",
            file=sys.stderr,
        )
        return 2
    scenario_path = Path(args.scenario) if args.scenario else default_scenario_path()
    bar = None
    try:
        scenario, base_dir = load_scenario(scenario_path)
        # Where the outputs go is settled before the (long) run, so a bad name costs nothing.
        json_path = args.json or default_output(scenario.name, ".json")
        plot_path = None if args.no_plot else args.plot or default_output(scenario.name, ".png")
        if plot_path is not None:
            why = _unplottable(Path(plot_path))
            if why is not None:
                print(f"autoscaler simulate: --plot: {plot_path}: {why}", file=sys.stderr)
                return 2
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=0, unit="step", unit_scale=True, desc="simulating", file=sys.stderr, leave=False)

        def set_total(total: int) -> None:
            if bar is not None:
                bar.total = total
                bar.refresh()

        result = run_scenario(
            scenario,
            base_dir,
            policies,
            progress=bar.update if bar is not None else None,
            scenario_source=str(scenario_path),
            on_total_steps=set_total,
            forecast_workers=default_forecast_workers() if args.forecast_workers is None else args.forecast_workers,
        )
    except (ScenarioError, TraceFormatError, OutputPathError) as error:
        if bar is not None:
            bar.close()
        print(f"autoscaler simulate: {error}", file=sys.stderr)
        return 2
    except MemoryError:
        if bar is not None:
            bar.close()
        print(
            f"autoscaler simulate: {scenario_path}: out of memory while simulating: use fewer services, a longer "
            "stepSeconds or a shorter durationSeconds (or smaller forecasting.modelParams)",
            file=sys.stderr,
        )
        return 2
    if bar is not None:
        bar.close()
    report = result.report
    summary = report["scenario"]
    print(
        f"scenario {summary['name']}: {summary['simulated_days']:.1f} days at {summary['step_seconds']:g} s steps, "
        f"{len(summary['services'])} service(s)"
    )
    for service in summary["services"]:
        print(
            f"  {service['service']}: mean {service['mean_rate']:.1f} req/s, peak {service['peak_rate']:.1f} req/s, "
            f"SLO {service['slo_seconds']:g} s, cold start {service['cold_start_seconds']:g} s"
        )
    print()
    print(format_table(report))
    print()
    try:
        write_json(report, json_path)
    except OSError as error:
        print(f"autoscaler simulate: --json: cannot write {json_path}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"JSON report: {json_path}")
    if plot_path is not None:
        from autoscaler.sim.plot import plot

        try:
            plot(result, plot_path)
        except (OSError, ValueError) as error:  # ValueError: matplotlib knows no format for the file's extension
            reason = getattr(error, "strerror", None) or error
            print(f"autoscaler simulate: --plot: cannot write {plot_path}: {reason}", file=sys.stderr)
            return 2
        print(f"plot:        {plot_path}")
    return 0
