"""A workload's GPU pods' labels and own required anti-affinity, read from its pod templates (stop 52).

The capacity arbitration resumes a suspended workload only where its pods may go; since stop 52 that includes their
required pod anti-affinity (``WorkloadInfo.pod_anti_affinity``) against the running pods and against each other, and
the running pods' terms against their labels (``WorkloadInfo.pod_labels``): the template's own labels and those the
workload's controller adds to every pod it creates (the Job's job-name, the JobSet's and Kubeflow's job name and
replica type), which is what a term keeping the workers apart usually selects.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.cluster import PodAntiAffinityTerm
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
HOST = "kubernetes.io/hostname"


def reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def _term(labels: dict[str, str], key: str = HOST) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": key}


def _keep_apart(template: dict[str, Any], *terms: dict[str, Any]) -> None:
    template["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def test_a_jobs_pods_carry_their_templates_labels_the_job_name_and_their_terms(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    job = o.job("train", "ml", gpus=4, parallelism=2, suspend=True, template_labels={"team": "ml"})
    _keep_apart(job["spec"]["template"], _term({"batch.kubernetes.io/job-name": "train"}))
    apiserver.seed(job)
    (got,) = reader(api_client).snapshot(NOW).workloads
    assert got.pod_gpus == (4, 4)
    assert got.pod_labels == {"team": "ml", "batch.kubernetes.io/job-name": "train", "job-name": "train"}
    assert got.pod_anti_affinity == (
        PodAntiAffinityTerm({"batch.kubernetes.io/job-name": "train"}, HOST, frozenset({"ml"})),
    )


def test_templates_that_differ_keep_the_labels_and_terms_they_share(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A PyTorchJob whose master and workers both keep every pod of the job one per node, the workers also away
    from pods labelled "noisy": one set stands for all its pods (looser than any, as its nodeSelector) -- the shared
    term and the job-name label; the replica type, which differs, is not kept."""
    job = o.pytorchjob("llm", "ml", workers=3, gpus=8, suspend=True)
    specs = job["spec"]["pytorchReplicaSpecs"]
    apart = _term({"training.kubeflow.org/job-name": "llm"})
    _keep_apart(specs["Master"]["template"], apart)
    _keep_apart(specs["Worker"]["template"], apart, _term({"noisy": "yes"}))
    apiserver.seed(*o.kubeflow_crds(), job)
    (got,) = reader(api_client).snapshot(NOW).workloads
    assert got.pod_labels == {"training.kubeflow.org/job-name": "llm"}
    assert got.pod_anti_affinity == (
        PodAntiAffinityTerm({"training.kubeflow.org/job-name": "llm"}, HOST, frozenset({"ml"})),
    )


def test_one_kind_of_pods_has_the_replica_type_label(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    job = o.pytorchjob("llm", "ml", workers=3, gpus=8, suspend=True)
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    apiserver.seed(*o.kubeflow_crds(), job)
    (got,) = reader(api_client).snapshot(NOW).workloads
    assert got.pod_labels == {"training.kubeflow.org/job-name": "llm", "training.kubeflow.org/replica-type": "worker"}
    assert got.pod_anti_affinity == ()


def test_a_kueue_workload_standing_for_a_job_takes_the_jobs_pods_labels_and_terms(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Kueue's Workload stands for the Job it queues, whose controller creates the pods from the Job's template."""
    job = o.job("queued", "ml", gpus=2, parallelism=2, suspend=True, template_labels={"team": "ml"})
    _keep_apart(job["spec"]["template"], _term({"team": "ml"}))
    apiserver.seed(
        o.workload_crd(), job, o.workload("job-queued-ab12", "ml", pod_sets=[(2, 2)], owner=("Job", "queued"))
    )
    (got,) = reader(api_client).snapshot(NOW).workloads
    assert (got.kind, got.gang) == ("Workload", "job/ml/queued")
    assert got.pod_labels["team"] == "ml" and got.pod_labels["batch.kubernetes.io/job-name"] == "queued"
    assert got.pod_anti_affinity == (PodAntiAffinityTerm({"team": "ml"}, HOST, frozenset({"ml"})),)
