"""Review 47: where a workload's GPU pods go, read from its pod templates, when they do not all say the same."""

from __future__ import annotations

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
GIB = 2**30


def reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def _place(template: dict, selector: dict[str, str], cpu: str, memory: str) -> None:
    spec = template["spec"]
    spec["nodeSelector"] = dict(selector)
    spec["containers"][0].setdefault("resources", {})["requests"] = {"cpu": cpu, "memory": memory}


def test_gpu_templates_that_differ_say_only_what_every_gpu_pod_needs(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A PyTorchJob whose master (8 GPUs) goes to pool "head" and whose 3 workers (8 GPUs each) go to pool "train",
    all in zone a. ``WorkloadInfo`` has one nodeSelector and one CPU and memory for all its pods; the first GPU
    template's (the master's) made every pod need a "head" node and the master's requests: the resume counted only
    the head nodes for the 3 workers too and never resumed a job the scheduler would place. What all its GPU pods
    need is the labels every GPU template asks for alike (zone a) and, per resource, the least any of them requests:
    never stricter than the scheduler is for any of its pods. A template asking no GPUs (the launcher, on pool
    "cpu") says nothing of where the GPU pods go."""
    job = o.pytorchjob("llm", "ml", workers=3, gpus=8, suspend=True)
    specs = job["spec"]["pytorchReplicaSpecs"]
    _place(specs["Master"]["template"], {"pool": "head", "zone": "a"}, "2", "16Gi")
    _place(specs["Worker"]["template"], {"pool": "train", "zone": "a"}, "32", "8Gi")
    specs["Launcher"] = {"replicas": 1, "template": o.pod_template(0)}
    _place(specs["Launcher"]["template"], {"pool": "cpu"}, "1", "1Gi")
    apiserver.seed(*o.kubeflow_crds(), job)
    got = {w.name: w for w in reader(api_client).snapshot(NOW).workloads}["llm"]
    assert got.pod_gpus == (8, 8, 8, 8)
    assert got.node_selector == {"zone": "a"}
    assert got.pod_beside == (2000, 8 * GIB)
