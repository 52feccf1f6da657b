"""``autoscaler simulate``: replay a scenario through every policy and compare them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoscaler.sim.policies import POLICY_NAMES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay demand traces through the autoscaler and the baselines (no cluster needed)",
        description=(
            "Replay a scenario (node pools, inference services, demand traces) through the policies side by side "
            "and print their SLO attainment, GPU-hours and scaling actions. Without SCENARIO it runs the packaged "
            "default: 14 days of the Alibaba ServeGen m-large trace."
        ),
    )
    parser.add_argument(
        "scenario", nargs="?", metavar="SCENARIO",
        help="scenario YAML file (default: the packaged autoscaler/sim/scenarios/default.yaml)",
    )
    parser.add_argument(
        "--policies", default=",".join(POLICY_NAMES),
        help=f"comma-separated policies to compare (default: all of {', '.join(POLICY_NAMES)})",
    )
    parser.add_argument(
        "--json", type=Path, metavar="OUT.json",
        help="where to write the JSON report (default: out/<scenario name>.json)",
    )
    parser.add_argument(
        "--plot", type=Path, metavar="OUT.png",
        help="where to write the plot (default: out/<scenario name>.png)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoscaler.sim.report import format_table, write_json
    from autoscaler.sim.run import run_scenario
    from autoscaler.sim.scenario import ScenarioError, default_scenario_path, load_scenario
    from autoscaler.traces import TraceFormatError

    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    unknown = [name for name in policies if name not in POLICY_NAMES]
    if unknown or not policies:
        print(f"autoscaler simulate: --policies: unknown policy {unknown[0] if unknown else ''!r} "
              f"(known: {', '.join(POLICY_NAMES)})", file=sys.stderr)
        return 2
    scenario_path = Path(args.scenario) if args.scenario else default_scenario_path()
    try:
        scenario, base_dir = load_scenario(scenario_path)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=0, unit="step", unit_scale=True, desc="simulating", file=sys.stderr, leave=False)

        def set_total(total: int) -> None:
            if bar is not None:
                bar.total = total
                bar.refresh()

        result = run_scenario(
            scenario, base_dir, policies, progress=bar.update if bar is not None else None,
            scenario_source=str(scenario_path), on_total_steps=set_total,
        )
        if bar is not None:
            bar.close()
    except (ScenarioError, TraceFormatError) as error:
        print(f"autoscaler simulate: {error}", file=sys.stderr)
        return 2
    report = result.report
    summary = report["scenario"]
    print(f"scenario {summary['name']}: {summary['simulated_days']:.1f} days at {summary['step_seconds']:g} s steps, "
          f"{len(summary['services'])} service(s)")
    for service in summary["services"]:
        print(f"  {service['service']}: mean {service['mean_rate']:.1f} req/s, peak {service['peak_rate']:.1f} req/s, "
              f"SLO {service['slo_seconds']:g} s, cold start {service['cold_start_seconds']:g} s")
    print()
    print(format_table(report))
    print()
    json_path = args.json or Path("out") / f"{scenario.name}.json"
    write_json(report, json_path)
    print(f"JSON report: {json_path}")
    if not args.no_plot:
        from autoscaler.sim.plot import plot

        plot_path = args.plot or Path("out") / f"{scenario.name}.png"
        plot(result, plot_path)
        print(f"plot:        {plot_path}")
    return 0
