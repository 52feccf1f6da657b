"""Review 35 of the kube-scheduler extender (extender_http.py, core/extender.py, their wiring and deploy/).

kube-scheduler runs its own filter plugins (NodeAffinity, NodeResourcesFit with ``ignoredByScheduler: false``) on
its own, newer cache *before* it calls an extender (``findNodesThatFitPod`` -> ``findNodesThatPassExtenders``), and
calls ``prioritize`` only with the nodes that passed. So every node the extender is asked about already matches the
pod's GPU type and has the pod's GPUs free in the scheduler's view. Each test below showed a defect (it failed on the
code of stop 34): the filter's own rules could only turn a fitting node away on the snapshot's older facts, a node
with GPUs freed since the snapshot was ranked last, a former leader (or a stopped server) kept advising on the
scheduler's kept-alive connections, and a request whose body was not read broke the next one on its connection.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from autoscaler.controller import Controller
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo
from autoscaler.core.extender import ExtenderConfig
from autoscaler.extender_http import Extender, ExtenderServer, LatestSnapshot
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.runtime import Runtime
from autoscaler.telemetry import Telemetry

T = 1_700_000_000.0
A100 = "NVIDIA-A100-SXM4-80GB"
L4 = "NVIDIA-L4"


def v1_pod(gpus: int, product: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if product is not None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return {"metadata": {"name": "p", "namespace": "ml"}, "spec": spec}


def answer(extender: Extender, verb: str, pod: dict[str, Any], names: Sequence[str]) -> Any:
    status, body = extender.handle(verb, json.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(names)}).encode())
    assert status == 200
    return json.loads(body)


def extender_on(snapshot: ClusterSnapshot) -> Extender:
    return Extender(lambda: snapshot, ExtenderConfig(60), clock=lambda: snapshot.time + 5)


# ---- 1. filter: its only possible "no" is the stale snapshot overruling the scheduler's newer cache -------------


@pytest.mark.parametrize(
    "case, nodes",
    [
        # one GPU of the 8 was unhealthy when the tick read the cluster; the device plugin reports it back since
        ("a GPU back from unhealthy", (NodeInfo("gpu-0", 7, A100, None, True),)),
        # the node was relabelled since (MIG reconfiguration, a driver upgrade, GFD's product string)
        ("a node relabelled since the read", (NodeInfo("gpu-0", 8, L4, None, True),)),
    ],
)
def test_a_node_the_scheduler_found_feasible_is_not_turned_away_on_the_snapshots_older_facts(
    case: str, nodes: tuple[NodeInfo, ...]
) -> None:
    extender = extender_on(ClusterSnapshot(T, nodes=nodes))
    result = answer(extender, "filter", v1_pod(8, A100), ["gpu-0"])  # the scheduler's only feasible node
    assert result["NodeNames"] == ["gpu-0"], case
    assert result["FailedNodes"] == {}


# ---- 2. prioritize: GPUs freed since the snapshot make the best node the worst ----------------------------------


def _busy_cluster() -> ClusterSnapshot:
    """busy: 8 of 8 GPUs taken when the tick read it (one of its 1-GPU pods has finished since: the scheduler sends
    it as feasible); empty: 0 of 8; full8: one 8-GPU pod (so that the mix has whole-node work)."""
    pods = [PodInfo("ml", f"s{i}", "busy", 1, 0, "Running", True) for i in range(8)]
    pods.append(PodInfo("ml", "big", "full8", 8, 0, "Running", True))
    nodes = (
        NodeInfo("busy", 8, A100, None, True),
        NodeInfo("empty", 8, A100, None, True),
        NodeInfo("full8", 8, A100, None, True),
    )
    return ClusterSnapshot(T, nodes=nodes, pods=tuple(pods))


def test_with_fresh_data_fgd_prefers_filling_the_busy_node() -> None:
    """The reference: the same cluster read after the pod finished (7 of 8 taken) ranks the busy node first."""
    snapshot = _busy_cluster()
    fresh = ClusterSnapshot(T, nodes=snapshot.nodes, pods=snapshot.pods[1:])
    scores = {h["Host"]: h["Score"] for h in answer(extender_on(fresh), "prioritize", v1_pod(1), ["busy", "empty"])}
    assert scores["busy"] > scores["empty"]


def test_a_candidate_whose_gpus_were_freed_since_the_snapshot_is_not_ranked_last() -> None:
    scores = {
        h["Host"]: h["Score"] for h in answer(extender_on(_busy_cluster()), "prioritize", v1_pod(1), ["busy", "empty"])
    }
    assert scores["busy"] >= scores["empty"]


# ---- 3. a kept-alive connection outlives leadership (and ExtenderServer.stop) -----------------------------------


class _Policies:
    def list_policies(self) -> list[Any]:
        return []


class _Elector:
    def __init__(self) -> None:
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def may_write(self) -> bool:
        return self.leading

    def stop(self, release: bool = True) -> None:
        self.leading = False


def _post(conn: http.client.HTTPConnection, path: str, args: Any) -> http.client.HTTPResponse:
    conn.request("POST", path, body=json.dumps(args).encode(), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response


@pytest.fixture
def leader_runtime() -> Iterator[tuple[Runtime, _Elector, ExtenderServer]]:
    fake = FakeCluster(nodes=_busy_cluster().nodes, pods=_busy_cluster().pods)
    snapshots = LatestSnapshot(fake)
    telemetry = Telemetry()
    controller = Controller(
        metrics=FakeMetricsSource(), cluster=snapshots, writer=fake, policies=_Policies(), telemetry=telemetry
    )
    server = ExtenderServer(
        Extender(snapshots.latest, ExtenderConfig(60), snapshot_age=snapshots.age_s), "127.0.0.1", 0
    )
    elector = _Elector()
    runtime = Runtime(
        controller,
        telemetry,
        elector=elector,
        http=None,
        extender=server,
        extender_snapshots=snapshots,  # type: ignore[arg-type]
    )
    snapshots.snapshot(T)
    server.start()
    try:
        yield runtime, elector, server
    finally:
        server.stop()


ARGS = {"Pod": v1_pod(1), "NodeNames": ["busy", "empty"]}


def test_a_replica_that_stops_leading_stops_advising_on_kept_alive_connections(
    leader_runtime: tuple[Runtime, _Elector, ExtenderServer],
) -> None:
    runtime, elector, server = leader_runtime
    runtime.on_started_leading()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        assert _post(conn, "/scheduler/prioritize", ARGS).status == 200
        elector.leading = False
        runtime.on_stopped_leading()
        runtime.tick()  # a standby's tick: unlabels, refreshes its own snapshot
        try:
            again = _post(conn, "/scheduler/prioritize", ARGS)
        except (OSError, http.client.HTTPException):
            return  # closed before the request went out: the scheduler reconnects through the Service
        assert again.status != 200 or (again.getheader("Connection") or "").lower() == "close"
    finally:
        conn.close()


def test_a_stopped_extender_server_answers_nothing_more_on_a_kept_alive_connection(
    leader_runtime: tuple[Runtime, _Elector, ExtenderServer],
) -> None:
    _, _, server = leader_runtime
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        assert _post(conn, "/scheduler/prioritize", ARGS).status == 200
        server.stop()
        outcome: list[object] = []

        def again() -> None:
            try:
                outcome.append(_post(conn, "/scheduler/prioritize", ARGS).status)
            except (OSError, http.client.HTTPException) as exc:
                outcome.append(exc)

        worker = threading.Thread(target=again, daemon=True)
        worker.start()
        worker.join(10)
        assert outcome and outcome[0] != 200
    finally:
        conn.close()


# ---- 4. a request whose body is not consumed desynchronises the kept-alive connection -------------------------


def _raw_exchange(port: int, first: bytes, second: bytes) -> tuple[bytes, bytes]:
    """Send two requests on one connection; return (first response head, what came after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(first)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data, b""
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
            0,
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        rest = rest[length:]
        try:
            sock.sendall(second)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
                if b"\r\n\r\n" in rest and rest.rstrip().endswith((b"}", b"]", b">")):
                    break
        except OSError:
            pass
        return head, rest


def _request(path: str, body: bytes, chunked: bool = False) -> bytes:
    if chunked:
        framing = b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    else:
        framing = f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() + framing


@pytest.mark.parametrize("first", ["unknown path", "chunked body"])
def test_a_request_whose_body_was_not_read_does_not_poison_the_next_one(first: str) -> None:
    server = ExtenderServer(extender_on(_busy_cluster()), "127.0.0.1", 0)
    server.start()
    try:
        body = json.dumps(ARGS).encode()
        opening = (
            _request("/filter", body) if first == "unknown path" else _request("/scheduler/filter", body, chunked=True)
        )
        head, after = _raw_exchange(server.port, opening, _request("/scheduler/filter", body))
        closed = b"connection: close" in head.lower()
        assert closed or after.startswith(b"HTTP/1.1 200"), after[:120]
    finally:
        server.stop()
