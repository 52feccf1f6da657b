"""Review 34, the reader's training workloads (``adapters/kubernetes/reader.py``).

- A Job Kueue manages (it carries ``kueue.x-k8s.io/queue-name``) while Kueue Workloads cannot be read (403 on
  workloads.kueue.x-k8s.io, Jobs readable): suspending it through ``spec.suspend`` is undone by Kueue at once (its
  Workload stays admitted, and Kueue starts an admitted Job it finds suspended), so the preemption frees nothing and
  repeats every tick. It is not offered as suspendable: the arbitration evicts its pods through the Eviction API (the
  documented fallback for a kind whose objects cannot be read; PodDisruptionBudgets hold, Kueue does not undo it).
- A Kueue Workload stands for the Job/JobSet/... that owns it only when the owner reference names that kind in its
  own API group: a Workload owned by another group's ``Job`` (Volcano's batch.volcano.sh Job) of the same name must
  not hide the batch/v1 Job, whose suspension through the Workload would then stop nothing."""

from __future__ import annotations

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes._api import KubeApiError
from tests.kube import objects as o

NOW = 1_800_000_000.0


def kueue_job(name: str, *, suspend: bool = False) -> dict:  # type: ignore[type-arg]
    job = o.job(name, "ml", suspend=suspend, gpus=8)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    return job


class _Reader(KubeClusterReader):
    """The reader with its workload lists answered from memory; ``forbidden``: kinds answered 403."""

    def __init__(self, items: dict[str, list[dict]], forbidden: frozenset[str] = frozenset()) -> None:  # type: ignore[type-arg]
        super().__init__(client.ApiClient(), ReaderConfig(), sleep=lambda s: None)
        self._items = items
        self._forbidden = forbidden

        def pager_items(what: str, fn: object, *args: object, **kw: object) -> list[dict]:  # type: ignore[type-arg]
            plural = "jobs" if "jobs.batch" in what else what.split()[1].split(".")[0]
            kind = {
                "jobs": "Job",
                "jobsets": "JobSet",
                "pytorchjobs": "PyTorchJob",
                "tfjobs": "TFJob",
                "workloads": "Workload",
            }[plural]
            if kind in self._forbidden:
                raise KubeApiError(what, 403, "Forbidden", "")
            if kind not in self._items:
                raise KubeApiError(what, 404, "NotFound", "")
            return self._items[kind]

        self._pager.items = pager_items  # type: ignore[method-assign]

    def workloads(self) -> dict[str, object]:
        raw = self._raw_workloads()
        return {w.name: w for w in self._workloads(raw, {}, 0)}


def test_a_kueue_job_is_not_suspended_through_its_spec_when_workloads_are_forbidden() -> None:
    reader = _Reader({"Job": [kueue_job("train"), o.job("plain", "ml", gpus=8)]}, frozenset({"Workload"}))
    found = reader.workloads()
    # the plain Job is still suspended through its spec; the Kueue one is left to pod-by-pod eviction
    assert set(found) == {"plain"}


def test_a_kueue_job_waiting_in_its_queue_still_counts_as_waiting_work() -> None:
    reader = _Reader({"Job": [kueue_job("queued", suspend=True)]}, frozenset({"Workload"}))
    (queued,) = reader.workloads().values()
    assert queued.suspended and queued.queued and queued.suspended_by_us_at is None  # type: ignore[attr-defined]


def test_without_kueue_installed_a_labelled_job_is_suspended_as_usual() -> None:
    """404 on Workloads: no Kueue to undo anything; the label is inert."""
    reader = _Reader({"Job": [kueue_job("train")]})
    assert set(reader.workloads()) == {"train"}


def test_with_workloads_readable_the_workload_stands_for_the_job() -> None:
    wl = o.workload("job-train-ab12", "ml", pod_sets=[(1, 8)], owner=("Job", "train"))
    reader = _Reader({"Job": [kueue_job("train")], "Workload": [wl]})
    (only,) = reader.workloads().values()
    assert (only.kind, only.gang) == ("Workload", "job/ml/train")  # type: ignore[attr-defined]


def test_a_workload_owned_by_another_groups_job_does_not_hide_the_batch_job() -> None:
    wl = o.workload("vc-train", "ml", pod_sets=[(1, 8)], owner=("Job", "train"))
    wl["metadata"]["ownerReferences"][0]["apiVersion"] = "batch.volcano.sh/v1alpha1"
    reader = _Reader({"Job": [o.job("train", "ml", gpus=8)], "Workload": [wl]})
    found = reader.workloads()
    assert found["train"].kind == "Job" and found["train"].gang == "job/ml/train"  # type: ignore[attr-defined]
    assert found["vc-train"].gang == "kueue/ml/vc-train"  # type: ignore[attr-defined]


# -- where a Deployment's pods may go, and what keeps them off a node ------------------------------------------------

from autoscaler.adapters.kubernetes.reader import node_taints, pod_tolerations  # noqa: E402
from autoscaler.core.cluster import DeploymentInfo, NodeInfo, Taint, Toleration, schedulable_on  # noqa: E402


def test_node_taints_keep_the_scheduling_ones_only() -> None:
    raw = [
        {"key": "dedicated", "value": "training", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"},  # no filter
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},  # a booting node's, goes by itself
        {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"},
        {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"},  # read as leaving
    ]
    assert node_taints(raw, ("ToBeDeletedByClusterAutoscaler",)) == (
        Taint("dedicated", "training", "NoSchedule"),
        Taint("nvidia.com/gpu", None, "NoSchedule"),
    )


def test_gpu_pods_tolerate_the_gpu_resource_taint_as_admission_gives_them() -> None:
    gpu_container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    tolerations = pod_tolerations(
        {"containers": [gpu_container], "tolerations": [{"key": "team", "operator": "Equal", "value": "a"}]}
    )
    node = NodeInfo("n", 8, "A100", None, True, taints=(Taint("nvidia.com/gpu", None, "NoSchedule"),))
    assert schedulable_on(DeploymentInfo("ns", "d", 1, 1, tolerations=tolerations), node)
    dedicated = NodeInfo("n", 8, "A100", None, True, taints=(Taint("dedicated", "training", "NoSchedule"),))
    assert not schedulable_on(DeploymentInfo("ns", "d", 1, 1, tolerations=tolerations), dedicated)
    team = NodeInfo("n", 8, "A100", None, True, taints=(Taint("team", "a", "NoExecute"),))
    assert schedulable_on(DeploymentInfo("ns", "d", 1, 1, tolerations=tolerations), team)
    assert Toleration(None, "Exists").tolerates(Taint("anything", "x", "NoExecute"))
    # ExtendedResourceToleration adds {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}: not NoExecute
    evicting = NodeInfo("n", 8, "A100", None, True, taints=(Taint("nvidia.com/gpu", None, "NoExecute"),))
    assert not schedulable_on(DeploymentInfo("ns", "d", 1, 1, tolerations=tolerations), evicting)
    own = pod_tolerations({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    assert schedulable_on(DeploymentInfo("ns", "d", 1, 1, tolerations=own), evicting)
    assert not Toleration("team", "Equal", "b").tolerates(Taint("team", "a", "NoSchedule"))


def test_the_reader_reads_node_taints_and_the_template_placement() -> None:
    node = o.node("gpu-0")
    node.setdefault("spec", {})["taints"] = [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
    reader = _Reader({})
    info = reader._node(node)
    assert info is not None and info.taints == (Taint("dedicated", "training", "NoSchedule"),)
    dep = o.deployment("chat", "inference", replicas=2)
    template = dep["spec"]["template"]["spec"]
    template["nodeSelector"] = {"zone": "a"}
    template["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    got = KubeClusterReader._deployment(dep)
    assert got.node_selector == {"zone": "a"}
    assert Toleration("dedicated", "Exists", None, "NoSchedule") in got.tolerations
    assert not schedulable_on(got, replace_labels(info, {}))
    assert schedulable_on(got, replace_labels(info, {"zone": "a"}))


def replace_labels(node: NodeInfo, labels: dict[str, str]) -> NodeInfo:
    from dataclasses import replace

    return replace(node, labels=labels)


def test_the_reader_reads_the_gpus_a_replica_requests() -> None:
    dep = o.deployment("chat", "inference", replicas=2)
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    assert KubeClusterReader._deployment(dep).gpus_per_pod == 4
    assert KubeClusterReader._deployment(o.deployment("cpu", "inference")).gpus_per_pod == 0
