"""Builders of Kubernetes objects (plain dicts) to seed the fake API server with, shaped like what a real cluster
returns: a GPU node has ``nvidia.com/gpu`` in capacity/allocatable and the GPU Feature Discovery product label, a
Deployment's pods are owned by a ReplicaSet named ``<deployment>-<pod-template-hash>``, and so on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.adapters.kubernetes.crd import generate_crd

JSON = dict[str, Any]
A100 = "NVIDIA-A100-SXM4-80GB"
CREATED = "2026-01-01T00:00:00Z"


def node(
    name: str,
    gpus: int = 8,
    *,
    product: str | None = A100,
    pool: str | None = None,
    pool_label: str = "gpuautoscaler.dev/node-pool",
    ready: bool = True,
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
) -> JSON:
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if product:
        all_labels["nvidia.com/gpu.product"] = product
    if pool:
        all_labels[pool_label] = pool
    resources = {"cpu": "96", "memory": "1Ti", **({"nvidia.com/gpu": str(gpus)} if product or gpus else {})}
    obj: JSON = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "creationTimestamp": CREATED},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
        },
    }
    return obj


def pod(
    name: str,
    namespace: str = "default",
    *,
    gpus: int = 1,
    node_name: str | None = "gpu-0",
    phase: str = "Running",
    ready: bool = True,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    priority: int | None = None,
    priority_class: str | None = None,
    created: str = CREATED,
    ready_time: str = "2026-01-01T00:01:30Z",
    init_gpus: int = 0,
    scheduled_time: str | None = None,
) -> JSON:
    container: JSON = {"name": "main", "image": "registry.example/model-server:1"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}
    spec: JSON = {"containers": [container]}
    if init_gpus:
        spec["initContainers"] = [
            {"name": "warmup", "image": "i", "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}
        ]
    if node_name:
        spec["nodeName"] = node_name
    if priority is not None:
        spec["priority"] = priority
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta: JSON = {"name": name, "namespace": namespace, "labels": dict(labels or {}), "creationTimestamp": created}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}
        ]
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_time}]
    if scheduled_time is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_time})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase, "conditions": conditions if phase != "Pending" else []},
    }


def deployment_pod(deployment_name: str, index: int, namespace: str = "default", **kwargs: Any) -> JSON:
    """A pod of a Deployment, owned by its ReplicaSet ``<deployment>-7d9f8b6c5``."""
    pth = "7d9f8b6c5"
    labels = {"app": deployment_name, "pod-template-hash": pth, **kwargs.pop("labels", {})}
    return pod(
        f"{deployment_name}-{pth}-{index:05d}",
        namespace,
        labels=labels,
        owner=("ReplicaSet", f"{deployment_name}-{pth}"),
        **kwargs,
    )


def deployment(name: str, namespace: str = "default", replicas: int | None = 2, ready: int | None = None) -> JSON:
    spec: JSON = {
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/model-server:1"}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    shown = replicas if ready is None else ready
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}, "creationTimestamp": CREATED},
        "spec": spec,
        "status": {"replicas": replicas or 0, "readyReplicas": shown or 0, "availableReplicas": shown or 0},
    }


def pdb(
    name: str,
    namespace: str = "default",
    *,
    selector: Mapping[str, str],
    min_available: int | str | None = None,
    disruptions_allowed: int | None = None,
    current: int = 0,
) -> JSON:
    spec: JSON = {"selector": {"matchLabels": dict(selector)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    obj: JSON = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": spec,
    }
    if disruptions_allowed is not None:
        obj["status"] = {
            "observedGeneration": 1,
            "disruptionsAllowed": disruptions_allowed,
            "currentHealthy": current,
            "desiredHealthy": max(0, current - disruptions_allowed),
            "expectedPods": current,
        }
    return obj


def priority_class(name: str, value: int, *, global_default: bool = False) -> JSON:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": global_default,
    }


def pod_template(
    gpus: int = 0,
    *,
    product: str | None = None,
    priority_class: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> JSON:
    """A PodTemplateSpec (what Jobs, JobSets, Kubeflow jobs and Kueue Workloads carry)."""
    container: JSON = {"name": "t", "image": "trainer"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: JSON = {"containers": [container], "restartPolicy": "Never"}
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    if priority_class:
        spec["priorityClassName"] = priority_class
    template: JSON = {"spec": spec}
    if labels or annotations:
        template["metadata"] = {}
        if labels:
            template["metadata"]["labels"] = dict(labels)
        if annotations:
            template["metadata"]["annotations"] = dict(annotations)
    return template


def job(
    name: str,
    namespace: str = "default",
    *,
    suspend: bool | None = None,
    gpus: int = 0,
    parallelism: int | None = None,
    completions: int | None = None,
    product: str | None = None,
    priority_class: str | None = None,
    annotations: Mapping[str, str] | None = None,
    template_labels: Mapping[str, str] | None = None,
    conditions: list[JSON] | None = None,
) -> JSON:
    spec: JSON = {
        "template": pod_template(gpus, product=product, priority_class=priority_class, labels=template_labels)
    }
    if suspend is not None:
        spec["suspend"] = suspend
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    meta: JSON = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    obj: JSON = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}
    if conditions:
        obj["status"] = {"conditions": conditions}
    return obj


def simple_crd(
    group: str,
    version: str,
    kind: str,
    plural: str,
    *,
    namespaced: bool = True,
    scale: bool = False,
    status: bool = True,
) -> JSON:
    """A CRD that keeps unknown fields (enough to host third-party kinds: JobSet, PodGroup, MachineDeployment)."""
    subresources: JSON = {}
    if status:
        subresources["status"] = {}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def machine_deployment_crd() -> JSON:
    return simple_crd("cluster.x-k8s.io", "v1beta1", "MachineDeployment", "machinedeployments", scale=True)


def machine_deployment(
    name: str,
    namespace: str = "capi-system",
    replicas: int = 1,
    *,
    min_size: int | None = None,
    max_size: int | None = None,
) -> JSON:
    annotations = {}
    if min_size is not None:
        annotations["cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"] = str(min_size)
    if max_size is not None:
        annotations["cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"] = str(max_size)
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"clusterName": "gpu", "replicas": replicas, "template": {"spec": {"clusterName": "gpu"}}},
        "status": {"replicas": replicas, "selector": f"cluster.x-k8s.io/deployment-name={name}"},
    }


def machine_crd() -> JSON:
    return simple_crd("cluster.x-k8s.io", "v1beta1", "Machine", "machines")


def machine(
    name: str, deployment: str, node: str | None, namespace: str = "capi-system", *, deleting: bool = False
) -> JSON:
    """A Cluster API Machine of MachineDeployment ``deployment`` whose Node is ``node`` (None: not joined yet)."""
    metadata: JSON = {
        "name": name,
        "namespace": namespace,
        "labels": {"cluster.x-k8s.io/deployment-name": deployment, "cluster.x-k8s.io/cluster-name": "gpu"},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["finalizers"] = ["machine.cluster.x-k8s.io"]
    status: JSON = {"phase": "Running" if node else "Provisioning"}
    if node:
        status["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": node}
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": metadata,
        "spec": {"clusterName": "gpu", "bootstrap": {"dataSecretName": f"{name}-bootstrap"}},
        "status": status,
    }


def jobset_crd() -> JSON:
    return simple_crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")


def jobset(
    name: str,
    namespace: str = "default",
    *,
    suspend: bool = False,
    replicated_jobs: list[JSON] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> JSON:
    meta: JSON = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {"suspend": suspend, "replicatedJobs": list(replicated_jobs or [])},
    }


def replicated_job(name: str, replicas: int, parallelism: int, gpus: int, *, product: str | None = None) -> JSON:
    """One entry of a JobSet's ``spec.replicatedJobs``."""
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": parallelism,
                "completions": parallelism,
                "template": pod_template(gpus, product=product),
            }
        },
    }


def kubeflow_crds() -> list[JSON]:
    return [
        simple_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
        simple_crd("kubeflow.org", "v1", "TFJob", "tfjobs"),
    ]


def pytorchjob(
    name: str, namespace: str = "default", *, workers: int = 1, gpus: int = 1, suspend: bool = False
) -> JSON:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runPolicy": {"suspend": suspend},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": pod_template(gpus)},
                "Worker": {"replicas": workers, "template": pod_template(gpus)},
            },
        },
    }


def workload_crd() -> JSON:
    return simple_crd("kueue.x-k8s.io", "v1beta1", "Workload", "workloads")


def workload(
    name: str,
    namespace: str = "default",
    *,
    pod_sets: Sequence[tuple[int, int]] = (),
    priority: int | None = None,
    active: bool = True,
    owner: tuple[str, str] | None = None,
) -> JSON:
    """A Kueue Workload; ``pod_sets``: (count, GPUs per pod) of each podSet."""
    spec: JSON = {
        "active": active,
        "queueName": "gpu",
        "podSets": [
            {"name": f"ps{i}", "count": count, "template": pod_template(gpus)}
            for i, (count, gpus) in enumerate(pod_sets)
        ],
    }
    if priority is not None:
        spec["priority"] = priority
    meta: JSON = {"name": name, "namespace": namespace}
    if owner:
        api = "batch/v1" if owner[0] == "Job" else "jobset.x-k8s.io/v1alpha2"
        meta["ownerReferences"] = [
            {"apiVersion": api, "kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}
        ]
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": meta, "spec": spec}


def podgroup_crd() -> JSON:
    return simple_crd("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups")


def podgroup(name: str, namespace: str = "default", min_member: int = 4) -> JSON:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member},
    }


def policy_crd() -> JSON:
    return generate_crd()


def gpu_policy(name: str, namespace: str = "default", target: str | None = None, **spec: Any) -> JSON:
    body: JSON = {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target or name}, **spec}
    return {
        "apiVersion": "gpuautoscaler.dev/v1alpha1",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": name, "namespace": namespace, "generation": 1, "creationTimestamp": CREATED},
        "spec": body,
    }
