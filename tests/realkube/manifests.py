"""The objects the real-control-plane tests create, built in one place: GPU pod specs, Deployments and Jobs of them,
and a second kube-scheduler that asks this project's extender; and when a pod they made counts as running.

kwok runs no containers, so images are never pulled; what matters is the GPU limit, the node selector on the GPU
product label, and how fast a deleted pod goes (``terminationGracePeriodSeconds``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.realkube.control_plane import GPU_PRODUCT_LABEL, GPU_RESOURCE, Component, ControlPlane, free_port

A100 = "NVIDIA-A100-SXM4-80GB"
PAUSE = "registry.k8s.io/pause:3.10"


def gpu_pod_spec(
    gpus: int = 1,
    product: str | None = A100,
    *,
    container: str = "main",
    image: str = PAUSE,
    requests: bool = True,
    grace_s: int = 5,
    priority_class: str | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """One container with ``gpus`` GPUs (and small CPU and memory requests unless ``requests`` is False), on nodes
    of ``product`` when given."""
    resources: dict[str, Any] = {"limits": {GPU_RESOURCE: str(gpus)}}
    if requests:
        resources["requests"] = {"cpu": "100m", "memory": "128Mi"}
    spec: dict[str, Any] = {
        "containers": [{"name": container, "image": image, "resources": resources}],
        "terminationGracePeriodSeconds": grace_s,
    }
    if product:
        spec["nodeSelector"] = {GPU_PRODUCT_LABEL: product}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if scheduler:
        spec["schedulerName"] = scheduler
    return spec


def deployment(
    name: str, replicas: int, pod_spec: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods of ``pod_spec``, selected by ``app: name``; ``labels`` also on itself."""
    selector = {"app": name}
    metadata: dict[str, Any] = {"name": name}
    if labels is not None:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": dict(pod_spec)},
        },
    }


def job(
    name: str,
    parallelism: int,
    pod_spec: Mapping[str, Any],
    *,
    indexed: bool = False,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Job of ``parallelism`` pods that must all complete (no retries), labelled ``job: name``."""
    spec: dict[str, Any] = {"parallelism": parallelism, "completions": parallelism}
    if indexed:
        spec["completionMode"] = "Indexed"
    spec["backoffLimit"] = 0
    template_metadata: dict[str, Any] = {"labels": {"job": name}}
    if annotations is not None:
        template_metadata["annotations"] = dict(annotations)
    spec["template"] = {"metadata": template_metadata, "spec": dict(pod_spec, restartPolicy="Never")}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def running_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted."""
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}
    return (
        pod.get("status", {}).get("phase") == "Running"
        and conds.get("Ready") == "True"
        and not pod["metadata"].get("deletionTimestamp")
    )


def start_scheduler(cp: ControlPlane, config: Path, name: str, work_dir: Path) -> Component:
    """A second kube-scheduler (``config``: its KubeSchedulerConfiguration) on a free port, once it answers
    /healthz; the caller stops it."""
    port = free_port()
    scheduler = Component(
        name,
        [
            str(cp.bin_dir / "kube-scheduler"),
            f"--config={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={work_dir / 'certs'}",
            "--v=2",
        ],
        cp.logs / f"{name}.log",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_"))}
    env["HOME"] = str(work_dir)
    scheduler.start(env)
    try:
        cp.wait(
            f"{name} /healthz",
            lambda: cp._http_ok(f"https://127.0.0.1:{port}/healthz", verify=False) or scheduler.dead() is not None,
            timeout_s=60,
        )
        assert scheduler.dead() is None, scheduler.dead()
    except BaseException:
        scheduler.stop()
        raise
    return scheduler
