"""``autoscaler run``: the in-cluster controller (scheduler, leader election, /metrics, /healthz, /readyz)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import textwrap
import uuid
from pathlib import Path

EXIT_OK = 0
EXIT_TICK_FAILED = 1
EXIT_SETTINGS = 2
EXIT_NOT_LEADER = 3

log = logging.getLogger("autoscaler")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the controller (in a cluster, or against a kubeconfig)",
        description=textwrap.dedent(
            """\
            Run the controller: every tick (default 15 s) read the GPUScalingPolicies, the cluster and Prometheus,
            decide, and act through the Kubernetes API. Several replicas may run: a coordination.k8s.io/v1 Lease
            elects the one that acts. Serves /metrics, /healthz and /readyz. SIGTERM stops acting at once (but for
            the remaining evictions of a gang whose first pod is evicted, made while the Lease allows), lets a
            running tick or rebalance pass finish (shutdown_grace_seconds) and releases the Lease so a standby
            takes over quickly; one still running after the grace is left behind (the process exits) and the
            Lease then expires instead of being released, as a write of it may still be in flight.

            Every setting comes from (highest first) these flags, AUTOSCALER_* environment variables, the
            config file, then the defaults; 'autoscaler run --list-settings' prints them all.
            """
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 ok; 1 the --once tick could not read what it needed, or the Kubernetes API could not "
        "be reached to take the Lease; 2 invalid settings or no cluster configuration; 3 --once and another replica "
        "holds the Lease",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML or JSON settings file (default: $AUTOSCALER_CONFIG_FILE); the environment overrides it",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help='compute and report every plan (log, metrics with dry_run="true", Events marked [dry-run]) '
        "and write nothing else (AUTOSCALER_DRY_RUN)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="run one tick and exit, acting only if this process can take the Lease (no scheduler, no HTTP)",
    )
    parser.add_argument(
        "--tick-interval",
        type=float,
        metavar="SECONDS",
        help="seconds between ticks (AUTOSCALER_TICK_INTERVAL_SECONDS, default 15)",
    )
    parser.add_argument(
        "--port", type=int, metavar="PORT", help="TCP port of /metrics /healthz /readyz (AUTOSCALER_HTTP__PORT, 8080)"
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig to use instead of the in-cluster service account (AUTOSCALER_KUBERNETES__KUBECONFIG)",
    )
    parser.add_argument("--prometheus-url", metavar="URL", help="Prometheus base URL (AUTOSCALER_PROMETHEUS_URL)")
    parser.add_argument(
        "--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="log level (AUTOSCALER_LOG_LEVEL, INFO)"
    )
    parser.add_argument("--list-settings", action="store_true", help="print every setting and exit")
    parser.set_defaults(func=main)


def overrides_from(args: argparse.Namespace) -> dict[str, object]:
    """Command-line flags as settings overrides (absent flags never mask the environment)."""
    overrides: dict[str, object] = {
        "dry_run": getattr(args, "dry_run", None),
        "tick_interval_seconds": getattr(args, "tick_interval", None),
        "log_level": getattr(args, "log_level", None),
    }
    if getattr(args, "port", None) is not None:
        overrides["http"] = {"port": args.port}  # deep-merged with the env/file values of the group
    if getattr(args, "kubeconfig", None) is not None:
        overrides["kubernetes"] = {"kubeconfig": args.kubeconfig}
    if getattr(args, "prometheus_url", None):
        overrides["prometheus"] = {"url": args.prometheus_url}
    return overrides


def print_settings() -> None:
    from autoscaler.settings import settings_table

    rows = settings_table()
    width = max(len(r[0]) for r in rows)
    for env, key, default, description in rows:
        print(f"{env:<{width}}  {default:<16}  {description}  [file: {key}]")


def main(args: argparse.Namespace) -> int:
    from autoscaler.settings import SettingsError, load_settings

    if args.list_settings:
        print_settings()
        return EXIT_OK
    try:
        settings = load_settings(args.config, **overrides_from(args))
    except SettingsError as exc:
        print(f"autoscaler run: {exc}", flush=True)
        return EXIT_SETTINGS

    from autoscaler.app import build_runtime
    from autoscaler.runtime import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    log.info(
        "starting: tick %gs, dry_run=%s, namespaces=%s, leader election %s (lease %s/%s as %s)",
        settings.tick_interval_seconds,
        settings.dry_run,
        ",".join(settings.namespaces) or "(all)",
        "on" if settings.leader_election.enabled else "off",
        settings.leader_election.lease_namespace,
        settings.leader_election.lease_name,
        settings.leader_election.identity,
    )
    from autoscaler.adapters.kubernetes import KubeConfigError

    try:
        runtime = build_runtime(settings, http=not args.once)
    except (KubeConfigError, SettingsError) as exc:
        # no cluster configuration, or settings that need what the environment lacks (POD_NAME for the leader pod
        # label): configuration that will not fix itself, as for plan
        log.error("cannot start: %s", exc)
        return EXIT_SETTINGS
    except Exception as exc:  # other startup errors get one readable line
        log.error("cannot start: %s", exc)
        return EXIT_TICK_FAILED
    if args.once:
        return run_once(runtime)
    code = runtime.run_forever()
    still = runtime.jobs_running()
    if still:
        # A job outlived shutdown_grace_seconds (a hung read): it can no longer act, but the interpreter would wait
        # for its thread at exit, and the pod would stay Terminating until the kubelet's SIGKILL.
        log.warning("%d job(s) still running after the shutdown grace period: exiting without them", still)
        exit_now(code)
    return code


def exit_now(code: int) -> None:
    """End the process at once (no waiting for worker threads), after flushing the logs and the standard streams."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def run_once(runtime: object) -> int:
    from autoscaler.runtime import Runtime, read_the_policies

    assert isinstance(runtime, Runtime)
    elector = runtime.elector
    if elector is not None:
        # A Lease identity of its own, never the running controller's: run inside the leader's pod (``kubectl exec
        # ... autoscaler run --once``), POD_NAME is the leader's, and its Lease was taken as this process's own
        # renewal -- it acted beside the running leader (two writers), then released the Lease under it.
        elector.identity = f"{elector.identity}-once-{uuid.uuid4().hex[:8]}"
    if elector is not None and not elector.try_acquire_or_renew():
        if elector.last_error is not None:
            # Unreachable API server, a timeout, 403, 5xx...: nobody is known to hold the Lease, we could not ask.
            log.error("could not reach the Kubernetes API to take the Lease: %s", elector.last_error)
            return EXIT_TICK_FAILED
        log.error("another replica holds the Lease (%s): not acting", elector.holder or "unknown")
        return EXIT_NOT_LEADER
    try:
        runtime.tick()
    finally:
        if elector is not None:
            elector.release()
    report = runtime.controller.last_report
    # 1 only when the tick could not read the policies or the cluster (README): one held on its metrics alone (a
    # Prometheus outage) read both and held its services as designed, as /readyz counts it
    return EXIT_OK if report is not None and read_the_policies(report) else EXIT_TICK_FAILED
