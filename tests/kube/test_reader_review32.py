"""Review of the Kubernetes read side (reader.py): each test reproduces a defect found in the review.

- A Kueue-managed Job (or JobSet) waiting for admission is suspended by Kueue while its Workload stays active; the
  Workload stands for the Job in the snapshot and was read as running (not suspended, not queued), so the queued
  training vanished from the waiting GPU work.
- Two PriorityClasses with ``globalDefault`` (a race the API server's validation cannot prevent): the Priority
  admission plugin gives pods without a class the lowest of their values; the reader took the first listed.
- A PodDisruptionBudget whose spec changed since the disruption controller last computed its status
  (``status.observedGeneration < metadata.generation``): the Eviction API refuses every eviction it covers, whatever
  ``disruptionsAllowed`` says; the reader reported the stale allowance.
- Pod overhead (``spec.overhead``, set from the RuntimeClass): kube-scheduler adds it to the pod's requests of every
  resource it names; the reader left it out.
- A Job that already completed some of its ``completions`` runs only the rest again when resumed
  (``min(parallelism, completions - succeeded)``); the reader counted every completion's pod.
"""

from __future__ import annotations

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.reader import pod_gpus
from autoscaler.core.cluster import WaitingGpuWork, waiting_gpu_work
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
GPU = "nvidia.com/gpu"


def _reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def _kueue_queued(obj: dict) -> dict:  # type: ignore[type-arg]
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    return obj


def test_a_kueue_job_waiting_for_admission_is_queued_waiting_work(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        o.workload_crd(),
        o.priority_class("training", 100),
        # What Kueue makes of a queued Job: the Job suspended by Kueue's webhook, its Workload active, not admitted
        _kueue_queued(o.job("queued", "ml", suspend=True, gpus=4, parallelism=2, priority_class="training")),
        o.workload("job-queued-ab12", "ml", pod_sets=[(2, 4)], priority=100, owner=("Job", "queued")),
        # admitted: the Job runs, its Workload is active
        _kueue_queued(o.job("admitted", "ml", suspend=False, gpus=2)),
        o.workload("job-admitted-cd34", "ml", pod_sets=[(1, 2)], owner=("Job", "admitted")),
    )
    workloads = {w.name: w for w in _reader(api_client).snapshot(NOW).workloads}
    queued = workloads["job-queued-ab12"]
    assert (queued.kind, queued.gang) == ("Workload", "job/ml/queued")
    assert queued.suspended and queued.queued and queued.suspended_by_us_at is None
    admitted = workloads["job-admitted-cd34"]
    assert not admitted.suspended and not admitted.queued


def test_the_queued_kueue_job_counts_as_waiting_gpu_work(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        o.jobset_crd(),
        o.workload_crd(),
        o.node("gpu-0"),
        _kueue_queued(o.jobset("llama", "ml", suspend=True, replicated_jobs=[o.replicated_job("w", 2, 1, 8)])),
        o.workload("jobset-llama-ef56", "ml", pod_sets=[(2, 8)], priority=5, owner=("JobSet", "llama")),
    )
    snap = _reader(api_client).snapshot(NOW)
    assert waiting_gpu_work(snap) == [WaitingGpuWork(5, 8, None, pods=(8, 8))]  # the whole gang


def test_a_workload_we_deactivated_stays_ours_not_queued(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """What the fix must not change: a Workload this controller deactivated (Kueue then suspends its Job)."""
    ours = o.workload("job-train-aa11", "ml", pod_sets=[(1, 2)], active=False, owner=("Job", "train"))
    ours["metadata"]["annotations"] = {
        "gpuautoscaler.dev/suspended-by": "gpu-autoscaler",
        "gpuautoscaler.dev/suspended-at": "2026-01-01T00:10:00Z",
    }
    apiserver.seed(o.workload_crd(), _kueue_queued(o.job("train", "ml", suspend=True, gpus=2)), ours)
    (w,) = _reader(api_client).snapshot(NOW).workloads
    assert w.suspended and not w.queued and w.suspended_by_us_at == 1767226200.0


def test_two_global_defaults_give_the_lowest_value(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.priority_class("a-high-default", 1000, global_default=True),  # listed first
        o.priority_class("b-low-default", 10, global_default=True),
        o.job("train", "ml", gpus=1),  # no priorityClassName: the admission plugin gives it the lowest default
    )
    (w,) = _reader(api_client).snapshot(NOW).workloads
    assert w.priority == 10


def test_a_budget_the_disruption_controller_has_not_seen_since_its_change_allows_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    stale = o.pdb("stale", "ml", selector={"app": "a"}, disruptions_allowed=3, current=4)
    stale["metadata"]["generation"] = 2  # spec changed; status still of generation 1
    fresh = o.pdb("fresh", "ml", selector={"app": "b"}, disruptions_allowed=3, current=4)
    apiserver.seed(stale, fresh)
    pdbs = {p.name: p.disruptions_allowed for p in _reader(api_client).snapshot(NOW).pdbs}
    assert pdbs == {"stale": 0, "fresh": 3}


def test_pod_overhead_counts_like_the_scheduler() -> None:
    spec = {
        "containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}],
        "initContainers": [{"name": "i", "resources": {"limits": {GPU: "2"}}}],
        "overhead": {"cpu": "250m", GPU: "1"},
    }
    assert pod_gpus(spec, GPU) == 3  # max(1, 2) + overhead 1
    assert pod_gpus({**spec, "overhead": {"cpu": "250m"}}, GPU) == 2  # an overhead of other resources adds none


def test_a_job_with_completions_done_runs_only_the_rest(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    partly = o.job("partly", "ml", suspend=True, gpus=2, parallelism=4, completions=5)
    partly["status"] = {"succeeded": 3}
    fresh = o.job("fresh", "ml", suspend=True, gpus=2, parallelism=4, completions=5)
    no_completions = o.job("workers", "ml", suspend=True, gpus=1, parallelism=3)
    no_completions["status"] = {"succeeded": 2}  # completions unset: parallelism pods, succeeded or not
    apiserver.seed(partly, fresh, no_completions)
    workloads = {w.name: w.pod_gpus for w in _reader(api_client).snapshot(NOW).workloads}
    assert workloads == {"partly": (2, 2), "fresh": (2, 2, 2, 2), "workers": (1, 1, 1)}


def test_a_node_being_deleted_is_no_capacity(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """A Node with a deletionTimestamp (held by a finalizer while its cloud instance goes) is leaving, like a
    cordoned or autoscaler-tainted one: its GPUs are no capacity for a scale-up."""
    going = o.node("going")
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    going["metadata"]["finalizers"] = ["karpenter.sh/termination"]
    apiserver.seed(going, o.node("staying"))
    nodes = {n.name: n.ready for n in _reader(api_client).snapshot(NOW).nodes}
    assert nodes == {"going": False, "staying": True}


def _affinity(*terms: list[str]) -> dict:  # type: ignore[type-arg]
    """A required node affinity: one nodeSelectorTerm per list of allowed GPU products (terms are ORed)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": values},
                        ]
                    }
                    for values in terms
                ]
            }
        }
    }


def test_a_gpu_type_required_by_node_affinity_pins_the_pod(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """kube-scheduler places a pod only where its required node affinity allows; a pod pinned to one GPU type that way
    was read as "any type", so the core counted other types' free GPUs as room for it."""
    pinned = o.pod("pinned", "ml", gpus=2, node_name=None, phase="Pending", ready=False)
    pinned["spec"]["affinity"] = _affinity([o.A100], [o.A100])
    either = o.pod("either", "ml", gpus=2, node_name=None, phase="Pending", ready=False)
    either["spec"]["affinity"] = _affinity([o.A100, "NVIDIA-H100-80GB-HBM3"])  # two types: no single one
    job = o.job("train", "ml", gpus=1)
    job["spec"]["template"]["spec"]["affinity"] = _affinity([o.A100])
    dep = o.deployment("chat", "ml")
    dep["spec"]["template"]["spec"]["affinity"] = _affinity([o.A100])
    apiserver.seed(pinned, either, job, dep)
    snap = _reader(api_client).snapshot(NOW)
    assert {p.name: p.gpu_product for p in snap.pods} == {"pinned": o.A100, "either": None}
    assert [w.gpu_product for w in snap.workloads] == [o.A100]
    assert [d.gpu_product for d in snap.deployments] == [o.A100]
