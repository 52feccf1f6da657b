"""Kubernetes' effective GPU request (resourcehelper.PodRequests, KEP-753): a plain init container runs beside the
sidecars started before it, so its need is its own request plus theirs."""
from autoscaler.adapters.kubernetes.reader import pod_gpus


def c(name: str, n: int, **kw: object) -> dict:
    amount = {"nvidia.com/gpu": str(n)}
    return {"name": name, "resources": {"requests": amount, "limits": amount}, **kw}


def test_init_container_after_a_sidecar_adds_the_sidecar() -> None:
    spec = {
        "initContainers": [c("sidecar", 1, restartPolicy="Always"), c("warmup", 4)],
        "containers": [c("main", 1)],
    }
    # kube-scheduler: max(main 1 + sidecar 1, sidecar 1 + warmup 4) = 5
    assert pod_gpus(spec, "nvidia.com/gpu") == 5


def test_init_container_before_the_sidecar_does_not() -> None:
    spec = {
        "initContainers": [c("warmup", 4), c("sidecar", 1, restartPolicy="Always")],
        "containers": [c("main", 1)],
    }
    assert pod_gpus(spec, "nvidia.com/gpu") == 4  # max(1 + 1, 4): passes today (control)
