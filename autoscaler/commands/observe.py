"""``autoscaler observe``: one observation against a Prometheus, as the controller would see it.

Run it before enabling the controller: it shows which services and GPUs the queries find, the values the policy
would act on, and every stale reason (the reasons the controller would hold instead of scaling).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autoscaler.core.model import MetricKind, Observation, ServiceObservation, ServicePolicy


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)", except where there is no X to show: the connection options default to the
    AUTOSCALER_PROMETHEUS_* settings, and their help says so."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default == [] or action.default is False:
            return action.help
        return super()._get_help_string(action)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "observe",
        help="print one observation (DCGM + application metrics) from a Prometheus",
        description=(
            "Query Prometheus once, the way the controller does on each tick, and print what it sees per service "
            "and per GPU, with the reason of every stale value. Without --policy, the Deployments that own GPU "
            "pods (from dcgm-exporter's pod mapping) are shown with the default policy. Connection settings come "
            "from AUTOSCALER_PROMETHEUS_* environment variables; the flags below override them."
        ),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="Prometheus base URL (AUTOSCALER_PROMETHEUS_URL, default http://prometheus:9090)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        type=Path,
        default=[],
        metavar="FILE.yaml",
        help="GPUScalingPolicy manifest(s) naming the services to observe (repeatable; multi-document YAML and "
        "kind: List are accepted; default: the Deployments that own GPU pods, with the default policy)",
    )
    parser.add_argument(
        "--time",
        metavar="T",
        help="evaluation time: Unix seconds or ISO 8601 (e.g. 2026-01-31T12:00:00Z); default: now",
    )
    parser.add_argument("--output", choices=("table", "json"), default="table", help="output format")
    parser.add_argument(
        "--bearer-token-file",
        # a string, not a Path: Path("") is Path("."), which the settings' empty-path check could no longer refuse
        type=str,
        metavar="FILE",
        help="bearer token file (AUTOSCALER_PROMETHEUS_BEARER_TOKEN_FILE)",
    )
    parser.add_argument(
        "--insecure-skip-verify",
        action="store_true",
        default=None,
        help="skip TLS verification (AUTOSCALER_PROMETHEUS_INSECURE_SKIP_VERIFY)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="timeout of each request, seconds (AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS, default 10)",
    )
    parser.add_argument(
        "--max-gpus", type=int, default=50, metavar="N", help="GPU rows in the table (0 = none, -1 = all)"
    )
    parser.add_argument("--fail-on-stale", action="store_true", help="exit 1 when any service is stale")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from pydantic import ValidationError

    from autoscaler.adapters.prometheus import connect, services_from_gpus
    from autoscaler.adapters.prometheus_settings import PrometheusSettings
    from autoscaler.ports import PortError
    from autoscaler.settings import prometheus_environment_problems

    # The table shows every stale reason; the adapter's summary warning would only repeat the first one.
    logging.getLogger("autoscaler.adapters.prometheus").setLevel(logging.ERROR)
    overrides: dict[str, Any] = {
        "url": args.prometheus_url,
        "bearer_token_file": args.bearer_token_file,
        "insecure_skip_verify": args.insecure_skip_verify,
        "timeout_seconds": args.timeout,
    }
    problems = prometheus_environment_problems()
    if problems:
        return _fail("invalid Prometheus settings: " + "; ".join(problems))
    try:
        settings = PrometheusSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        invalid = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        return _fail(f"invalid Prometheus settings: {invalid}")
    try:
        now = parse_time(args.time) if args.time else time.time()
        policies, queries = load_policies(args.policy)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        source = connect(settings, service_queries=queries)
        info = source.check()
    except PortError as exc:
        return _fail(str(exc))
    except ValueError as exc:
        return _fail(str(exc))
    try:
        discovered = not policies
        observation = source.observe(policies, now)
        if discovered:
            policies = services_from_gpus(observation.gpus)
            observation = source.observe(policies, now)
        stats = source.last_stats
    finally:
        source.close()
    header = {
        "prometheus": info.url,
        "version": info.version,
        "time": now,
        "queries": stats.queries,
        "seconds": round(stats.seconds, 4),
        "services_discovered": discovered,
    }
    if args.output == "json":
        print(json.dumps(to_json(observation, policies, header), indent=2, sort_keys=False, default=_json_default))
    else:
        print(format_table(observation, policies, header, args.max_gpus))
    if args.fail_on_stale and any(o.stale_reasons for o in observation.services.values()):
        return 1
    return 0


# ---- inputs ----------------------------------------------------------------------------------------------------


#: The latest evaluation time, 9999-12-31T23:59:59Z: a later one has no date to print (and nan, inf neither).
LATEST_TIME = 253_402_300_799.0


def checked_time(value: float, text: str, flag: str = "--time") -> float:
    """``value`` (parsed from ``text``) when it is a time from 1970 to the year 9999; ValueError naming ``flag``."""
    if not (math.isfinite(value) and 0 <= value <= LATEST_TIME):
        raise ValueError(
            f"{flag}: {text!r} is not a time from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z "
            f"(Unix seconds 0 to {LATEST_TIME:.0f})"
        )
    return value


def parse_time(text: str) -> float:
    """Unix seconds or ISO 8601 (a trailing Z means UTC; no zone also means UTC), from 1970 to the year 9999."""
    try:
        value = float(text)
    except ValueError:
        value = _iso_time(text)
    return checked_time(value, text)


def _iso_time(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--time: {text!r} is neither Unix seconds nor ISO 8601") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.timestamp()
    except OverflowError:  # 0001-01-01T00:00:00+05:00 is before the first date
        return math.nan


def load_policies(paths: Sequence[Path]) -> tuple[list[ServicePolicy], dict[str, Any]]:
    """GPUScalingPolicy manifests -> (policies, per-service query overrides); ValueError names file and object."""
    from pydantic import ValidationError

    from autoscaler.adapters.prometheus import validate_service_query
    from autoscaler.adapters.promql import PromQLError
    from autoscaler.policy import KIND, GPUScalingPolicySpec, to_service_policy

    policies: list[ServicePolicy] = []
    queries: dict[str, Any] = {}
    for path in paths:
        items: list[Any] = []
        for number, doc in enumerate(_documents(path), start=1):
            if isinstance(doc, dict) and doc.get("kind") == "List":
                listed = doc.get("items")
                if listed is not None and not isinstance(listed, list):
                    raise ValueError(
                        f"--policy {path}: document {number} (kind: List): items must be a list, "
                        f"got {type(listed).__name__}"
                    )
                items.extend(listed or [])
            elif doc is not None:
                items.append(doc)
        for index, item in enumerate(items):
            if not isinstance(item, dict) or item.get("kind") != KIND:
                continue
            meta = item.get("metadata")
            if meta is None:
                meta = {}
            where = f"--policy {path}: {KIND} #{index + 1}"
            if not isinstance(meta, dict):
                raise ValueError(f"{where}: metadata must be a mapping, got {type(meta).__name__}")
            for key in ("name", "namespace"):
                if meta.get(key) is not None and not isinstance(meta[key], str):
                    raise ValueError(f"{where}: metadata.{key} must be a string, got {type(meta[key]).__name__}")
            name, namespace = meta.get("name") or "", meta.get("namespace") or "default"
            if name:
                where = f"--policy {path}: {KIND} {name}"
            spec = item.get("spec")
            if spec is not None and not isinstance(spec, dict):
                raise ValueError(f"{where}: spec must be a mapping, got {type(spec).__name__}")
            try:
                parsed = GPUScalingPolicySpec.model_validate(spec or {})
            except ValidationError as exc:
                problems = "; ".join(f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"{where}: {problems}") from None
            policy = to_service_policy(namespace, name, parsed)
            for field_name in ("request_rate", "queue_depth", "latency"):
                query = getattr(parsed.queries, field_name)
                if query:
                    try:
                        validate_service_query(query)
                    except PromQLError as exc:
                        raise ValueError(f"{where}: spec.queries: {exc}") from None
            policies.append(policy)
            queries[policy.key] = parsed.queries
    if paths and not policies:
        raise ValueError(f"--policy: no {KIND} objects in {', '.join(map(str, paths))}")
    return policies, queries


def _documents(path: Path) -> list[Any]:
    """The YAML documents of one --policy file, loaded as every YAML input of the project (``yaml_input``): safely,
    a key given twice refused, nesting too deep or a value Python refuses reported, never raised."""
    from autoscaler.yaml_input import YamlProblem, decode_utf8, load_yaml_all

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"--policy {path}: {exc.strerror or exc}") from None
    try:
        text = decode_utf8(raw)
    except YamlProblem as problem:
        raise ValueError(f"--policy {path}: {problem}") from None
    try:
        return load_yaml_all(text)
    except YamlProblem as problem:
        at = f" (line {problem.line}, column {problem.column})" if problem.line is not None else ""
        raise ValueError(f"--policy {path}: not valid YAML: {problem}{at}") from None


# ---- outputs ---------------------------------------------------------------------------------------------------


def to_json(observation: Observation, policies: Sequence[ServicePolicy], header: dict[str, Any]) -> dict[str, Any]:
    by_key = {p.key: p for p in policies}
    services = []
    for key, obs in observation.services.items():
        entry = asdict(obs)
        policy = by_key.get(key)
        if policy is not None:
            entry["metric"] = policy.metric.value
            entry["target"] = policy.target
            entry["value"] = _scaling_value(policy, obs)
        entry["stale"] = bool(obs.stale_reasons)
        services.append(entry)
    return {**header, "services": services, "gpus": [asdict(g) for g in observation.gpus]}


def format_table(
    observation: Observation, policies: Sequence[ServicePolicy], header: dict[str, Any], max_gpus: int = 50
) -> str:
    when = datetime.fromtimestamp(header["time"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    version = f" {header['version']}" if header.get("version") else ""
    lines = [
        f"Prometheus{version} at {header['prometheus']}, time {when} ({header['time']:.0f}): "
        f"{header['queries']} queries in {header['seconds']:.3f} s",
        "",
    ]
    by_key = {p.key: p for p in policies}
    rows = [("SERVICE", "METRIC", "VALUE", "TARGET", "PODS ok/miss/unready", "REQ/S", "QUEUE", "LATENCY", "STATUS")]
    for key, obs in observation.services.items():
        policy = by_key.get(key)
        pods = obs.pods
        rows.append(
            (
                key,
                policy.metric.value if policy else "?",
                _fmt(_scaling_value(policy, obs) if policy else None),
                f"{policy.target:g}" if policy else "",
                f"{pods.ready_with_metric}/{pods.missing}/{pods.unready}" if pods else "-",
                _fmt(obs.request_rate),
                _fmt(obs.queue_depth),
                f"{obs.latency_s:.3g} s" if obs.latency_s is not None else "-",
                "STALE: " + "; ".join(obs.stale_reasons)
                if obs.stale_reasons
                # complete enough to scale up on, not to scale down on (the controller holds it)
                else "PARTIAL: " + "; ".join(obs.partial_reasons)
                if obs.partial_reasons
                else "ok",
            )
        )
    if len(rows) == 1:
        lines.append("no services (no --policy, and no GPU pod belongs to a Deployment)")
    else:
        lines += _columns(rows)
    gpus = observation.gpus
    nodes = {g.node for g in gpus}
    stale = sum(1 for g in gpus if g.stale_reasons)
    models = sorted({g.model_name for g in gpus if g.model_name})
    model_text = ", ".join(models) or "no model label"
    lines += ["", f"{len(gpus)} GPU(s) on {len(nodes)} node(s) ({model_text}), {stale} stale"]
    if max_gpus != 0 and gpus:
        shown = gpus if max_gpus < 0 else gpus[:max_gpus]
        grows = [("NODE", "GPU", "MODEL", "UTIL %", "ENGINE", "FB USED MiB", "FB FREE MiB", "POD", "STATUS")]
        for g in shown:
            grows.append(
                (
                    g.node,
                    g.gpu,
                    g.model_name,
                    _fmt(g.utilization),
                    _fmt(g.engine_active),
                    _fmt(g.fb_used_mib),
                    _fmt(g.fb_free_mib),
                    f"{g.namespace}/{g.pod}" if g.pod else "-",
                    "STALE: " + "; ".join(g.stale_reasons) if g.stale_reasons else "ok",
                )
            )
        lines += _columns(grows)
        if len(shown) < len(gpus):
            lines.append(f"... {len(gpus) - len(shown)} more GPUs (--max-gpus -1 shows all, --output json has all)")
    return "\n".join(lines)


def _scaling_value(policy: ServicePolicy, obs: ServiceObservation) -> float | None:
    """The value the policy compares with its target: the per-pod average, or the service total."""
    if policy.metric in (MetricKind.REQUEST_RATE, MetricKind.QUEUE_DEPTH):
        return obs.metric_total
    if obs.pods is None or obs.pods.ready_with_metric == 0:
        return None
    return obs.pods.metric_sum / obs.pods.ready_with_metric


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    # The last column (status) is free text: it is not padded, so long reasons do not widen every row.
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in rows]


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _fail(message: str) -> int:
    print(f"autoscaler observe: {message}", file=sys.stderr)
    return 2
