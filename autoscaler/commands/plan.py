"""``autoscaler plan``: one dry-run tick against a live cluster, printed with the reason of every decision and action.

It reads exactly what ``autoscaler run`` reads and decides with the same code, but writes nothing at all: no
scaling, no Events, no status, no Lease. With forecasting policies it also runs the refit job once (the request-rate
history from Prometheus, fitted at the plan's time), so that they are decided with a fit, as in a running controller.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from autoscaler.ports import EvictionOutcome, WriteGuard, WriteOutcome

EXIT_OK = 0
EXIT_HOLD = 1
EXIT_SETTINGS = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="one dry-run tick against a live cluster: print the plan and the reason of every decision",
        description=textwrap.dedent(
            """\
            Read the GPUScalingPolicies, the cluster and Prometheus once, decide with the controller's own code,
            and print what it would do and why. Policies with spec.forecast are decided with a forecast fitted
            from their Prometheus history at that time, as the controller's refit job fits it. Nothing is
            written to the cluster (no scaling, Events, status or Lease). Settings come from these flags,
            AUTOSCALER_* environment variables and the config file, as for 'autoscaler run'.
            """
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 the plan was computed from fresh reads; 1 a read failed and the controller would hold "
        "(the reason is printed); 2 invalid settings or no cluster configuration",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML or JSON settings file")
    parser.add_argument(
        "--kubeconfig", type=Path, metavar="FILE", help="kubeconfig (default: $KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current-context)")
    parser.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus base URL, e.g. http://localhost:9090 after a port-forward"
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="only the GPUScalingPolicies of this namespace (repeatable; default: the namespaces setting, or all)",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="table for people, json for scripts"
    )
    parser.add_argument(
        "--time",
        type=_unix_time,
        metavar="UNIX_SECONDS",
        help="evaluate at this time instead of now (Unix seconds, 1970 to the year 9999; Prometheus must have data "
        "around it)",
    )
    parser.set_defaults(func=main)


def _unix_time(text: str) -> float:
    """--time: finite Unix seconds in the range a date can print (nan and inf crashed the report with a traceback);
    a bad value is argparse's usage error, exit 2, naming --time."""
    from autoscaler.commands.observe import checked_time

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of Unix seconds") from None
    try:
        return checked_time(value, text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--time: ")) from None


class ReadOnlyNodePools:
    """The provider's node pools, read only: their sizes and bounds, as the controller reads them each tick (the
    plan's burst options are the controller's), and every resize refused."""

    def __init__(self, pools: Any) -> None:
        self._pools = pools
        if hasattr(pools, "bounds"):
            self.bounds = pools.bounds
        # both in one read where the provider can, as the controller of ``autoscaler run`` reads them
        if hasattr(pools, "size_and_bounds"):
            self.size_and_bounds = pools.size_and_bounds

    def node_count(self, pool: str) -> int:
        return int(self._pools.node_count(pool))

    def scale(self, pool: str, nodes: int, *args: Any, **kwargs: Any) -> WriteOutcome:
        raise RuntimeError("autoscaler plan is read-only")


class ReadOnlyMoveLedger:
    """The rebalancer's move ledger, read only: the plan's moves are those the acting controller's hourly budget and
    retry waits still allow (without it, a plan showed a fresh hour's moves), and nothing is recorded."""

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger

    def read(self) -> tuple[float, ...]:
        return tuple(self._ledger.read())

    def targets(self) -> tuple[tuple[str, float], ...]:
        return tuple(self._ledger.targets())

    def write(self, move_times: tuple[float, ...], targets: tuple[tuple[str, float], ...] = ()) -> None:
        raise RuntimeError("autoscaler plan is read-only")


class ReadOnlyWriter:
    """A ClusterWriter that refuses every write and keeps the Events it was asked for, to print them."""

    def __init__(self) -> None:
        self.events: list[dict[str, str]] = []

    def scale_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        expected_replicas: int | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        raise RuntimeError("autoscaler plan is read-only")

    def evict_pod(
        self,
        namespace: str,
        name: str,
        *,
        dry_run: bool = False,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> EvictionOutcome:
        raise RuntimeError("autoscaler plan is read-only")

    def suspend_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        raise RuntimeError("autoscaler plan is read-only")

    def resume_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        raise RuntimeError("autoscaler plan is read-only")

    def set_pod_deletion_cost(
        self,
        namespace: str,
        name: str,
        cost: int | None,
        *,
        uid: str | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        raise RuntimeError("autoscaler plan is read-only")

    def emit_event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        event_type: str = "Normal",
        *,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> None:
        self.events.append(
            {"object": f"{kind}/{namespace}/{name}", "type": event_type, "reason": reason, "message": message}
        )


def main(args: argparse.Namespace) -> int:
    from autoscaler.settings import SettingsError, load_settings

    overrides: dict[str, Any] = {"dry_run": True}
    kube: dict[str, Any] = {}
    if args.kubeconfig is not None:
        kube["kubeconfig"] = args.kubeconfig
        kube["config_mode"] = "kubeconfig"
    if args.context:
        kube["context"] = args.context
    if kube:
        overrides["kubernetes"] = kube
    if args.prometheus_url:
        overrides["prometheus"] = {"url": args.prometheus_url}
    if args.namespaces:
        overrides["namespaces"] = args.namespaces
    try:
        settings = load_settings(args.config, **overrides)
    except SettingsError as exc:
        print(f"autoscaler plan: {exc}", file=sys.stderr)
        return EXIT_SETTINGS

    from autoscaler.app import _move_ledger, build_adapters
    from autoscaler.controller import Controller
    from autoscaler.runtime import configure_logging
    from autoscaler.telemetry import Telemetry

    configure_logging("WARNING" if settings.log_level == "INFO" else settings.log_level, settings.log_format)
    try:
        adapters = build_adapters(settings, check_prometheus=False)
    except Exception as exc:
        print(f"autoscaler plan: cannot connect: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    now = args.time if args.time is not None else time.time()
    ledger = _move_ledger(settings, adapters, for_plan=True)
    move_ledger = ReadOnlyMoveLedger(ledger) if ledger is not None else None

    def controller_for(writer: ReadOnlyWriter, forecasts: Any = None) -> Controller:
        return Controller(
            metrics=adapters.metrics,
            cluster=adapters.cluster,
            writer=writer,
            policies=adapters.policies,
            status_writer=None,
            node_pools=ReadOnlyNodePools(adapters.node_pools) if adapters.node_pools is not None else None,
            telemetry=Telemetry(),
            dry_run=True,
            forecasts=forecasts,
            capacity=settings.capacity.to_config(),
            rebalance=settings.rebalance.to_config(settings.rebalance_interval_seconds, settings.capacity.burst_pools),
            move_ledger=move_ledger,
        )

    writer = ReadOnlyWriter()
    controller = controller_for(writer)
    controller.run_once(now)
    report = controller.last_report
    assert report is not None
    forecasts = None
    if report.result == "ok" and any(p.forecast is not None for p in controller.policies_seen):
        # The controller decides a forecasting service with the latest fit of its refit job, which runs once a
        # tick has read the policies (and handed their PromQL overrides to the metrics source). The plan does the
        # same: this first tick read them, the refit fits at ``now``, and a fresh controller -- no stabilisation
        # history, no Events remembered from the first tick -- decides with the fits.
        from autoscaler.forecasting import ForecastService

        seen = controller.policies_seen
        forecasts = ForecastService(
            settings.forecast,
            adapters.metrics,
            lambda: seen,
            refit_interval_s=settings.refit_interval_seconds,
            tick_interval_s=settings.tick_interval_seconds,
            update_interval_s=settings.forecast.update_interval_seconds,
        )
    try:
        if forecasts is not None:
            forecasts.refit(now)
            writer = ReadOnlyWriter()
            controller = controller_for(writer, forecasts)
            controller.run_once(now)
            report = controller.last_report
            assert report is not None
        rebalance = controller.rebalance(now)  # None unless rebalance.enabled; dry run: the moves it would make
    finally:
        if forecasts is not None:
            forecasts.close()
    document = plan_document(report, writer.events, rebalance)
    if args.output == "json":
        json.dump(document, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        print_table(document, sys.stdout)
    # A read that failed holds the tick, or the rebalance pass (its own cluster read): exit 1 either way.
    fresh = report.result == "ok" and (rebalance is None or rebalance.result == "ok")
    return EXIT_OK if fresh else EXIT_HOLD


def plan_document(report: Any, events: Sequence[dict[str, str]] = (), rebalance: Any = None) -> dict[str, Any]:
    """The plan as plain data: what ``-o json`` prints and the table is drawn from."""
    from autoscaler.actuator import action_kind, action_target, describe_action

    plan = report.plan
    return {
        "time": datetime.fromtimestamp(report.time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "result": report.result,
        "heldBecause": report.held_because,
        "decisions": [
            {
                "service": d.key,
                "mode": "recommend-only" if d.recommend_only else "active",
                "currentReplicas": d.current_replicas,
                "desiredReplicas": d.desired_replicas,
                "reason": d.reason.value,
                "reasonText": d.reason.text,
                "detail": d.detail,
                "stale": list(report.stale.get(d.key, ())),
                "partial": list(report.partial.get(d.key, ())),
                # an HPA on the same Deployment: its recommendation beside ours (we write nothing while it exists)
                "hpa": [
                    {
                        "name": h.name,
                        "currentReplicas": h.current_replicas,
                        "desiredReplicas": h.desired_replicas,
                        "minReplicas": h.min_replicas,
                        "maxReplicas": h.max_replicas,
                    }
                    for h in report.hpas.get(d.key, ())
                ],
                "headroom": _headroom(report, d.key),
            }
            for d in plan.decisions
        ],
        "actions": [
            {
                "kind": action_kind(r.action),
                "target": action_target(r.action),
                "change": describe_action(r.action),
                "reason": r.action.reason.value,
                "reasonText": r.action.reason.text,
                "detail": r.action.detail,
                "wouldApply": r.result == "dry_run",
                "heldBack": r.message if r.result == "held" else None,
            }
            for r in report.results
        ],
        "capacity": capacity_document(plan.capacity),
        "rebalance": rebalance_document(rebalance),
        "invalidPolicies": [{"policy": f"{o.namespace}/{o.name}", "error": o.error} for o in report.invalid_policies],
        "errors": list(report.errors),
        "events": list(events),
    }


def _headroom(report: Any, key: str) -> dict[str, Any] | None:
    """The earned headroom (``core.headroom``) an active forecasting service ran at, or None."""
    view = (getattr(report, "forecasts", None) or {}).get(key)
    headroom = view.headroom if view is not None else None
    if view is None or headroom is None:
        return None
    return {
        "state": headroom.state.value,
        "targetRatio": round(headroom.ratio, 4),
        "coverage": headroom.coverage,
        "scored": headroom.scored,
        "detail": headroom.detail,
        # the share of the quantile's excess over the median the floor provisioned (calibrated excess; 1: the quantile)
        "excessShare": round(view.excess_share, 4),
    }


def rebalance_document(report: Any) -> dict[str, Any] | None:
    """The rebalance pass (``Controller.rebalance``): the GPUs stranded by fragmentation before and after, each move
    with the pods it evicts, where they are and where they are expected to land, what it makes room for, and the
    targets not pursued with why. None when the rebalancer is off."""
    if report is None:
        return None
    plan = report.plan
    results = {(r.action.namespace, r.action.name): r for r in report.results}
    return {
        "result": report.result,
        "heldBecause": report.held_because,
        "strandedGpus": plan.stranded_gpus if plan is not None else None,
        "strandedGpusAfter": plan.stranded_after if plan is not None else None,
        "moves": [
            {
                "owner": m.owner,
                "pods": [f"{ns}/{name}" for ns, name in m.pods],
                "from": dict(m.gpus_by_node),
                "expectedTo": dict(m.destinations),
                "for": m.target,
                "gainGpus": m.gain_gpus,
                "detail": m.detail,
                "results": [results[p].result for p in m.pods if p in results],
            }
            for m in (plan.moves if plan is not None else ())
        ],
        "protected": sorted(report.protected),
        "notes": list(plan.notes) if plan is not None else [],
    }


def _print_rebalance(rebalance: dict[str, Any], out: TextIO) -> None:
    out.write("\nRebalance (moves against fragmentation, burst nodes emptied):\n")
    if rebalance["heldBecause"]:
        out.write(f"  held: {rebalance['heldBecause']}\n")
        return
    out.write(
        f"  GPUs stranded (free, but no waiting pod fits there): {rebalance['strandedGpus']} now, "
        f"{rebalance['strandedGpusAfter']} after the moves\n"
    )
    if not rebalance["moves"]:
        out.write("  no move\n")
    for move in rebalance["moves"]:
        where = ", ".join(f"{n} ({g})" for n, g in sorted(move["from"].items()))
        to = ", ".join(f"{n} ({g})" for n, g in sorted(move["expectedTo"].items()))
        out.write(f"  move {move['owner']}: {', '.join(move['pods'])} from {where} to {to}, for {move['for']}\n")
        out.write(f"    {move['detail']}\n")
    if rebalance["protected"]:
        # why a target found no movable pods: these services' replicas were not candidates this pass
        out.write(
            "  not moved this pass (growing, guarded on latency, at maxReplicas, metrics stale or partial, or no "
            f"replica to spare): {', '.join(rebalance['protected'])}\n"
        )
    for note in rebalance["notes"]:
        out.write(f"  note: {note}\n")


def capacity_document(capacity: Any) -> dict[str, Any] | None:
    """The capacity arbitration's view: shortfalls, every option with its cost and whether it was chosen, the
    training gangs with their lost work and why each may not be taken, the burst pools, the give-back notes."""
    if capacity is None:
        return None
    return {
        "shortfalls": [
            {
                "service": s.service,
                "replicas": s.replicas,
                "gpusPerReplica": s.gpus_per_replica,
                "expectedSeconds": s.duration_s,
                "basis": s.basis,
                "onBootingNodes": s.covered_by_booting,
            }
            for s in capacity.shortfalls
        ],
        "options": [
            {"service": o.service, "kind": o.kind, "cost": o.cost, "chosen": o.chosen, "detail": o.detail}
            for o in capacity.options
        ],
        "trainingGangs": [
            {
                "gang": c.gang,
                "priority": c.priority,
                "gpus": c.gpus,
                "lostWorkGpuHours": round(c.lost_work_gpu_s / 3600.0, 3),
                "preemptible": c.why_not is None,
                "whyNot": c.why_not,
            }
            for c in capacity.candidates
        ],
        "burstPools": [
            {
                "pool": p.name,
                "nodes": p.nodes,
                "minNodes": p.min_nodes,
                "maxNodes": p.max_nodes,
                "gpusPerNode": p.gpus_per_node,
                "pricePerGpuHour": p.price_per_gpu_hour,
            }
            for p in capacity.pools
        ],
        "spendPerHour": capacity.spend_per_hour,
        "notes": list(capacity.notes),
    }


def _print_capacity(capacity: dict[str, Any], out: TextIO) -> None:
    out.write("\nCapacity (preempt training / burst nodes / give back):\n")
    if not capacity["shortfalls"]:
        out.write("  no shortfall: every replica wanted has a GPU\n")
    for option in capacity["options"]:
        mark = "CHOSEN " if option["chosen"] else "       "
        cost = "-" if option["cost"] is None else f"{option['cost']:.2f}"
        out.write(f"  {mark}{option['kind']:<8} cost {cost:>8}  {option['detail']}\n")
    if capacity["trainingGangs"]:
        rows = [["GANG", "PRIORITY", "GPUS", "LOST GPU-H", "PREEMPTIBLE"]]
        for g in capacity["trainingGangs"]:
            why = "yes" if g["preemptible"] else f"no: {g['whyNot']}"
            rows.append([g["gang"], str(g["priority"]), str(g["gpus"]), f"{g['lostWorkGpuHours']:.2f}", why])
        _table([["  " + r[0], *r[1:]] for r in rows], out)
    for pool in capacity["burstPools"]:
        out.write(
            f"  burst pool {pool['pool']}: {pool['nodes']} node(s) ({pool['minNodes']}..{pool['maxNodes']}), "
            f"{pool['gpusPerNode']} GPUs each at {pool['pricePerGpuHour']:g}/GPU-hour\n"
        )
    if capacity["burstPools"]:
        out.write(f"  burst spend now: {capacity['spendPerHour']:.2f}/hour\n")
    for note in capacity["notes"]:
        out.write(f"  note: {note}\n")


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


def print_table(doc: dict[str, Any], out: TextIO) -> None:
    out.write(f"Plan at {doc['time']} (dry run: nothing was changed)\n")
    if doc["heldBecause"]:
        out.write(f"HOLD: {doc['heldBecause']}\n  nothing would be scaled down, evicted or suspended this tick\n")
    out.write("\n")
    if doc["decisions"]:
        with_hpa = any(d["hpa"] for d in doc["decisions"])
        rows = [["SERVICE", "MODE", "CURRENT", "DESIRED", *(["HPA DESIRED"] if with_hpa else []), "REASON", "DETAIL"]]
        for d in doc["decisions"]:
            hpa = ", ".join(
                f"{h['desiredReplicas'] if h['desiredReplicas'] is not None else '?'} ({h['name']})" for h in d["hpa"]
            )
            rows.append(
                [
                    d["service"],
                    d["mode"],
                    str(d["currentReplicas"]),
                    str(d["desiredReplicas"]),
                    *([hpa or "-"] if with_hpa else []),
                    d["reason"],
                    d["detail"],
                ]
            )
        _table(rows, out)
        if with_hpa:
            out.write(
                "\nAn HPA also scales these Deployments: the controller only recommends for them (no write) "
                "until the HPA is deleted.\n"
            )
        out.write("\nWhy:\n")
        for d in doc["decisions"]:
            out.write(f"  {d['service']}: {d['reasonText']}\n")
        headrooms = [d for d in doc["decisions"] if d.get("headroom")]
        if headrooms:
            out.write("\nEarned headroom (share of the spec's target each forecasting service runs at):\n")
            for d in headrooms:
                h = d["headroom"]
                # the floor's calibrated share of its quantile's excess, when it provisions less than the quantile
                share = f", floor at {h['excessShare']:.1%} of its quantile's excess" if h["excessShare"] < 1 else ""
                out.write(f"  {d['service']}: {h['state']}, target x {h['targetRatio']:g}{share} ({h['detail']})\n")
    else:
        out.write("No GPUScalingPolicy found.\n")
    out.write("\n")
    if doc["actions"]:
        rows = [["ACTION", "TARGET", "CHANGE", "REASON"]]
        for a in doc["actions"]:
            change = a["change"] if a["heldBack"] is None else f"{a['change']} (held back: {a['heldBack']})"
            rows.append([a["kind"], a["target"], change, a["reason"]])
        out.write("Actions the controller would take:\n")
        _table(rows, out)
    else:
        out.write("Actions the controller would take: none\n")
    if doc.get("capacity") is not None:
        _print_capacity(doc["capacity"], out)
    if doc.get("rebalance") is not None:
        _print_rebalance(doc["rebalance"], out)
    if doc["invalidPolicies"]:
        out.write("\nInvalid GPUScalingPolicies (ignored until fixed):\n")
        for p in doc["invalidPolicies"]:
            out.write(f"  {p['policy']}: {p['error']}\n")
    if doc["errors"]:
        out.write("\nErrors:\n")
        for e in doc["errors"]:
            out.write(f"  {e}\n")
