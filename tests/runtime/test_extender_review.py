"""Defects a review of the scheduler extender found; each case failed before its fix.

- The snapshot's age was judged on the wall clock: stepped back, it made a snapshot read long ago look fresh.
- A client dripping one byte per read timeout held a handler thread for ever (the timeout bounded each read only).
- A 32 MiB body of node names was accepted (1.5 GiB to answer, above the Deployment's memory limit).
- A leader whose GPUScalingPolicy list failed held its tick before the cluster read, so the extender's snapshot went
  stale although the cluster read fine.
- ``scheduler_extender.max_snapshot_age_seconds`` at or below the tick interval was accepted (the extender then
  failed open for part of every interval).
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from pydantic import ValidationError
from runtime_fakes import FakePolicies

from autoscaler.controller import Controller
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo
from autoscaler.core.extender import ExtenderConfig
from autoscaler.extender_http import MAX_BODY_BYTES, MAX_NODES, Extender, ExtenderServer, LatestSnapshot
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.runtime import Runtime
from autoscaler.settings import Settings
from autoscaler.telemetry import Telemetry

T = 1_700_000_000.0
NODES = (NodeInfo("a100-0", 8, "A100", None, True), NodeInfo("l4-0", 4, "L4", None, True))
POD = {
    "metadata": {"name": "p"},
    "spec": {
        "nodeSelector": {"nvidia.com/gpu.product": "A100"},
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    },
}


def filter_answer(extender: Extender) -> dict[str, object]:
    status, body = extender.handle("filter", json.dumps({"Pod": POD, "NodeNames": ["a100-0", "l4-0"]}).encode())
    assert status == 200
    answer: dict[str, object] = json.loads(body)
    return answer


def prioritize_answer(extender: Extender) -> dict[str, int]:
    status, body = extender.handle("prioritize", json.dumps({"Pod": POD, "NodeNames": ["a100-0", "l4-0"]}).encode())
    assert status == 200
    return {h["Host"]: h["Score"] for h in json.loads(body)}


def test_a_snapshot_read_long_ago_fails_open_whatever_the_wall_clock_did() -> None:
    snapshots = LatestSnapshot(FakeCluster())
    snapshots.set(ClusterSnapshot(T, nodes=NODES))
    # the wall clock stepped back an hour right after the read; 600 s have passed since on the monotonic clock
    wall = T - 3600 + 600
    stepped = Extender(snapshots.latest, ExtenderConfig(60), clock=lambda: wall, snapshot_age=lambda: 600.0)
    assert prioritize_answer(stepped) == {"a100-0": 0, "l4-0": 0}  # failed open: no advice
    fresh = Extender(snapshots.latest, ExtenderConfig(60), clock=lambda: wall, snapshot_age=lambda: 5.0)
    assert prioritize_answer(fresh) == {"a100-0": 10, "l4-0": 0}  # advising: the L4 node is no A100
    assert isinstance(snapshots.age_s(), float) and 0 <= (snapshots.age_s() or 0) < 60


def test_the_filter_never_says_no() -> None:
    """The snapshot is older than the scheduler's cache, whose own filters already passed these nodes: a no of ours
    (l4-0 is no A100 per the snapshot) could only be the snapshot being behind (core.extender)."""
    snapshots = LatestSnapshot(FakeCluster())
    snapshots.set(ClusterSnapshot(T, nodes=NODES))
    answer = filter_answer(Extender(snapshots.latest, ExtenderConfig(60), clock=lambda: T + 1))
    assert answer["NodeNames"] == ["a100-0", "l4-0"]
    assert answer["FailedNodes"] == {} and answer["FailedAndUnresolvableNodes"] == {}


def test_a_dripping_client_is_cut_off_once_the_body_has_had_its_time() -> None:
    server = ExtenderServer(
        Extender(LatestSnapshot(FakeCluster()).latest, ExtenderConfig(60)), "127.0.0.1", 0, read_timeout_s=0.5
    )
    server.start()
    client = socket.create_connection(("127.0.0.1", server.port))
    try:
        client.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        client.settimeout(0.05)
        started, answered = time.monotonic(), b""
        while time.monotonic() - started < 10.0 and not answered:
            try:
                client.sendall(b" ")  # one byte well inside every read timeout
                answered = client.recv(1000)
            except TimeoutError:
                pass
            except OSError:
                answered = b"closed"
            time.sleep(0.2)
        assert answered, "still held after 10 s (20 read timeouts)"
        # cut off at the body's deadline (one read timeout, 0.5 s) plus this loop's 0.25 s and the scheduling of a
        # loaded machine; not held for as long as the client drips
        assert time.monotonic() - started < 4.0
        assert answered == b"closed" or answered.startswith(b"HTTP/1.1 408")
    finally:
        client.close()
        server.stop()


def test_more_node_names_than_any_cluster_has_are_refused() -> None:
    assert MAX_BODY_BYTES <= 8 << 20
    extender = Extender(lambda: ClusterSnapshot(T, nodes=NODES), ExtenderConfig(60), clock=lambda: T)
    names = ["a100-0"] * (MAX_NODES + 1)
    status, body = extender.handle("filter", json.dumps({"Pod": POD, "NodeNames": names}).encode())
    assert status == 400 and "more than" in json.loads(body)["Error"]
    status, _ = extender.handle("filter", json.dumps({"Pod": POD, "NodeNames": names[:MAX_NODES]}).encode())
    assert status == 200


def test_a_leader_whose_policy_read_fails_still_refreshes_the_extenders_snapshot() -> None:
    fake = FakeCluster(nodes=NODES)
    snapshots = LatestSnapshot(fake)
    policies = FakePolicies([])
    policies.fail = RuntimeError("the policy CRD list is forbidden")
    telemetry = Telemetry()
    controller = Controller(
        metrics=FakeMetricsSource(), cluster=snapshots, writer=fake, policies=policies, telemetry=telemetry
    )
    runtime = Runtime(controller, telemetry, elector=None, http=None, extender_snapshots=snapshots)
    runtime.tick()
    assert controller.last_report is not None and controller.last_report.result == "hold"
    assert snapshots.latest() is not None


@pytest.mark.parametrize(("max_age", "ok"), [(15.0, False), (10.0, False), (16.0, True), (60.0, True)])
def test_the_extenders_maximum_age_must_outlive_a_tick(max_age: float, ok: bool) -> None:
    extender = {"enabled": True, "max_snapshot_age_seconds": max_age}
    fields = {"tick_interval_seconds": 15.0, "scheduler_extender": extender}
    if ok:
        Settings(**fields)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValidationError, match="max_snapshot_age_seconds"):
            Settings(**fields)  # type: ignore[arg-type]
