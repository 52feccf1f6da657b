"""The scheduler extender over real HTTP: kube-scheduler's wire format (Go field names, NodeNames or a NodeList),
failing open, 400 for what is not the protocol (never a dead server), metrics, and the controller's wiring."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from runtime_fakes import FakePolicies

from autoscaler.app import Adapters, build_runtime
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo
from autoscaler.core.extender import ExtenderConfig, PlacementView, PodRequest
from autoscaler.extender_http import Extender, ExtenderServer, LatestSnapshot, parse_pod
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.settings import Settings
from autoscaler.telemetry import Telemetry

A100 = "NVIDIA-A100-SXM4-80GB"
L4 = "NVIDIA-L4"
NOW = 1_700_000_000.0


def cluster_snapshot(time_: float = NOW) -> ClusterSnapshot:
    return ClusterSnapshot(
        time_,
        nodes=(
            NodeInfo("a100-0", 8, A100, None, True),
            NodeInfo("a100-1", 8, A100, None, True),
            NodeInfo("l4-0", 4, L4, None, True),
        ),
        pods=(
            PodInfo("ml", "big", "a100-0", 7, 0, "Running", True),
            PodInfo("ml", "half", "a100-1", 4, 0, "Running", True),
        ),
    )


def v1_pod(gpus: Any = 1, product: str | None = None, **spec: Any) -> dict[str, Any]:
    resources = {} if gpus is None else {"limits": {"nvidia.com/gpu": gpus}}
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}], **spec},
    }
    if product is not None:
        body["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return body


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock]]:
    snapshots = LatestSnapshot(FakeCluster())
    snapshots.set(cluster_snapshot())
    telemetry = Telemetry()
    clock = Clock(NOW + 5)
    server = ExtenderServer(
        Extender(snapshots.latest, ExtenderConfig(60), telemetry=telemetry, clock=clock), "127.0.0.1", 0
    )
    server.start()
    try:
        yield server, snapshots, telemetry, clock
    finally:
        server.stop()


def post(port: int, path: str, body: bytes | Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def sample(telemetry: Telemetry, name: str, **labels: str) -> float:
    value = telemetry.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_filter_speaks_the_wire_format(served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock]) -> None:
    server, _, telemetry, _ = served
    args = {"Pod": v1_pod(1, A100), "Nodes": None, "NodeNames": ["a100-0", "l4-0", "a100-1"]}
    status, result = post(server.port, "/scheduler/filter", args)
    assert status == 200
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    # every node passes, l4-0 too: the scheduler's NodeAffinity passed it on its newer cache (core.extender)
    assert result["NodeNames"] == ["a100-0", "l4-0", "a100-1"]
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {} and result["Error"] == ""
    assert sample(telemetry, "gpu_autoscaler_extender_requests_total", verb="filter", result="ok") == 1
    assert sample(telemetry, "gpu_autoscaler_extender_request_duration_seconds_count", verb="filter") == 1


def test_field_names_match_case_insensitively_like_go(
    served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock],
) -> None:
    server, *_ = served
    status, result = post(server.port, "/scheduler/filter", {"pod": v1_pod(8), "nodenames": ["l4-0", "a100-1"]})
    assert status == 200 and result["NodeNames"] == ["l4-0", "a100-1"]
    args = {"pod": v1_pod(8, A100), "nodenames": ["l4-0", "a100-1"]}
    status, hosts = post(server.port, "/scheduler/prioritize", args)
    assert status == 200 and {h["Host"]: h["Score"] for h in hosts} == {"l4-0": 0, "a100-1": 10}


def test_filter_with_a_node_list_answers_a_node_list(
    served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock],
) -> None:
    server, *_ = served
    items = [{"metadata": {"name": n}, "status": {}} for n in ("a100-0", "l4-0")]
    status, result = post(server.port, "/scheduler/filter", {"Pod": v1_pod(1, L4), "Nodes": {"items": items}})
    assert status == 200 and result["NodeNames"] is None
    assert result["Nodes"] == {"items": items}  # every node, as it came


def test_prioritize_prefers_the_less_fragmenting_node(
    served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock],
) -> None:
    server, _, telemetry, _ = served
    status, hosts = post(server.port, "/scheduler/prioritize", {"Pod": v1_pod(1), "NodeNames": ["a100-1", "a100-0"]})
    assert status == 200
    assert [h["Host"] for h in hosts] == ["a100-1", "a100-0"]
    assert set(hosts[0]) == {"Host", "Score"}
    scores = {h["Host"]: h["Score"] for h in hosts}
    assert scores["a100-0"] == 10 and scores["a100-1"] < 10
    assert sample(telemetry, "gpu_autoscaler_extender_requests_total", verb="prioritize", result="ok") == 1


def test_stale_snapshot_fails_open_and_is_counted(
    served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock],
) -> None:
    server, snapshots, telemetry, clock = served
    clock.now = NOW + 61
    _, result = post(server.port, "/scheduler/filter", {"Pod": v1_pod(1, A100), "NodeNames": ["l4-0", "a100-0"]})
    assert result["NodeNames"] == ["l4-0", "a100-0"] and result["FailedAndUnresolvableNodes"] == {}
    _, hosts = post(server.port, "/scheduler/prioritize", {"Pod": v1_pod(1), "NodeNames": ["a100-1", "a100-0"]})
    assert {h["Score"] for h in hosts} == {0}
    for verb in ("filter", "prioritize"):
        assert sample(telemetry, "gpu_autoscaler_extender_requests_total", verb=verb, result="fail_open") == 1
        assert sample(telemetry, "gpu_autoscaler_extender_fail_open_total", verb=verb, reason="stale_snapshot") == 1
    snapshots.set(cluster_snapshot(NOW + 60))  # the next tick's read: advice again
    _, hosts = post(server.port, "/scheduler/prioritize", {"Pod": v1_pod(1), "NodeNames": ["a100-1", "a100-0"]})
    assert {h["Score"] for h in hosts} != {0}


def test_no_snapshot_fails_open(served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock]) -> None:
    server, snapshots, telemetry, _ = served
    snapshots.set(None)
    _, result = post(server.port, "/scheduler/filter", {"Pod": v1_pod(1, A100), "NodeNames": ["l4-0"]})
    assert result["NodeNames"] == ["l4-0"]
    assert sample(telemetry, "gpu_autoscaler_extender_fail_open_total", verb="filter", reason="no_snapshot") == 1


def test_an_unreadable_pod_fails_open(served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock]) -> None:
    server, _, telemetry, _ = served
    pods: list[Any] = [v1_pod("1.5", A100), {"metadata": {}}, None, "pod"]
    for pod in pods:
        status, result = post(server.port, "/scheduler/filter", {"Pod": pod, "NodeNames": ["l4-0"]})
        assert status == 200 and result["NodeNames"] == ["l4-0"] and result["Error"] == ""
    assert sample(telemetry, "gpu_autoscaler_extender_fail_open_total", verb="filter", reason="bad_pod") == 4


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'{"Pod": {}}', b'{"NodeNames": "a100-0"}', b'{"Nodes": {"items": [{}]}}', b""],
)
def test_what_is_not_the_protocol_is_a_400_and_the_server_lives_on(
    served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock], body: bytes
) -> None:
    server, _, telemetry, _ = served
    for verb in ("filter", "prioritize"):
        status, result = post(server.port, f"/scheduler/{verb}", body)
        assert status in (400, 411), (verb, body)
        assert result is None or result["Error"]
    status, _ = post(server.port, "/scheduler/filter", {"Pod": v1_pod(1), "NodeNames": ["l4-0"]})
    assert status == 200
    if body:  # an empty body is refused before it reaches the extender (411, not counted)
        assert sample(telemetry, "gpu_autoscaler_extender_requests_total", verb="filter", result="bad_request") == 1


def test_unknown_paths_are_404(served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock]) -> None:
    server, *_ = served
    assert post(server.port, "/scheduler/bind", {})[0] == 404
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as resp:
        assert resp.status == 200


def test_a_bug_in_the_scorer_is_a_500_for_that_request_only() -> None:
    snapshots = LatestSnapshot(FakeCluster())
    snapshots.set(cluster_snapshot())

    def broken(*_: Any) -> list[int | None]:
        raise RuntimeError("boom")

    telemetry = Telemetry()
    extender = Extender(snapshots.latest, telemetry=telemetry, clock=lambda: NOW, scorer=broken)
    status, body = extender.handle("prioritize", json.dumps({"Pod": v1_pod(1), "NodeNames": ["l4-0"]}).encode())
    assert status == 500 and "boom" in json.loads(body)["Error"]
    status, _ = extender.handle("filter", json.dumps({"Pod": v1_pod(1), "NodeNames": ["l4-0"]}).encode())
    assert status == 200
    assert sample(telemetry, "gpu_autoscaler_extender_requests_total", verb="prioritize", result="error") == 1


def test_the_view_is_built_once_per_snapshot() -> None:
    snapshots = LatestSnapshot(FakeCluster())
    snapshots.set(cluster_snapshot())
    extender = Extender(snapshots.latest, clock=lambda: NOW)
    first = extender.view()
    assert first is extender.view()
    snapshots.set(cluster_snapshot(NOW + 15))
    assert extender.view() is not first


def test_parse_pod() -> None:
    assert parse_pod(v1_pod(2, A100)).gpus == 2
    assert parse_pod(v1_pod(2, A100)).gpu_products == frozenset({A100})
    assert parse_pod(v1_pod(None)).gpus == 0
    req = v1_pod(1)
    req["spec"]["containers"].append({"name": "d", "resources": {"requests": {"nvidia.com/gpu": "3"}}})
    req["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 6}}}]
    req["spec"]["priority"] = 1000
    parsed = parse_pod(req)
    assert parsed.gpus == 6 and parsed.priority == 1000  # max(1 + 3, 6)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100]}]},
                    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [L4]}]},
                ]
            }
        }
    }
    assert parse_pod(v1_pod(1, affinity=affinity)).gpu_products == frozenset({A100, L4})
    assert parse_pod(v1_pod(1, L4, affinity=affinity)).gpu_products == frozenset({L4})
    one_free_term = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    ]}}}  # fmt: skip
    assert parse_pod(v1_pod(1, affinity=one_free_term)).gpu_products is None
    for bad in (v1_pod("1.5"), v1_pod(-1), v1_pod(True), {"spec": None}):
        with pytest.raises(ValueError):
            parse_pod(bad)


def test_the_controller_serves_it_from_the_snapshot_its_tick_reads() -> None:
    """build_runtime wiring: the tick reads the cluster once; requests never read it."""
    nodes = cluster_snapshot().nodes
    fake = FakeCluster(nodes=nodes, pods=cluster_snapshot().pods)
    adapters = Adapters(
        metrics=FakeMetricsSource(),
        cluster=fake,
        writer=fake,
        policies=FakePolicies([]),
        status_writer=None,
        node_pools=None,
    )
    settings = Settings(
        leader_election={"enabled": False},
        http={"bind_address": "127.0.0.1", "port": 0},
        scheduler_extender={"enabled": True, "bind_address": "127.0.0.1", "port": 0, "max_snapshot_age_seconds": 5400},
        tick_interval_seconds=3600,
        tick_stall_seconds=7200,
    )
    runtime = build_runtime(settings, adapters, refit=lambda now: None)
    assert runtime.extender is not None
    args = {"Pod": v1_pod(1), "NodeNames": ["a100-1", "a100-0"]}
    runtime.start()
    try:
        deadline = time.monotonic() + 60  # the first tick (at start): at once, unless the machine is loaded
        while runtime.controller.last_report is None and time.monotonic() < deadline:
            time.sleep(0.02)
        reads = fake.snapshots
        assert reads >= 1
        for _ in range(5):
            status, hosts = post(runtime.extender.port, "/scheduler/prioritize", args)
            assert status == 200
        assert fake.snapshots == reads  # answered from memory
        assert {h["Host"]: h["Score"] for h in hosts} == {"a100-0": 10, "a100-1": 1}
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{runtime.http.port}/metrics", timeout=5).read().decode()  # type: ignore[union-attr]
        assert 'gpu_autoscaler_extender_requests_total{result="ok",verb="prioritize"} 5.0' in metrics
    finally:
        runtime.stop()


def test_the_benchmark_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.bench_extender import main

    assert main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "fgd (view cached)" in out and "fgd (no cache)" in out and "over HTTP" in out


def test_a_standby_replica_reads_its_own_snapshot_for_the_extender() -> None:
    """Both replicas sit behind the Service: the follower, which does not tick, reads the cluster once per tick
    interval so that its extender does not fail open forever."""
    from autoscaler.controller import Controller
    from autoscaler.runtime import Runtime

    class Follower:
        def is_leader(self) -> bool:
            return False

        def may_write(self) -> bool:
            return False

    fake = FakeCluster(nodes=cluster_snapshot().nodes)
    snapshots = LatestSnapshot(fake)
    controller = Controller(
        metrics=FakeMetricsSource(), cluster=snapshots, writer=fake, policies=FakePolicies([]), telemetry=Telemetry()
    )
    runtime = Runtime(
        controller,
        controller.telemetry,
        elector=Follower(),  # type: ignore[arg-type]
        http=None,
        extender_snapshots=snapshots,
    )
    runtime.tick()
    assert controller.last_report is None  # it did not act
    latest = snapshots.latest()
    assert latest is not None and fake.snapshots == 1 and {n.name for n in latest.nodes} == {"a100-0", "a100-1", "l4-0"}
    fake.fail("snapshot", RuntimeError("apiserver down"))
    runtime.tick()  # logged and counted, never raised; the previous snapshot stays until it is too old
    assert snapshots.latest() is latest
    assert (
        controller.telemetry.registry.get_sample_value("gpu_autoscaler_errors_total", {"component": "cluster_read"})
        == 1
    )


@pytest.mark.parametrize("scorer", ["fgd", "fgd-plus"])
def test_the_scorer_setting_picks_the_extenders_ranking(scorer: str) -> None:
    from autoscaler.core.extender import fgd_scores

    fake = FakeCluster()
    adapters = Adapters(metrics=FakeMetricsSource(), cluster=fake, writer=fake, policies=FakePolicies([]),
                        status_writer=None, node_pools=None)
    settings = Settings(leader_election={"enabled": False}, http={"bind_address": "127.0.0.1", "port": 0},
                        scheduler_extender={"enabled": True, "bind_address": "127.0.0.1", "port": 0, "scorer": scorer})
    runtime = build_runtime(settings, adapters, refit=lambda now: None)
    assert runtime.extender is not None
    chosen = runtime.extender.extender._scorer
    assert (chosen is fgd_scores) is (scorer == "fgd")
    # both rank the less fragmenting node first on the same snapshot
    view = PlacementView.of(cluster_snapshot())
    task = PodRequest("inf", "p", 1).task
    names = sorted(view.nodes)
    scores = chosen([view.nodes[n] for n in names], task, view.mix)
    assert any(s is not None for s in scores)


# ---- input-handling defects: a malformed pod fails open, a malformed body is a 400, never a 500 ---------------------


def _pod_with(**spec: Any) -> dict[str, Any]:
    pod = v1_pod(1, A100)
    pod["spec"].update(spec)
    return pod


def _term(term: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


MALFORMED_PODS: dict[str, Any] = {
    "metadata is a list": {**v1_pod(1, A100), "metadata": [1]},
    "a container is a string": _pod_with(containers=["c"]),
    "an init container is a list": _pod_with(initContainers=[[1]]),
    "resources is a list": _pod_with(containers=[{"name": "c", "resources": [1]}]),
    "limits is a string": _pod_with(containers=[{"name": "c", "resources": {"limits": "gpu"}}]),
    "nodeSelector is a list": _pod_with(nodeSelector=[1]),
    "nodeSelector's GPU type is a list": _pod_with(nodeSelector={"nvidia.com/gpu.product": [A100]}),
    "affinity is a list": _pod_with(affinity=[1]),
    "nodeAffinity is a string": _pod_with(affinity={"nodeAffinity": "x"}),
    "a node-selector term is a string": _pod_with(affinity=_term("x")),
    "matchExpressions is an object": _pod_with(affinity=_term({"matchExpressions": {"key": "k"}})),
    "an expression is a number": _pod_with(affinity=_term({"matchExpressions": [5]})),
    "values is a string": _pod_with(
        affinity=_term({"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": A100}]})
    ),
    "containers is an object": _pod_with(containers={"name": "c"}),
}


@pytest.mark.parametrize("label", sorted(MALFORMED_PODS))
def test_a_malformed_pod_fails_open_never_a_500(label: str) -> None:
    """The module doc's promise: an unreadable pod gets every node passing and equal scores (these were 500s with
    "AttributeError: 'list' object has no attribute 'get'")."""
    pod = MALFORMED_PODS[label]
    with pytest.raises(ValueError):
        parse_pod(pod)
    telemetry = Telemetry()
    extender = Extender(lambda: cluster_snapshot(), telemetry=telemetry, clock=lambda: NOW)
    names = ["l4-0", "a100-0", "a100-1"]
    status, body = extender.handle("filter", json.dumps({"Pod": pod, "NodeNames": names}).encode())
    result = json.loads(body)
    assert status == 200, result
    assert result["NodeNames"] == names and result["FailedAndUnresolvableNodes"] == {} and result["Error"] == ""
    status, body = extender.handle("prioritize", json.dumps({"Pod": pod, "NodeNames": names}).encode())
    assert status == 200 and json.loads(body) == [{"Host": n, "Score": 0} for n in names]
    for verb in ("filter", "prioritize"):
        assert sample(telemetry, "gpu_autoscaler_extender_fail_open_total", verb=verb, reason="bad_pod") == 1
        assert sample(telemetry, "gpu_autoscaler_extender_requests_total", verb=verb, result="error") == 0


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"Pod": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b', "NodeNames": ["l4-0"]}',
        b'{"Nodes": {"items": [{"metadata": {"name": "l4-0"}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}}",
    ],
    ids=["top level", "in the pod", "in a node"],
)
def test_deeply_nested_json_is_a_400_not_a_500(body: bytes) -> None:
    extender = Extender(lambda: cluster_snapshot(), clock=lambda: NOW)
    for verb in ("filter", "prioritize"):
        status, answer = extender.handle(verb, body)
        assert status == 400 and "nested too deeply" in json.loads(answer)["Error"]


@pytest.mark.parametrize("name", [5, None, "", ["a100-0"], {"n": 1}, "l4-0", "a100-0"])
def test_a_node_whose_name_cannot_be_read_is_kept_not_dropped(name: Any) -> None:
    """Filter answered "Nodes": {"items": []} for metadata.name 5: the node vanished, in no failed list either."""
    extender = Extender(lambda: cluster_snapshot(), clock=lambda: NOW)
    odd = {"metadata": {"name": name}, "status": {}}
    items = [odd, {"metadata": {"name": "a100-1"}}]
    status, body = extender.handle("filter", json.dumps({"Pod": v1_pod(8), "Nodes": {"items": items}}).encode())
    result = json.loads(body)
    assert status == 200, result
    assert result["Nodes"]["items"] == [odd, items[1]]
    assert result["FailedNodes"] == {}
    status, body = extender.handle("prioritize", json.dumps({"Pod": v1_pod(8), "Nodes": {"items": items}}).encode())
    assert status == 200
    assert all(isinstance(h["Host"], str) and h["Host"] for h in json.loads(body))  # an unnamed node is not scored


def test_a_body_shorter_than_its_content_length_times_out(
    served: tuple[ExtenderServer, LatestSnapshot, Telemetry, Clock],
) -> None:
    """Content-Length: 1000 with a 40-byte body held the connection (and a handler thread) forever."""
    import socket

    _, snapshots, _, clock = served
    server = ExtenderServer(
        Extender(snapshots.latest, ExtenderConfig(60), clock=clock), "127.0.0.1", 0, read_timeout_s=0.5
    )
    server.start()
    try:
        body = json.dumps({"Pod": v1_pod(1), "NodeNames": ["l4-0"]}).encode()[:40]
        head = b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(head + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"the body ended after 40 of 1000 bytes" in answer
        assert 0.4 <= elapsed < 5  # cut off at the read timeout, and the connection closed
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # a stalled request line
            started = time.monotonic()
            sock.sendall(b"POST /scheduler/fil")
            assert sock.recv(65536) == b"" and time.monotonic() - started < 5
        status, _ = post(server.port, "/scheduler/filter", {"Pod": v1_pod(1), "NodeNames": ["l4-0"]})
        assert status == 200  # the server lives on
    finally:
        server.stop()
    with pytest.raises(ValueError):
        ExtenderServer(Extender(snapshots.latest), "127.0.0.1", 0, read_timeout_s=0)
