"""KubeClusterReader against the fake API server through the official client."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeApiError, KubeClusterReader, KubeUnavailable, ReaderConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.reader import parse_gang, pod_gpus
from autoscaler.ports import PortError
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def reader(api: client.ApiClient, **kw: object) -> KubeClusterReader:
    # No real sleeping between retries in tests
    return KubeClusterReader(api, ReaderConfig(**kw), sleep=lambda s: None)  # type: ignore[arg-type]


def test_snapshot_reads_everything_paginated(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        [o.node(f"gpu-{i}", pool="burst" if i >= 15 else "base") for i in range(20)],
        [o.node(f"cpu-{i}", 0, product=None) for i in range(5)],
        [o.deployment_pod("chat", i, "ml", node_name=f"gpu-{i % 20}") for i in range(40)],
        [o.pod(f"web-{i}", "web", gpus=0) for i in range(7)],  # no GPU: not the autoscaler's business
        o.pod("done", "ml", phase="Succeeded"),  # finished: holds no GPU
        o.deployment("chat", "ml", replicas=40),
        o.pdb("chat", "ml", selector={"app": "chat"}, disruptions_allowed=2, current=40),
        o.priority_class("inference", 1000),
    )
    r = reader(api_client, page_size=7)
    snap = r.snapshot(NOW)
    assert snap.time == NOW
    assert len(snap.pods) == 40 and {p.namespace for p in snap.pods} == {"ml"}
    assert len(snap.nodes) == 20 and all(n.ready and n.allocatable_gpus == 8 for n in snap.nodes)
    assert {n.pool for n in snap.nodes} == {"base", "burst"}
    assert snap.deployments[0].spec_replicas == 40 and snap.deployments[0].selector == {"app": "chat"}
    assert snap.pdbs[0].disruptions_allowed == 2 and snap.pdbs[0].selector == {"app": "chat"}
    assert snap.priority_classes == {"inference": 1000}
    # pods: 47 non-finished pods in pages of 7 = 7 calls; nodes 25 -> 4; deployments, pdbs, priority classes, HPAs:
    # 1 each
    assert r.last_stats.api_calls == 7 + 4 + 4
    assert apiserver.request_count("GET", r"^/api/v1/pods$") == 7
    pod_lists = [req for req in apiserver.requests if req.path == "/api/v1/pods"]
    assert all(req.query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed" for req in pod_lists)
    assert all(req.query["limit"] == "7" for req in pod_lists)


def test_pod_fields(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.priority_class("training", 100),
        o.priority_class("default-prio", 7, global_default=True),
        o.deployment_pod("chat", 1, "ml", priority=2000, node_name="gpu-1"),
        o.pod(
            "t0",
            "ml",
            gpus=4,
            priority_class="training",
            owner=("Job", "train"),
            annotations={"gpuautoscaler.dev/last-checkpoint": "2026-01-01T00:10:00Z"},
        ),
        o.pod("p0", "ml", phase="Pending", node_name=None, ready=False),
        o.pod("i0", "ml", gpus=1, init_gpus=2),
    )
    pods = {p.name: p for p in reader(api_client).snapshot(NOW).pods}
    chat = pods["chat-7d9f8b6c5-00001"]
    assert (chat.owner_kind, chat.owner_name, chat.priority, chat.node) == ("Deployment", "chat", 2000, "gpu-1")
    assert chat.created_at == 1767225600.0 and chat.ready_at == 1767225690.0  # cold start 90 s
    t0 = pods["t0"]
    assert (t0.gpus, t0.priority, t0.owner_kind, t0.owner_name) == (4, 100, "Job", "train")
    assert t0.last_checkpoint_at == 1767226200.0
    assert pods["p0"].priority == 7 and pods["p0"].node is None and not pods["p0"].ready
    assert pods["p0"].phase == "Pending" and pods["p0"].ready_at is None
    assert pods["i0"].gpus == 2  # an init container needing more GPUs than the app sets the request


def test_gang_membership_from_every_source(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.podgroup_crd(),
        o.podgroup("vc-train-uid1", "ml", min_member=3),
        o.pod(
            "v0",
            "ml",
            annotations={"scheduling.k8s.io/group-name": "vc-train-uid1"},
            labels={"volcano.sh/job-name": "vc-train"},
        ),
        o.pod("k0", "ml", annotations={"kueue.x-k8s.io/workload": "job-train-ab12"}),
        o.pod(
            "kg0",
            "ml",
            labels={"kueue.x-k8s.io/pod-group-name": "grp"},
            annotations={"kueue.x-k8s.io/pod-group-total-count": "4"},
        ),
        o.pod("j0", "ml", labels={"jobset.sigs.k8s.io/jobset-name": "llama"}),
        o.pod(
            "f0",
            "ml",
            labels={"training.kubeflow.org/job-name": "bert"},
            annotations={"gpuautoscaler.dev/gang-min-available": "2"},
        ),
        o.pod("l0", "ml", labels={"team/gang": "exp7"}),
        o.pod("solo", "ml"),
    )
    pods = {p.name: p for p in reader(api_client, gang_label="team/gang").snapshot(NOW).pods}
    gangs = {name: (p.gang, p.gang_min_available) for name, p in pods.items()}
    assert gangs == {
        "v0": ("volcano/ml/vc-train-uid1", 3),  # minMember from the PodGroup
        "k0": ("kueue/ml/job-train-ab12", None),
        "kg0": ("kueue/ml/grp", 4),
        "j0": ("jobset/ml/llama", None),
        "f0": ("kubeflow/ml/bert", 2),
        "l0": ("label/ml/exp7", None),
        "solo": (None, None),
    }
    assert parse_gang("jobset/ml/llama") == ("jobset", "ml", "llama")


def test_podgroups_not_installed_is_not_an_error(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.pod("v0", "ml", annotations={"scheduling.k8s.io/group-name": "pg"}))
    snap = reader(api_client).snapshot(NOW)
    assert snap.pods[0].gang == "volcano/ml/pg" and snap.pods[0].gang_min_available is None


def test_node_readiness_rules(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    booting = o.node("booting", 0, pool="burst")
    booting["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # device plugin not up yet
    plugin_missing = o.node("no-plugin", 0, product=None, pool="burst")
    apiserver.seed(
        o.node("ok"),
        booting,
        plugin_missing,
        o.node("notready", ready=False),
        o.node("cordoned", unschedulable=True),
        o.node("cpu", 0, product=None),
    )
    nodes = {n.name: n for n in reader(api_client, gpu_pools=frozenset({"burst"})).snapshot(NOW).nodes}
    assert {name: n.ready for name, n in nodes.items()} == {
        "ok": True,
        "booting": False,  # Ready, but no allocatable GPU yet: not ready (Cluster Autoscaler's rule)
        "no-plugin": False,  # in a GPU pool, nothing reported yet
        "notready": False,
        "cordoned": False,
    }
    assert nodes["ok"].gpu_product == o.A100 and nodes["booting"].pool == "burst"


def test_expired_continue_token_restarts_the_list(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed([o.pod(f"p{i:02d}") for i in range(10)])
    apiserver.inject("GET", r"/api/v1/pods\?.*continue=", 410, times=1, reason="Expired")
    snap = reader(api_client, page_size=3).snapshot(NOW)
    assert len(snap.pods) == 10 and len({p.name for p in snap.pods}) == 10  # no duplicates from the restart


def test_transient_errors_are_retried_persistent_ones_raise(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed([o.pod(f"p{i}") for i in range(4)])
    apiserver.inject("GET", r"/api/v1/pods", 500, times=2)  # 2 failures, then fine: within 2 retries
    assert len(reader(api_client).snapshot(NOW).pods) == 4
    apiserver.inject("GET", r"/api/v1/pods", 429, times=1, retry_after=1)
    assert len(reader(api_client).snapshot(NOW).pods) == 4
    apiserver.clear_requests()
    apiserver.inject("GET", r"/api/v1/nodes", 500, times=None)
    with pytest.raises(KubeApiError) as exc:
        reader(api_client).snapshot(NOW)
    assert exc.value.status == 500 and isinstance(exc.value, PortError)
    assert apiserver.request_count("GET", r"/api/v1/nodes") == 3  # 1 + 2 retries, then give up
    apiserver.clear_faults()
    apiserver.inject("GET", r"/api/v1/pods", 403, times=1)
    with pytest.raises(KubeApiError):  # 403 is not transient: no retry
        reader(api_client).snapshot(NOW)


def test_a_failure_mid_pagination_never_yields_a_partial_snapshot(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed([o.pod(f"p{i:02d}") for i in range(10)])
    apiserver.inject("GET", r"/api/v1/pods\?.*continue=", 500, times=None)
    with pytest.raises(PortError):
        reader(api_client, page_size=3).snapshot(NOW)


def test_timeouts_are_bounded(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.slow("GET", r"/api/v1/nodes", 1.0)
    started = time.monotonic()
    with pytest.raises(KubeUnavailable):
        reader(api_client, request_timeout_s=0.2, read_retries=1).snapshot(NOW)
    # two attempts of 0.2 s, not urllib3's default of four
    assert time.monotonic() - started < 0.9


def test_connection_refused_is_a_port_error(tmp_path: object) -> None:
    server = FakeApiServer().start()
    kc = server.write_kubeconfig(f"{tmp_path}/kc.yaml")
    server.stop()
    api = load_api_client("kubeconfig", kc)
    with pytest.raises(KubeUnavailable):
        reader(api, read_retries=0).snapshot(NOW)


def test_pod_gpus_effective_request() -> None:
    def c(n: int, **kw: object) -> dict:
        return {"name": "x", "resources": {"limits": {"nvidia.com/gpu": str(n)}}, **kw}

    assert pod_gpus({"containers": [c(1), c(2)]}, "nvidia.com/gpu") == 3
    assert pod_gpus({"containers": [c(1)], "initContainers": [c(4)]}, "nvidia.com/gpu") == 4
    assert pod_gpus({"containers": [c(1)], "initContainers": [c(1, restartPolicy="Always")]}, "nvidia.com/gpu") == 2
    assert pod_gpus({"containers": [{"name": "x"}]}, "nvidia.com/gpu") == 0


def hpa(name: str, namespace: str, target: str, *, desired: int | None = None, kind: str = "Deployment") -> dict:
    obj: dict = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target}, "maxReplicas": 10},
    }
    if desired is not None:
        obj["status"] = {"currentReplicas": 3, "desiredReplicas": desired}
    return obj


def test_hpas_are_read_with_their_target_and_recommendation(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    from autoscaler.core.cluster import hpas_targeting

    apiserver.seed(
        hpa("chat", "ml", "chat", desired=5),
        hpa("other", "ml", "embed"),
        hpa("sts", "ml", "chat", kind="StatefulSet"),
        hpa("chat", "web", "chat"),
    )
    snap = reader(api_client).snapshot(NOW)
    assert len(snap.hpas) == 4
    (found,) = hpas_targeting(snap, "ml", "chat")
    assert (found.name, found.min_replicas, found.max_replicas) == ("chat", 1, 10)
    assert (found.current_replicas, found.desired_replicas) == (3, 5)
    assert hpas_targeting(snap, "ml", "absent") == ()


def test_hpas_forbidden_is_not_an_error(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.inject("GET", r"horizontalpodautoscalers", 403, times=None)
    snap = reader(api_client).snapshot(NOW)
    assert snap.hpas == ()
