"""KubeClusterReader against the fake API server through the official client.

The injected faults (410 on a continue token, 500/429/403, a failure mid-pagination, timeouts, forbidden HPAs and
Jobs) run against the real apiserver through the fault proxy: tests/realkube/test_adapter_faults_real.py."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeUnavailable, ReaderConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.reader import parse_gang, pdb_selector, pod_gpus
from autoscaler.core.cluster import WorkloadInfo, cold_starts_by_service
from autoscaler.core.victims import TrainingRules, gangs_from_snapshot, pdbs_covering
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
    # 1 each; workloads: Jobs, and one 404 each for JobSets, PyTorchJobs, TFJobs, Kueue Workloads (not installed)
    assert r.last_stats.api_calls == 7 + 4 + 4 + 5
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


def test_the_cold_start_runs_from_the_bind(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """A replica that waited 5 minutes for a burst node measured 6.5 minutes from its creation: with a handful of
    replicas it was the p95, and the lead added the node boot on top again. Bound at 00:05, ready at 00:06:30: 90 s."""
    apiserver.seed(
        o.deployment_pod("chat", 1, "ml", scheduled_time="2026-01-01T00:05:00Z", ready_time="2026-01-01T00:06:30Z"),
        o.deployment_pod("chat", 2, "ml"),  # no PodScheduled condition: from its creation, as before
    )
    snapshot = reader(api_client).snapshot(NOW)
    waited = next(p for p in snapshot.pods if p.name.endswith("00001"))
    assert waited.scheduled_at == 1767225900.0 and waited.created_at == 1767225600.0
    assert cold_starts_by_service(snapshot) == {"ml/chat": [90.0, 90.0]}


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
        o.pod("cs0", "ml", labels={"scheduling.x-k8s.io/pod-group": "coscheduled"}),
        # no gang key: a controller's pods are one job (taken one by one, evicting some kills the whole run)
        o.pod("rw0", "ml", owner=("RayCluster", "rc")),
        o.pod("rw1", "ml", owner=("RayCluster", "rc")),
        o.pod("sts0", "ml", owner=("StatefulSet", "db")),  # a serving controller's replicas stay apart
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
        "cs0": ("podgroup/ml/coscheduled", None),
        "rw0": ("owner/ml/RayCluster/rc", None),
        "rw1": ("owner/ml/RayCluster/rc", None),
        "sts0": (None, None),
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


# ---- training workloads -------------------------------------------------------------------------------------------

OURS = {
    "gpuautoscaler.dev/suspended-by": "gpu-autoscaler",
    "gpuautoscaler.dev/suspended-at": "2026-01-01T00:10:00Z",
}


def test_job_pods_get_a_job_gang(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.pod("j0", "ml", labels={"batch.kubernetes.io/job-name": "train", "job-name": "train"}),
        o.pod("legacy", "ml", labels={"job-name": "old"}),
        # a JobSet's Job: its pods carry the Job's name too, the JobSet takes precedence
        o.pod(
            "js0", "ml", labels={"batch.kubernetes.io/job-name": "llama-w-0", "jobset.sigs.k8s.io/jobset-name": "llama"}
        ),
        o.pod("kf0", "ml", labels={"job-name": "bert", "training.kubeflow.org/job-name": "bert"}),
        o.pod("lbl", "ml", labels={"job-name": "exp", "team/gang": "exp7"}),  # the Job before the plain label
    )
    pods = {p.name: p.gang for p in reader(api_client, gang_label="team/gang").snapshot(NOW).pods}
    assert pods == {
        "j0": "job/ml/train",
        "legacy": "job/ml/old",
        "js0": "jobset/ml/llama",
        "kf0": "kubeflow/ml/bert",
        "lbl": "job/ml/exp",
    }


def test_a_suspended_job_with_our_annotation(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.priority_class("training", 100),
        o.job(
            "train",
            "ml",
            suspend=True,
            gpus=4,
            parallelism=2,
            product=o.A100,
            priority_class="training",
            annotations={**OURS, "gpuautoscaler.dev/min-runtime-seconds": "1800"},
        ),
        o.job("running", "ml", suspend=False, gpus=1, annotations={"gpuautoscaler.dev/min-runtime-seconds": "soon"}),
        o.job("theirs", "ml", suspend=True, gpus=1),  # suspended by someone else
        queued_job("queued"),  # suspended by Kueue until admitted
        o.job("cpu-only", "ml", parallelism=8),  # asks for no GPU: not the autoscaler's business
        o.job("done", "ml", gpus=1, conditions=[{"type": "Complete", "status": "True"}]),  # finished
        o.job("capped", "ml", gpus=1, parallelism=4, completions=3),
        # a JobSet's child Job: the JobSet is the gang, not this Job
        o.job("llama-w-0", "ml", gpus=1, template_labels={"jobset.sigs.k8s.io/jobset-name": "llama"}),
    )
    r = reader(api_client)
    snap = r.snapshot(NOW)
    workloads = {w.name: w for w in snap.workloads}
    assert set(workloads) == {"train", "running", "theirs", "capped", "queued"}
    train = workloads["train"]
    assert train == WorkloadInfo(
        kind="Job",
        namespace="ml",
        name="train",
        gang="job/ml/train",
        suspended=True,
        priority=100,
        pod_gpus=(4, 4),
        gpu_product=o.A100,
        suspended_by_us_at=1767226200.0,
        min_runtime_s=1800.0,
    )
    running = workloads["running"]
    assert (running.suspended, running.suspended_by_us_at, running.min_runtime_s) == (False, None, None)
    assert running.pod_gpus == (1,) and running.gpu_product is None and running.priority == 0
    assert workloads["theirs"].suspended and workloads["theirs"].suspended_by_us_at is None
    assert not workloads["theirs"].queued and not train.queued and not running.queued
    assert workloads["queued"].suspended and workloads["queued"].queued
    assert workloads["capped"].pod_gpus == (1, 1, 1)
    assert r.last_stats.objects["gpu_workloads"] == 5
    job_lists = [req for req in apiserver.requests if req.path == "/apis/batch/v1/jobs"]
    assert len(job_lists) == 1 and job_lists[0].query["limit"] == "500"  # every namespace, paginated


def queued_job(name: str) -> dict:  # type: ignore[type-arg]
    job = o.job(name, "ml", suspend=True, gpus=8)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    return job


def test_a_stale_mark_is_not_ours(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """Suspended by us at generation 2, then resumed and suspended again by hand (generation 4): not ours to resume."""
    job = o.job(
        "train", "ml", suspend=True, gpus=1, annotations={**OURS, "gpuautoscaler.dev/suspended-generation": "2"}
    )
    job["metadata"]["generation"] = 4
    fresh = o.job(
        "fresh", "ml", suspend=True, gpus=1, annotations={**OURS, "gpuautoscaler.dev/suspended-generation": "2"}
    )
    fresh["metadata"]["generation"] = 2
    apiserver.seed(job, fresh)
    workloads = {w.name: w for w in reader(api_client).snapshot(NOW).workloads}
    assert workloads["train"].suspended and workloads["train"].suspended_by_us_at is None
    assert workloads["fresh"].suspended_by_us_at == 1767226200.0


def test_suspend_then_read_then_resume(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig

    apiserver.seed(o.job("train", "ml", suspend=False, gpus=2, parallelism=2))
    w = KubeClusterWriter(api_client, WriterConfig(reporting_instance="t"), clock=lambda: NOW, sleep=lambda s: None)
    r = reader(api_client)
    (before,) = r.snapshot(NOW).workloads
    assert not before.suspended and before.suspended_by_us_at is None
    w.suspend_workload("Job", "ml", "train")
    (after,) = r.snapshot(NOW).workloads
    assert after.suspended and after.suspended_by_us_at == NOW
    w.resume_workload("Job", "ml", "train")
    (resumed,) = r.snapshot(NOW).workloads
    assert not resumed.suspended and resumed.suspended_by_us_at is None


def test_workload_crds_not_installed_is_not_an_error(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.job("train", "ml", gpus=1))
    r = reader(api_client)
    snap = r.snapshot(NOW)
    assert [(w.kind, w.name) for w in snap.workloads] == [("Job", "train")]
    for path in (
        "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
        "/apis/kubeflow.org/v1/pytorchjobs",
        "/apis/kubeflow.org/v1/tfjobs",
        "/apis/kueue.x-k8s.io/v1beta1/workloads",
    ):
        assert [req.status for req in apiserver.requests if req.path == path] == [404]  # asked once, not retried
    assert r.snapshot(NOW).workloads == snap.workloads  # and the next snapshot asks again (a CRD can be installed)


def test_every_workload_kind(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.jobset_crd(),
        o.kubeflow_crds(),
        o.workload_crd(),
        o.jobset(
            "llama",
            "ml",
            suspend=True,
            replicated_jobs=[
                o.replicated_job("driver", 1, 1, 0),
                o.replicated_job("workers", 2, 2, 8, product=o.A100),
            ],
            annotations=OURS,
        ),
        o.pytorchjob("bert", "ml", workers=3, gpus=2),
        o.workload("pods-group", "ml", pod_sets=[(4, 1)], priority=50, active=False),
        # What Kueue makes for a queued Job: the Workload stands for the Job (Kueue would undo a Job suspension)
        o.job("queued", "ml", gpus=2, parallelism=2),
        o.workload("job-queued-ab12", "ml", pod_sets=[(2, 2)], owner=("Job", "queued")),
        o.workload("cpu", "ml", pod_sets=[(3, 0)]),
    )
    workloads = {w.name: w for w in reader(api_client).snapshot(NOW).workloads}
    assert set(workloads) == {"llama", "bert", "pods-group", "job-queued-ab12"}
    llama = workloads["llama"]
    assert (llama.kind, llama.gang, llama.suspended) == ("JobSet", "jobset/ml/llama", True)
    assert llama.pod_gpus == (8,) * 4 and llama.gpu_product == o.A100 and llama.suspended_by_us_at == 1767226200.0
    bert = workloads["bert"]
    assert (bert.kind, bert.gang, bert.suspended, bert.pod_gpus) == ("PyTorchJob", "kubeflow/ml/bert", False, (2,) * 4)
    group = workloads["pods-group"]
    assert (group.kind, group.gang, group.suspended, group.priority) == ("Workload", "kueue/ml/pods-group", True, 50)
    assert group.pod_gpus == (1, 1, 1, 1) and group.suspended_by_us_at is None
    queued = workloads["job-queued-ab12"]
    assert (queued.kind, queued.gang, queued.pod_gpus) == ("Workload", "job/ml/queued", (2, 2))


def test_read_workloads_off(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.job("train", "ml", gpus=1))
    assert reader(api_client, read_workloads=False).snapshot(NOW).workloads == ()
    assert apiserver.request_count("GET", r"jobs|workloads") == 0


def test_malformed_custom_resources_do_not_break_the_snapshot(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    odd = [
        o.jobset("a", "ml"),
        o.jobset("b", "ml"),
        o.workload("c", "ml"),
        o.pytorchjob("d", "ml"),
    ]
    odd[0]["spec"]["replicatedJobs"] = "not a list"
    odd[1]["spec"]["replicatedJobs"] = [None, {"template": "x"}, {"replicas": "two", "template": {"spec": []}}]
    odd[2]["spec"]["podSets"] = [{"count": 2, "template": {"spec": {"containers": "none"}}}]
    odd[3]["spec"]["pytorchReplicaSpecs"] = {"Master": None, "Worker": ["x"]}
    apiserver.seed(o.jobset_crd(), o.workload_crd(), o.kubeflow_crds(), odd)
    assert reader(api_client).snapshot(NOW).workloads == ()  # none of them asks for a GPU it can be read from


def test_a_deployment_pinned_to_a_gpu_product_says_so() -> None:
    from autoscaler.adapters.kubernetes.reader import KubeClusterReader

    raw = {
        "metadata": {"namespace": "inference", "name": "chat"},
        "spec": {"replicas": 2, "template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "H100-80GB"}}}},
        "status": {"readyReplicas": 2},
    }
    assert KubeClusterReader._deployment(raw).gpu_product == "H100-80GB"
    del raw["spec"]["template"]
    assert KubeClusterReader._deployment(raw).gpu_product is None


def test_a_pod_pinned_to_a_gpu_product_says_so(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    typed = o.pod("typed", "ml", gpus=8, phase="Pending", node_name=None, ready=False)
    typed["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "H100-80GB"}
    apiserver.seed(typed, o.pod("any", "ml", gpus=8, phase="Pending", node_name=None, ready=False))
    pods = {p.name: p for p in reader(api_client).snapshot(NOW).pods}
    assert pods["typed"].gpu_product == "H100-80GB" and pods["any"].gpu_product is None


# ---- PodDisruptionBudget selectors: the whole Kubernetes label selector ------------------------------------------
#
# Pods of namespace ml (and one of another namespace with the same labels); each case one budget whose selector must
# cover exactly the pods Kubernetes' selector does -- as the budget's own ``selects`` says it and as the preemption
# planner counts it (``pdbs_covering``, the existing equality matcher). A selector the API server would have refused
# covers every pod of its namespace (it must block, never be ignored); null covers none, ``{}`` all.

SELECTOR_PODS = {
    "a": {"app": "train", "tier": "gpu"},
    "b": {"app": "train"},
    "c": {"app": "chat", "tier": "cpu"},
    "d": {},
    "e": {"app": "eval", "tier": ""},
}
EVERY_POD = set(SELECTOR_PODS)
NO_SELECTOR = object()  # the budget's spec has no selector at all


def expr(key: str, operator: str, *values: str) -> dict[str, object]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


PDB_SELECTOR_CASES: list[tuple[str, object, set[str]]] = [
    ("matchLabels", {"matchLabels": {"app": "train"}}, {"a", "b"}),
    ("matchLabels, two keys", {"matchLabels": {"app": "train", "tier": "gpu"}}, {"a"}),
    ("matchLabels empty value", {"matchLabels": {"tier": ""}}, {"e"}),
    ("In, one value", {"matchExpressions": [expr("app", "In", "train")]}, {"a", "b"}),
    ("In, several values", {"matchExpressions": [expr("app", "In", "train", "chat")]}, {"a", "b", "c"}),
    ("NotIn", {"matchExpressions": [expr("app", "NotIn", "train")]}, {"c", "d", "e"}),
    ("NotIn, several values", {"matchExpressions": [expr("app", "NotIn", "train", "eval")]}, {"c", "d"}),
    ("Exists", {"matchExpressions": [expr("tier", "Exists")]}, {"a", "c", "e"}),
    ("DoesNotExist", {"matchExpressions": [expr("tier", "DoesNotExist")]}, {"b", "d"}),
    (
        "matchLabels and an expression",
        {"matchLabels": {"app": "train"}, "matchExpressions": [expr("tier", "Exists")]},
        {"a"},
    ),
    (
        "matchLabels and an expression on the same key",
        {"matchLabels": {"app": "train"}, "matchExpressions": [expr("app", "NotIn", "train")]},
        set(),
    ),
    (
        "two expressions on one key",
        {"matchExpressions": [expr("app", "Exists"), expr("app", "NotIn", "chat")]},
        {"a", "b", "e"},
    ),
    (
        "every operator at once",
        {
            "matchExpressions": [
                expr("app", "In", "train", "chat"),
                expr("tier", "Exists"),
                expr("tier", "NotIn", "cpu"),
                expr("gone", "DoesNotExist"),
            ]
        },
        {"a"},
    ),
    ("empty selector: every pod of the namespace", {}, EVERY_POD),
    ("empty lists: every pod of the namespace", {"matchLabels": {}, "matchExpressions": []}, EVERY_POD),
    ("null selector: no pod", NO_SELECTOR, set()),
    ("unknown operator", {"matchExpressions": [expr("app", "Gt", "3")]}, EVERY_POD),
    (
        "unknown operator beside matchLabels",
        {"matchLabels": {"app": "train"}, "matchExpressions": [expr("app", "Like", "t")]},
        EVERY_POD,
    ),
    ("In without values", {"matchExpressions": [expr("app", "In")]}, EVERY_POD),
    ("NotIn without values", {"matchExpressions": [expr("app", "NotIn")]}, EVERY_POD),
    ("Exists with values", {"matchExpressions": [expr("tier", "Exists", "gpu")]}, EVERY_POD),
    ("expression without a key", {"matchExpressions": [{"operator": "Exists"}]}, EVERY_POD),
    ("expression not an object", {"matchExpressions": ["app in (train)"]}, EVERY_POD),
    ("values not a list", {"matchExpressions": [{"key": "app", "operator": "In", "values": "train"}]}, EVERY_POD),
    ("matchLabels value not a string", {"matchLabels": {"app": 7}}, EVERY_POD),
    ("matchExpressions not a list", {"matchExpressions": {"key": "app"}}, EVERY_POD),
    ("selector a string", "app=train", EVERY_POD),
]


@pytest.mark.parametrize(
    ("selector", "expected"), [c[1:] for c in PDB_SELECTOR_CASES], ids=[c[0] for c in PDB_SELECTOR_CASES]
)
def test_pdb_selector_covers_the_pods_kubernetes_does(
    apiserver: FakeApiServer, api_client: client.ApiClient, selector: object, expected: set[str]
) -> None:
    budget = o.pdb("guard", "ml", selector={}, disruptions_allowed=0)
    if selector is NO_SELECTOR:
        del budget["spec"]["selector"]
    else:
        budget["spec"]["selector"] = selector
    apiserver.seed(
        [o.pod(name, "ml", labels=labels) for name, labels in SELECTOR_PODS.items()],
        o.pod("a", "other", labels=SELECTOR_PODS["a"]),  # same labels, another namespace: never covered
        budget,
    )
    snap = reader(api_client).snapshot(NOW)
    (pdb,) = snap.pdbs
    assert {p.name for p in snap.pods if pdb.selects(p)} == expected
    # the planner's count, with its own matcher, is the same
    ml = [p for p in snap.pods if p.namespace == "ml"]
    covering = pdbs_covering(snap, ml)
    assert covering == ((("ml/guard", len(expected), 0),) if expected else ())
    for pod in snap.pods:
        assert bool(pdbs_covering(snap, [pod])) == (pod.namespace == "ml" and pod.name in expected), pod.name


def test_pdb_selector_plain_labels_stay_plain() -> None:
    # matchLabels and a one-value In read as the plain equality map they always were
    assert pdb_selector({"matchLabels": {"app": "chat"}, "matchExpressions": [expr("tier", "In", "gpu")]}) == {
        "app": "chat",
        "tier": "gpu",
    }
    assert pdb_selector(None) == {}


def test_a_budget_with_match_expressions_stops_the_planner_taking_the_gang(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    # A gang of 3 whose budget allows 1 disruption and selects its pods with an Exists expression: the planner must
    # not choose it (taken pod by pod, the Eviction API would stop it part-way). Read with the old reader, the
    # budget had an empty selector and the gang was an eligible victim.
    labels = {"job-name": "train", "training.example/role": "worker"}
    budget = o.pdb("train", "ml", selector={}, disruptions_allowed=1, current=3)
    budget["spec"]["selector"] = {
        "matchExpressions": [expr("training.example/role", "Exists"), expr("job-name", "In", "train", "train-v2")]
    }
    apiserver.seed([o.pod(f"w{i}", "ml", node_name=f"gpu-{i}", labels=labels) for i in range(3)], budget)
    snap = reader(api_client).snapshot(NOW)
    (gang,) = gangs_from_snapshot(snap, NOW, TrainingRules())
    assert gang.gang == "job/ml/train"
    assert gang.pdb_use == (("ml/train", 3, 1),)
    assert gang.why_not == "PodDisruptionBudget ml/train allows 1 of its 3"


def test_a_suspended_workload_says_where_its_gpu_pods_go(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Stop 47: the nodeSelector and CPU and memory of the first pod template that asks for GPUs (a driver without
    GPUs says nothing of where the GPU pods go); a Workload standing for its Job with no podSets of its own takes its
    Job's. Tolerations are not read (admission adds some)."""
    trainer = o.job("trainer", "ml", gpus=8, suspend=True, product=o.A100)
    trainer["spec"]["template"]["spec"]["nodeSelector"]["pool"] = "train"
    trainer["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "12", "memory": "96Gi"}
    driver = o.replicated_job("driver", 1, 1, 0)
    driver["template"]["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "cpu"}
    workers = o.replicated_job("workers", 2, 1, 8)
    workers["template"]["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "train"}
    queued = o.job("queued", "ml", gpus=2, suspend=True)
    queued["spec"]["template"]["spec"]["nodeSelector"] = {"zone": "b"}
    apiserver.seed(
        o.jobset_crd(),
        o.workload_crd(),
        trainer,
        o.jobset("llama", "ml", suspend=True, replicated_jobs=[driver, workers]),
        queued,
        o.workload("job-queued-cd34", "ml", owner=("Job", "queued")),  # no podSets of its own
    )
    workloads = {w.name: w for w in reader(api_client).snapshot(NOW).workloads}
    got = workloads["trainer"]
    assert got.node_selector == {"nvidia.com/gpu.product": o.A100, "pool": "train"}
    assert got.pod_beside == (12_000, 96 * 2**30)
    assert workloads["llama"].node_selector == {"pool": "train"} and workloads["llama"].pod_beside == (0, 0)
    assert workloads["job-queued-cd34"].node_selector == {"zone": "b"}
