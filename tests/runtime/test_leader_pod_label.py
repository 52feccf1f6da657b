"""leader_election.label_leader_pod: the leader labels its own pod ``gpuautoscaler.dev/leader=<Lease name>`` and takes
the label off any other pod of its namespace, a replica that stops leading takes it off its own pod, so that a Service
selecting the label (the scheduler-extender overlay's) reaches the leader alone. Before, the overlay's Service reached
both replicas, and the standby answered the scheduler from a view up to a tick interval behind the leader's.

Against the REST-faithful fake API server (merge patches, label selectors, 404s), with the real adapter and the
runtime's ticks driven by hand; the real control plane (EndpointSlices following the label) is
tests/realkube/test_extender_leader_only_real.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object

from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL, KubernetesLeaderPodLabel
from autoscaler.adapters.kubernetes_lease import ElectionTimings, InMemoryLeaseStore, LeaderElector
from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.ports import WriteNotAllowed
from autoscaler.runtime import Runtime
from autoscaler.settings import Settings, SettingsError, load_settings
from autoscaler.telemetry import Telemetry
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NAMESPACE = "gpu-autoscaler"
LEASE = "gpu-autoscaler"
PATCHES = r"/api/v1/namespaces/gpu-autoscaler/pods/"
# No test here waits for an expiry: leadership moves by release() only.
TIMINGS = ElectionTimings(lease_duration_s=30.0, renew_deadline_s=20.0, retry_period_s=1.0)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_client(apiserver: FakeApiServer, tmp_path: Path) -> Iterator[client.ApiClient]:
    api = load_api_client("kubeconfig", apiserver.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


def controller_pod(name: str, leader_of: str | None = None) -> dict[str, object]:
    labels = {"app.kubernetes.io/name": "gpu-autoscaler", "app.kubernetes.io/component": "controller"}
    if leader_of is not None:
        labels[LEADER_LABEL] = leader_of
    return o.pod(name, NAMESPACE, gpus=0, node_name="node-0", labels=labels)


def leader_label_of(server: FakeApiServer, pod: str) -> str | None:
    obj = server.get("v1", "Pod", pod, NAMESPACE)
    assert obj is not None, pod
    return (obj["metadata"].get("labels") or {}).get(LEADER_LABEL)


def labelled(server: FakeApiServer) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in server.objects("v1", "Pod", NAMESPACE)
        if (p["metadata"].get("labels") or {}).get(LEADER_LABEL) == LEASE
    }


def pod_writes(server: FakeApiServer) -> int:
    return server.request_count("PATCH", PATCHES)


def adapter(api_client: client.ApiClient, pod: str) -> KubernetesLeaderPodLabel:
    return KubernetesLeaderPodLabel(api_client, NAMESPACE, pod, LEASE, request_timeout_s=5)


# ---- the adapter -----------------------------------------------------------------------------------------------------


def test_the_leader_labels_its_pod_then_unlabels_the_stale_leaders_only(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        controller_pod("ctrl-a"),
        controller_pod("ctrl-crashed", leader_of=LEASE),  # a former leader that could not take its label off
        controller_pod("dry-run-ctrl", leader_of=f"{LEASE}-dry-run"),  # another Lease's leader: not ours to touch
    )
    adapter(api_client, "ctrl-a").mark_leader(lambda: True)
    assert labelled(apiserver) == {"ctrl-a"}
    assert leader_label_of(apiserver, "dry-run-ctrl") == f"{LEASE}-dry-run"
    # labelled first, then the sweep: for a moment two endpoints rather than none
    patched = [r.path.rsplit("/", 1)[1] for r in apiserver.requests if r.method == "PATCH"]
    assert patched == ["ctrl-a", "ctrl-crashed"]
    assert all(r.content_type == "application/merge-patch+json" for r in apiserver.requests if r.method == "PATCH")
    # the other labels of the pods are kept (a merge patch of one key)
    crashed = apiserver.get("v1", "Pod", "ctrl-crashed", NAMESPACE)
    assert crashed is not None and crashed["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-autoscaler"

    adapter(api_client, "ctrl-a").unmark()
    assert labelled(apiserver) == set()


def test_a_replica_that_lost_the_lease_labels_nothing_and_sweeps_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The guard is asked before each write: a former leader must not take the label off its successor's pod."""
    apiserver.seed(controller_pod("ctrl-a"), controller_pod("ctrl-b", leader_of=LEASE))
    with pytest.raises(WriteNotAllowed):
        adapter(api_client, "ctrl-a").mark_leader(lambda: False)
    assert pod_writes(apiserver) == 0
    # the Lease lost between its own label and the sweep: the successor's label stays
    answers = iter([True, False])
    with pytest.raises(WriteNotAllowed):
        adapter(api_client, "ctrl-a").mark_leader(lambda: next(answers))
    assert labelled(apiserver) == {"ctrl-a", "ctrl-b"}
    # the unlabel of its own pod needs no guard: it touches no other replica's pod
    adapter(api_client, "ctrl-a").unmark()
    assert labelled(apiserver) == {"ctrl-b"}


def test_a_pod_that_is_gone_needs_no_unlabel(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    adapter(api_client, "never-there").unmark()  # 404: no pod, no label
    with pytest.raises(Exception, match="404"):
        adapter(api_client, "never-there").mark_leader(lambda: True)  # POD_NAME wrong: an error, not a success


# ---- the runtime -----------------------------------------------------------------------------------------------------


class Replica:
    """A controller replica whose ticks and Lease attempts the test drives: its own pod, a shared Lease."""

    def __init__(
        self,
        store: InMemoryLeaseStore,
        api_client: client.ApiClient,
        pod: str,
        timings: ElectionTimings = TIMINGS,
        snapshots: object = None,
    ) -> None:
        self.cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
        metrics = FakeMetrics(self.cluster)
        metrics.util["ml/chat"] = 140.0
        self.telemetry = Telemetry(identity=pod)
        self.controller = Controller(
            metrics=metrics,
            cluster=self.cluster,
            writer=self.cluster,
            policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
            status_writer=FakeStatus(),
            telemetry=self.telemetry,
        )
        ref: list[Runtime] = []
        self.elector = LeaderElector(
            store,
            pod,
            timings,
            on_started_leading=lambda: ref[0].on_started_leading(),
            on_stopped_leading=lambda: ref[0].on_stopped_leading(),
        )
        self.runtime = Runtime(
            self.controller,
            self.telemetry,
            tick_interval_s=15,
            elector=self.elector,
            http=None,
            leader_label=adapter(api_client, pod),
            extender_snapshots=snapshots,  # type: ignore[arg-type]
        )
        ref.append(self.runtime)

    def label_errors(self) -> float:
        errors = self.telemetry.registry.get_sample_value
        return errors("gpu_autoscaler_errors_total", {"component": "leader_election"}) or 0.0


def test_leadership_moves_the_label(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(controller_pod("ctrl-a"), controller_pod("ctrl-b"), controller_pod("ctrl-old", leader_of=LEASE))
    store = InMemoryLeaseStore()
    a, b = Replica(store, api_client, "ctrl-a"), Replica(store, api_client, "ctrl-b")
    assert a.elector.try_acquire_or_renew() and not b.elector.try_acquire_or_renew()
    a.runtime.tick()
    b.runtime.tick()
    assert labelled(apiserver) == {"ctrl-a"}  # the leader's, and the crashed leader's taken off
    assert a.cluster.writes, "the leader acted in the same tick"

    # a loses the Lease (here: releases it), b takes it; whichever tick comes first, only b's pod keeps the label
    a.elector.release()
    assert b.elector.try_acquire_or_renew()
    b.runtime.tick()
    assert labelled(apiserver) == {"ctrl-b"}  # b swept a's label
    a.runtime.tick()  # a standby's tick: its own label off (already off: a merge patch that changes nothing)
    assert labelled(apiserver) == {"ctrl-b"}

    # SIGTERM of the leader: stop() takes its label off after releasing the Lease
    b.runtime.stop()
    assert labelled(apiserver) == set()
    assert a.elector.try_acquire_or_renew()
    a.runtime.tick()
    assert labelled(apiserver) == {"ctrl-a"}
    assert a.label_errors() == b.label_errors() == 0


def test_a_former_leader_that_leads_again_labels_its_pod_again(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Its label was taken off by the replica that led in between, while this one never ticked as a standby: what it
    wrote before says nothing about now."""
    apiserver.seed(controller_pod("ctrl-a"), controller_pod("ctrl-b"))
    store = InMemoryLeaseStore()
    a, b = Replica(store, api_client, "ctrl-a"), Replica(store, api_client, "ctrl-b")
    assert a.elector.try_acquire_or_renew()
    a.runtime.tick()
    a.elector.release()
    assert b.elector.try_acquire_or_renew()
    b.runtime.tick()
    b.elector.release()
    assert a.elector.try_acquire_or_renew()
    a.runtime.tick()
    assert labelled(apiserver) == {"ctrl-a"}


class HungSnapshots:
    """The scheduler extender's snapshot source, hanging in its read until released (a large cluster, a slow API)."""

    def __init__(self) -> None:
        self.reading, self.release = threading.Event(), threading.Event()

    def snapshot(self, now: float) -> None:
        self.reading.set()
        self.release.wait(30)  # released by the test; the bound only keeps a failed test from hanging


def test_a_new_leader_labels_its_pod_while_its_standby_tick_still_reads(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The tick brought forward at the takeover waits for the running standby tick (its snapshot read for the
    extender), and apscheduler then skips it to the next interval: the label must not wait for it, or the
    leader-only Service has no endpoint for up to a tick interval."""
    apiserver.seed(controller_pod("ctrl-a"), controller_pod("ctrl-b"))
    store = InMemoryLeaseStore()
    a = Replica(store, api_client, "ctrl-a")
    assert a.elector.try_acquire_or_renew()
    a.runtime.tick()
    fast = ElectionTimings(lease_duration_s=5.0, renew_deadline_s=3.0, retry_period_s=0.05)
    hung = HungSnapshots()
    b = Replica(store, api_client, "ctrl-b", timings=fast, snapshots=hung)
    b.runtime.start()
    try:
        assert hung.reading.wait(10), "b's standby tick reads the snapshot"
        a.elector.release()
        deadline = time.monotonic() + 10
        while labelled(apiserver) != {"ctrl-b"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert labelled(apiserver) == {"ctrl-b"}, "labelled while the standby tick still reads"
        assert not hung.release.is_set()
    finally:
        hung.release.set()
        b.runtime.stop()
    assert labelled(apiserver) == set()


def test_the_label_is_written_once_not_every_tick(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(controller_pod("ctrl-a"), controller_pod("ctrl-b"))
    store = InMemoryLeaseStore()
    a, b = Replica(store, api_client, "ctrl-a"), Replica(store, api_client, "ctrl-b")
    assert a.elector.try_acquire_or_renew() and not b.elector.try_acquire_or_renew()
    a.runtime.tick()
    b.runtime.tick()
    apiserver.clear_requests()
    for _ in range(5):
        a.runtime.tick()
        b.runtime.tick()
    assert apiserver.requests == []


def test_a_failed_label_write_is_counted_retried_and_does_not_stop_the_tick(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    store = InMemoryLeaseStore()
    a = Replica(store, api_client, "ctrl-a")  # its pod not there yet: the PATCH answers 404
    assert a.elector.try_acquire_or_renew()
    a.runtime.tick()
    assert a.label_errors() == 1
    assert a.controller.last_report is not None and a.controller.last_report.result == "ok"
    assert a.cluster.writes, "the tick acted all the same"
    a.runtime.tick()
    assert a.label_errors() == 2  # tried again at the next tick
    apiserver.seed(controller_pod("ctrl-a"))
    a.runtime.tick()
    assert labelled(apiserver) == {"ctrl-a"} and a.label_errors() == 2


def test_a_failed_unlabel_is_retried_by_the_standby_ticks(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(controller_pod("ctrl-a"))
    store = InMemoryLeaseStore()
    a = Replica(store, api_client, "ctrl-a")
    assert a.elector.try_acquire_or_renew()
    a.runtime.tick()
    a.elector.release()
    broken = a.runtime._leader_label
    assert broken is not None
    unmark: Callable[[], None] = broken.unmark

    def refused() -> None:
        raise OSError("connection refused")

    broken.unmark = refused  # type: ignore[method-assign]
    a.runtime.tick()
    assert a.label_errors() == 1 and labelled(apiserver) == {"ctrl-a"}
    broken.unmark = unmark  # type: ignore[method-assign]
    a.runtime.tick()
    assert labelled(apiserver) == set()


# ---- wiring and settings ---------------------------------------------------------------------------------------------


def build(settings: Settings, api_client: client.ApiClient, http: bool = True) -> Runtime:
    from autoscaler.app import Adapters, build_runtime
    from autoscaler.fakes.cluster import FakeCluster as SimCluster
    from autoscaler.fakes.metrics import FakeMetricsSource

    fake = SimCluster()
    adapters = Adapters(metrics=FakeMetricsSource(), cluster=fake, writer=fake, policies=FakePolicies([]),
                        status_writer=None, node_pools=None, api_client=api_client)  # fmt: skip
    return build_runtime(settings, adapters, refit=lambda now: None, http=http)


def test_off_by_default_and_then_nothing_is_written(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "ctrl-a")
    apiserver.seed(controller_pod("ctrl-a"))
    settings = Settings(leader_election={"enabled": False}, http={"port": 0})
    assert settings.leader_election.label_leader_pod is False
    runtime = build(settings, api_client)
    assert runtime._leader_label is None
    runtime.tick()
    runtime.stop()
    assert pod_writes(apiserver) == 0 and apiserver.request_count(path="/pods") == 0


def test_on_it_labels_the_pod_the_downward_api_names(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "ctrl-a")
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    apiserver.seed(controller_pod("ctrl-a"))
    settings = Settings(
        leader_election={"enabled": False, "label_leader_pod": True},
        http={"port": 0},
        kubernetes={"request_timeout_seconds": 3},
    )
    runtime = build(settings, api_client)
    label = runtime._leader_label
    assert isinstance(label, KubernetesLeaderPodLabel)
    assert (label.namespace, label.pod_name, label.value, label._timeout) == (NAMESPACE, "ctrl-a", LEASE, 3)
    runtime.tick()  # without leader election the one replica always leads
    assert labelled(apiserver) == {"ctrl-a"}
    runtime.stop()
    assert labelled(apiserver) == set()
    # a dry-run install elects on its own Lease: its leader's label names that one
    dry = build(Settings(leader_election={"label_leader_pod": True}, http={"port": 0}, dry_run=True), api_client)
    assert isinstance(dry._leader_label, KubernetesLeaderPodLabel) and dry._leader_label.value == f"{LEASE}-dry-run"
    # `run --once` serves nothing: no label pointing a Service at it
    assert build(settings, api_client, http=False)._leader_label is None


def test_on_without_pod_name_refuses_to_start(api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    settings = Settings(leader_election={"identity": "a", "label_leader_pod": True}, http={"port": 0})
    with pytest.raises(ValueError, match="POD_NAME is not set"):
        build(settings, api_client)


def test_the_lease_name_must_fit_a_label_value(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD", "true")
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__LEASE_NAME", "a" * 60)
    assert load_settings().leader_election.label_leader_pod is True
    monkeypatch.setenv("AUTOSCALER_DRY_RUN", "true")  # 60 + "-dry-run" > 63
    with pytest.raises(SettingsError, match="AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD"):
        load_settings()
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD", "false")
    assert load_settings().dry_run is True
