"""Review of configuration and process lifecycle: values that were accepted at load and failed (or busy-looped) at run
time, and a shutdown that released the Lease under a write in flight or did not end after its grace period."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object

from autoscaler.adapters.kubernetes_lease import ElectionTimings, InMemoryLeaseStore, LeaderElector
from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.runtime import Runtime
from autoscaler.settings import SettingsError, load_settings
from autoscaler.telemetry import Telemetry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AUTOSCALER_") or key in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(key)


def settings_error(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> str:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    return str(info.value)


# ---- values the API server (or the scheduler) would only refuse at run time -----------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # A namespace that cannot exist: its policies were never seen, with no error anywhere.
        ({"AUTOSCALER_NAMESPACES": "ml,Bad NS"}, "AUTOSCALER_NAMESPACES (namespaces): 'Bad NS' is not a namespace"),
        ({"AUTOSCALER_NAMESPACES": '{"ml": 1}'}, "AUTOSCALER_NAMESPACES (namespaces): '{\"ml\": 1}' is not a"),
        ({"AUTOSCALER_NAMESPACES": "a" * 64}, "AUTOSCALER_NAMESPACES (namespaces): 'aaaa"),
        # A Lease the API server refuses to create (422): the controller never leads, every replica stands by.
        (
            {"AUTOSCALER_LEADER_ELECTION__LEASE_NAME": "Bad_Name!"},
            "AUTOSCALER_LEADER_ELECTION__LEASE_NAME (leader_election.lease_name): String should match pattern",
        ),
        (
            {"AUTOSCALER_LEADER_ELECTION__LEASE_NAME": "a" * 250},  # + "-dry-run" is over 253 characters
            "AUTOSCALER_LEADER_ELECTION__LEASE_NAME (leader_election.lease_name): String should have at most 245",
        ),
        (
            {"AUTOSCALER_LEADER_ELECTION__LEASE_NAMESPACE": "Bad NS"},
            "AUTOSCALER_LEADER_ELECTION__LEASE_NAMESPACE (leader_election.lease_namespace): String should match",
        ),
        (
            {"AUTOSCALER_NODE_POOLS__NAMESPACE": "under_score"},
            "AUTOSCALER_NODE_POOLS__NAMESPACE (node_pools.namespace): String should match pattern",
        ),
        # An empty kubeconfig was Path("."): in a pod it switched off the in-cluster config ("auto" saw a kubeconfig)
        # and start-up failed on reading a directory, exit 1 (a crash loop), naming no setting.
        (
            {"AUTOSCALER_KUBERNETES__KUBECONFIG": ""},
            "AUTOSCALER_KUBERNETES__KUBECONFIG (kubernetes.kubeconfig): must not be empty",
        ),
        # One hung Prometheus query (every retry timing out) outlasted the stall bound: /healthz failed and the
        # livenessProbe restarted the controller through the outage it should have held through.
        (
            {"AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "60"},
            "AUTOSCALER_TICK_STALL_SECONDS (tick_stall_seconds) (120) must be > AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS "
            "(prometheus.timeout_seconds) (60) x (1 + 2 x AUTOSCALER_PROMETHEUS_RETRIES (prometheus.retries) (2))",
        ),
        # the sleeps between retries count too: 3 tries of 30 s fit in 120 s, with two sleeps of up to 30 s not
        (
            {"AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "30"},
            "AUTOSCALER_TICK_STALL_SECONDS (tick_stall_seconds) (120) must be > AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS",
        ),
        (
            {"AUTOSCALER_PROMETHEUS_RETRIES": "10", "AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "11"},
            "AUTOSCALER_TICK_STALL_SECONDS (tick_stall_seconds) (120) must be > AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS",
        ),
        # Job intervals far below a second: each job reads the cluster or Prometheus, so this is a busy loop.
        (
            {"AUTOSCALER_REFIT_INTERVAL_SECONDS": "0.001"},
            "AUTOSCALER_REFIT_INTERVAL_SECONDS (refit_interval_seconds): must be >= 1",
        ),
        (
            {"AUTOSCALER_REBALANCE_INTERVAL_SECONDS": "0.0001"},
            "AUTOSCALER_REBALANCE_INTERVAL_SECONDS (rebalance_interval_seconds): must be >= 1",
        ),
        (
            {"AUTOSCALER_FORECAST__UPDATE_INTERVAL_SECONDS": "0.001"},
            "AUTOSCALER_FORECAST__UPDATE_INTERVAL_SECONDS (forecast.update_interval_seconds): must be 0 (off) or >= 1",
        ),
    ],
    ids=lambda v: ",".join(f"{k.removeprefix('AUTOSCALER_')}={x[:20]}" for k, x in v.items())
    if isinstance(v, dict)
    else "",
)
def test_values_that_fail_at_run_time_are_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    assert expected in settings_error(monkeypatch, env)


@pytest.mark.parametrize(
    "env",
    [
        {"AUTOSCALER_NAMESPACES": "ml, search-2"},
        {"AUTOSCALER_NAMESPACES": ""},
        {"AUTOSCALER_LEADER_ELECTION__LEASE_NAME": "gpu-autoscaler.example.com", "AUTOSCALER_DRY_RUN": "true"},
        {"AUTOSCALER_LEADER_ELECTION__LEASE_NAME": "a" * 245},
        {"AUTOSCALER_LEADER_ELECTION__LEASE_NAMESPACE": "kube-system", "AUTOSCALER_NODE_POOLS__NAMESPACE": "capi"},
        {"AUTOSCALER_KUBERNETES__KUBECONFIG": "/etc/kubeconfig"},
        {"AUTOSCALER_REFIT_INTERVAL_SECONDS": "1", "AUTOSCALER_REBALANCE_INTERVAL_SECONDS": "1"},
        {"AUTOSCALER_FORECAST__UPDATE_INTERVAL_SECONDS": "0"},
        {"AUTOSCALER_FORECAST__UPDATE_INTERVAL_SECONDS": "1.5"},
        {"AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "60", "AUTOSCALER_TICK_STALL_SECONDS": "301"},
        {"AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "23"},
    ],
    ids=lambda env: ",".join(f"{k.removeprefix('AUTOSCALER_')}={v[:20]}" for k, v in env.items()),
)
def test_sensible_values_still_load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    if "AUTOSCALER_NAMESPACES" in env:
        assert settings.namespaces == [n.strip() for n in env["AUTOSCALER_NAMESPACES"].split(",") if n.strip()]


def test_the_default_lease_namespace_is_still_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default comes from POD_NAMESPACE: a bad one is named like the setting it fills."""
    monkeypatch.setenv("POD_NAMESPACE", "Not A Namespace")
    assert "(leader_election.lease_namespace)" in settings_error(monkeypatch, {})


# ---- shutdown: the Lease and writes in flight ---------------------------------------------------------------------

FAST = ElectionTimings(lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.05)


def leader_runtime(grace: float, rebalance: object) -> tuple[Runtime, InMemoryLeaseStore]:
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    telemetry = Telemetry(identity="a")
    controller = Controller(
        metrics=FakeMetrics(cluster),
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(),
        telemetry=telemetry,
    )
    store = InMemoryLeaseStore()
    ref: list[Runtime] = []
    elector = LeaderElector(
        store,
        "a",
        FAST,
        on_started_leading=lambda: ref[0].on_started_leading(),
        on_stopped_leading=lambda: ref[0].on_stopped_leading(),
    )
    runtime = Runtime(
        controller,
        telemetry,
        tick_interval_s=60,
        rebalance_interval_s=60,
        tick_stall_s=120,
        shutdown_grace_s=grace,
        elector=elector,
        rebalance=rebalance,  # type: ignore[arg-type]
        http=None,
    )
    ref.append(runtime)
    return runtime, store


def a_write_in_flight(store: InMemoryLeaseStore, seconds: float) -> tuple[object, threading.Event, list[str]]:
    """A rebalance job that sends one write (an eviction) taking ``seconds``, and records who held the Lease when it
    landed on the API server."""
    entered = threading.Event()
    holders: list[str] = []

    def job(now: float) -> None:
        entered.set()
        time.sleep(seconds)
        holders.append(store.record.holder if store.record is not None else "")

    return job, entered, holders


def lead_then_run_the_rebalance(runtime: Runtime, entered: threading.Event) -> None:
    """Start ``runtime``, wait until it leads, run its rebalance job now and wait until the job's write began."""
    runtime.start()
    assert runtime.elector is not None
    deadline = time.monotonic() + 5
    while not runtime.elector.is_leader() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runtime.elector.is_leader()
    runtime.scheduler.modify_job("rebalance", next_run_time=datetime.now(UTC))
    assert entered.wait(5)


def test_stop_waits_for_a_rebalance_write_before_releasing_the_lease() -> None:
    """stop() waited for the tick only: a rebalance pass's eviction in flight landed after the Lease was released,
    when a standby may already have been acting."""
    job_box: list[object] = []
    runtime, store = leader_runtime(grace=3.0, rebalance=lambda now: job_box[0](now))  # type: ignore[operator]
    job, entered, holders = a_write_in_flight(store, 0.5)
    job_box.append(job)
    try:
        lead_then_run_the_rebalance(runtime, entered)
    finally:
        runtime.stop()
    assert holders == ["a"], "the Lease was released while the rebalance write was in flight"
    assert store.record is not None and store.record.holder == ""  # released once the write had landed


def test_a_job_that_outlives_the_grace_leaves_the_lease_to_expire() -> None:
    """Past the grace a job may still have a write in flight (the grace may be shorter than a request's timeout):
    releasing the Lease then let a standby act at once, beside it. The Lease is left to expire instead, which
    LeaderElector.may_write keeps after every write that started in time."""
    job_box: list[object] = []
    runtime, store = leader_runtime(grace=0.2, rebalance=lambda now: job_box[0](now))  # type: ignore[operator]
    job, entered, holders = a_write_in_flight(store, 1.0)
    job_box.append(job)
    try:
        lead_then_run_the_rebalance(runtime, entered)
    finally:
        started = time.monotonic()
        runtime.stop()
        took = time.monotonic() - started
    assert took < 1.0  # the grace still bounds stop()
    deadline = time.monotonic() + 5
    while not holders and time.monotonic() < deadline:
        time.sleep(0.02)
    assert holders == ["a"], "the Lease was released while a write was still in flight"
    assert not runtime.can_act()  # it no longer acts
    assert store.record is not None and store.record.holder == "a"  # and a standby takes over at expiry
    assert store.record.lease_duration_s == FAST.lease_duration_s  # not the 1 s of a release


# ---- shutdown: the process ends after its grace period ----------------------------------------------------------

HUNG_TICK = textwrap.dedent(
    """
    import argparse, os, signal, sys, threading, time
    sys.path.insert(0, "tests/runtime")
    from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object
    import autoscaler.app
    from autoscaler.commands import run
    from autoscaler.controller import Controller
    from autoscaler.core.model import ServicePolicy
    from autoscaler.runtime import Runtime
    from autoscaler.telemetry import Telemetry

    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    telemetry = Telemetry(identity="x")
    controller = Controller(
        metrics=FakeMetrics(cluster), cluster=cluster, writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(), telemetry=telemetry,
    )
    entered = threading.Event()

    def hang(now):  # a read that never returns (within the test)
        entered.set()
        time.sleep(60)

    cluster.snapshot = hang
    runtime = Runtime(controller, telemetry, tick_interval_s=30, tick_stall_s=60, shutdown_grace_s=0.5, http=None)
    autoscaler.app.build_runtime = lambda settings, http=True: runtime

    def sigterm():
        entered.wait(10)
        print("SIGTERM", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=sigterm, daemon=True).start()
    args = argparse.Namespace(list_settings=False, config=None, once=False, dry_run=None, tick_interval=None,
                              port=None, kubeconfig=None, prometheus_url=None, log_level=None)
    sys.exit(run.main(args))
    """
)


def test_run_exits_after_the_grace_even_when_a_tick_hangs() -> None:
    """stop() returned after shutdown_grace_seconds, but the interpreter then waited for the scheduler's worker
    thread (a non-daemon pool thread) until the hung tick returned: the pod stayed Terminating until SIGKILL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    env["PYTHONPATH"] = str(REPO)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", HUNG_TICK], cwd=REPO, env=env, capture_output=True, text=True, timeout=90
    )
    took = time.monotonic() - started
    assert "SIGTERM" in result.stdout, result.stdout + result.stderr
    assert took < 30, f"took {took:.1f}s to exit after SIGTERM (the hung tick sleeps 60s)"
    assert result.returncode == 0, result.stdout + result.stderr
    assert "still running" in result.stderr


# ---- start-up: a Prometheus outage must not keep /healthz from being served ---------------------------------------


def test_an_unanswering_prometheus_does_not_delay_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build_adapters checked Prometheus before anything else, with its timeout and retries: a Prometheus that accepts
    connections and never answers held start-up (and /healthz) for timeout x (retries + 1) plus the backoff, and
    with AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS=30 that is past the Deployment's startupProbe (60 s): the kubelet
    restarted the pod, again and again, for as long as the outage lasted. The outage is only logged."""
    import socket

    from autoscaler.app import build_adapters
    from tests.kube.fake_apiserver import write_kubeconfig

    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(8)  # accepts (in the kernel), never answers
        port = blackhole.getsockname()[1]
        monkeypatch.setenv("AUTOSCALER_KUBERNETES__CONFIG_MODE", "kubeconfig")
        monkeypatch.setenv(
            "AUTOSCALER_KUBERNETES__KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1"))
        )
        monkeypatch.setenv("AUTOSCALER_PROMETHEUS_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS", "2")
        monkeypatch.setenv("AUTOSCALER_PROMETHEUS_RETRIES", "1")
        settings = load_settings()
        started = time.monotonic()
        adapters = build_adapters(settings)
        took = time.monotonic() - started
    assert adapters.metrics is not None
    assert took < 1.5, f"start-up waited {took:.1f}s for Prometheus"


# ---- bind addresses -----------------------------------------------------------------------------------------------


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize(("bind_address", "connect_to"), [("::", "[::1]"), ("::1", "[::1]"), ("[::1]", "[::1]"),
                                                          ("[::]", "[::1]"), ("::", "127.0.0.1")])
def test_healthz_is_served_on_an_ipv6_bind_address(bind_address: str, connect_to: str) -> None:
    """The HTTP server was an AF_INET server: "::" (which the settings call a wildcard, and which an IPv6-only
    cluster needs) failed at start-up with "Address family for hostname not supported", exit 1, a crash loop."""
    import urllib.request

    from autoscaler.telemetry import HttpServer

    server = HttpServer(Telemetry(identity="x"), lambda: (True, "alive"), lambda: (True, "ready"), bind_address, 0)
    server.start()
    try:
        with urllib.request.urlopen(f"http://{connect_to}:{server.port}/healthz", timeout=5) as response:
            assert (response.status, response.read()) == (200, b"ok: alive\n")
    finally:
        server.stop()


@pytest.mark.parametrize("env", ["AUTOSCALER_HTTP__BIND_ADDRESS", "AUTOSCALER_SCHEDULER_EXTENDER__BIND_ADDRESS"])
@pytest.mark.parametrize("value", ["not an address", "999.1.1.1", "10.0.0.1:8080", "[10.0.0.1]"])
def test_a_bind_address_that_cannot_be_bound_is_refused(monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    """It failed at start-up instead (exit 1, "Name or service not known"), naming no setting."""
    key = env.removeprefix("AUTOSCALER_").lower().replace("__", ".")
    assert f"{env} ({key}): {value!r} is not an IP address or host name" in settings_error(monkeypatch, {env: value})


@pytest.mark.parametrize("value", ["", "0.0.0.0", "127.0.0.1", "::", "[::]", "::1", "[fe80::1]", "localhost",
                                   "controller.ns.svc"])
def test_bind_addresses_that_can_be_bound_still_load(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AUTOSCALER_HTTP__BIND_ADDRESS", value)
    assert load_settings().http.bind_address == value


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize(("bind_address", "connect_to"), [("::", "::1"), ("[::1]", "::1"), ("::", "127.0.0.1")])
def test_the_scheduler_extender_is_served_on_an_ipv6_bind_address(bind_address: str, connect_to: str) -> None:
    """The extender's server was IPv4-only too: AUTOSCALER_SCHEDULER_EXTENDER__BIND_ADDRESS=:: passed the settings
    and failed at start-up."""
    import http.client

    from autoscaler.core.extender import ExtenderConfig
    from autoscaler.extender_http import Extender, ExtenderServer, LatestSnapshot
    from autoscaler.fakes.cluster import FakeCluster

    server = ExtenderServer(Extender(LatestSnapshot(FakeCluster()).latest, ExtenderConfig(60)), bind_address, 0)
    server.start()
    try:
        conn = http.client.HTTPConnection(connect_to, server.port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.stop()


@pytest.mark.parametrize(
    "env",
    [
        "AUTOSCALER_PROMETHEUS_BEARER_TOKEN_FILE",
        "AUTOSCALER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
        "AUTOSCALER_PROMETHEUS_CA_BUNDLE",
        "AUTOSCALER_PROMETHEUS_CLIENT_CERT_FILE",
    ],
)
def test_an_empty_prometheus_file_setting_is_refused(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    """An empty value became Path("."): the working directory was read as the token or CA file at every query."""
    key = "prometheus." + env.removeprefix("AUTOSCALER_PROMETHEUS_").lower()
    assert f"{env} ({key}): must not be empty" in settings_error(monkeypatch, {env: ""})
