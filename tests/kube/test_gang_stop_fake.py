"""The actuator's all-or-nothing gang eviction (issue 12) against the fake API server: the same cases as
tests/realkube/test_gang_stop.py, plus what only a request log shows (every dry run carried ``dryRun: [All]``, no
real eviction was sent once one dry run was refused)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter, WriterConfig
from autoscaler.core.model import EvictPod
from autoscaler.core.reasons import Reason
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.integration

NS = "train"
GANG_LABEL = "training.kubeflow.org/job-name"
NAMES = ["g1-worker-0", "g1-worker-1", "g1-worker-2"]


def seed_gang(server: FakeApiServer, *, disruptions_allowed: int) -> None:
    """Three pods of gang g1 on two nodes, the last one under a PDB allowing ``disruptions_allowed``."""
    server.seed(o.node("gpu-0"), o.node("gpu-1"), o.deployment("chat", NS, replicas=1))
    for i, name in enumerate(NAMES):
        labels = {GANG_LABEL: "g1", **({"guarded": "true"} if i == 2 else {})}
        server.seed(o.pod(name, NS, node_name=f"gpu-{i % 2}", labels=labels))
    server.seed(o.pdb("guard", NS, selector={"guarded": "true"}, disruptions_allowed=disruptions_allowed, current=1))


def gang_of_pods(api: client.ApiClient) -> str:
    pods = [p for p in KubeClusterReader(api, sleep=lambda s: None).snapshot(time.time()).pods if p.namespace == NS]
    gangs = {p.gang for p in pods}
    assert gangs == {f"kubeflow/{NS}/g1"} and len(pods) == 3
    return gangs.pop() or ""


def stop_gang(api: client.ApiClient, gang: str) -> list[tuple[str, str]]:
    actuator = Actuator(KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), sleep=lambda s: None))
    actions = [
        EvictPod(NS, name, Reason.PREEMPT_FOR_INFERENCE, "test", gang=gang, service=f"{NS}/chat") for name in NAMES
    ]
    return [(r.result, r.message) for r in actuator.apply(actions, GuardContext(time.time(), {}))]


def eviction_posts(server: FakeApiServer) -> list[tuple[str, bool]]:
    """(pod, dry run?) of every eviction POST, in order."""
    out = []
    for r in server.requests:
        if r.method == "POST" and r.path.endswith("/eviction"):
            dry = (r.body.get("deleteOptions") or {}).get("dryRun") == ["All"] or "dryRun" in r.query
            out.append((r.path.split("/")[-2], dry))
    return out


def test_a_pdb_on_one_pod_leaves_the_whole_gang_running(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    seed_gang(apiserver, disruptions_allowed=0)
    gang = gang_of_pods(api_client)

    results = stop_gang(api_client, gang)

    assert [r for r, _ in results] == ["blocked"] * 3, results
    assert all(m.startswith(f"gang {gang} left running") and NAMES[2] in m for _, m in results), results
    assert [(n, apiserver.get("v1", "Pod", n, NS) is not None) for n in NAMES] == [(n, True) for n in NAMES]
    # Three dry runs (the refused one last), not a single real eviction.
    assert eviction_posts(apiserver) == [(n, True) for n in NAMES]
    events = apiserver.objects("events.k8s.io/v1", "Event", NS)
    assert not [e for e in events if str(e.get("note", "")).lower().startswith("evict")], events


def test_a_gang_whose_budget_allows_it_is_evicted_whole(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    seed_gang(apiserver, disruptions_allowed=1)
    gang = gang_of_pods(api_client)

    results = stop_gang(api_client, gang)

    assert [r for r, _ in results] == ["applied"] * 3, results
    assert [apiserver.get("v1", "Pod", n, NS) for n in NAMES] == [None] * 3
    assert eviction_posts(apiserver) == [(n, True) for n in NAMES] + [(n, False) for n in NAMES]
    pdb = apiserver.get("policy/v1", "PodDisruptionBudget", "guard", NS)
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0  # spent by the real eviction, not the dry run
    events = apiserver.objects("events.k8s.io/v1", "Event", NS)
    assert sorted(e["regarding"]["name"] for e in events if e["regarding"]["kind"] == "Pod") == NAMES
    on_service = [e for e in events if (e["regarding"]["kind"], e["regarding"]["name"]) == ("Deployment", "chat")]
    assert [e["reason"] for e in on_service] == ["PreemptForInference"]  # once per gang


def test_a_worker_recreated_since_the_read_is_not_evicted_in_its_predecessors_place(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The evictions carry the uids the tick read: a worker with a fixed name recreated in between (the job's
    controller restarted it) is a different pod, and is spared; the rest of the gang is stopped."""
    seed_gang(apiserver, disruptions_allowed=1)
    snapshot = KubeClusterReader(api_client, sleep=lambda s: None).snapshot(time.time())
    read = {p.name: p for p in snapshot.pods if p.namespace == NS}
    apiserver.delete_object("v1", "Pod", NAMES[0], NS)
    apiserver.seed(o.pod(NAMES[0], NS, node_name="gpu-0", labels={GANG_LABEL: "g1"}))
    successor = apiserver.get("v1", "Pod", NAMES[0], NS)["metadata"]["uid"]
    assert read[NAMES[0]].uid and read[NAMES[0]].uid != successor
    actuator = Actuator(KubeClusterWriter(api_client, WriterConfig(reporting_instance="test-0"), sleep=lambda s: None))
    actions = [
        EvictPod(NS, n, Reason.PREEMPT_FOR_INFERENCE, "test", gang=read[n].gang, service=f"{NS}/chat", uid=read[n].uid)
        for n in NAMES
    ]
    results = actuator.apply(actions, GuardContext(time.time(), {}))
    # the one meant is gone: nothing left to do for it, nothing written, and the rest of the gang still goes
    assert [r.result for r in results] == ["gone", "applied", "applied"], results
    events = apiserver.objects("events.k8s.io/v1", "Event", NS)
    assert not [e for e in events if e["regarding"]["name"] == NAMES[0]], events  # no Event names the successor
    assert apiserver.get("v1", "Pod", NAMES[0], NS)["metadata"]["uid"] == successor  # spared
    assert [apiserver.get("v1", "Pod", n, NS) for n in NAMES[1:]] == [None, None]
