"""A Pending GPU pod that is being deleted (deletionTimestamp set, held by a finalizer such as Kueue's
kueue.x-k8s.io/managed) was read as ordinary waiting work: the core then planned to free GPUs for a pod going away."""
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.cluster import waiting_gpu_work
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def test_a_pending_pod_being_deleted_is_not_waiting_work(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    leaving = o.pod("leaving", "ml", gpus=4, phase="Pending", node_name=None, ready=False)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    leaving["metadata"]["deletionGracePeriodSeconds"] = 0
    leaving["metadata"]["finalizers"] = ["kueue.x-k8s.io/managed"]
    apiserver.seed(o.node("gpu-0"), leaving)
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    # Either drop it or mark it so the core can tell; today it is indistinguishable from a pod waiting for GPUs.
    assert waiting_gpu_work(snap) == []


def test_the_rebalancer_evicts_inference_replicas_for_a_pod_being_deleted(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance

    leaving = o.pod("leaving", "ml", gpus=8, phase="Pending", node_name=None, ready=False)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    leaving["metadata"]["finalizers"] = ["kueue.x-k8s.io/managed"]
    apiserver.seed(
        o.node("gpu-0"),
        o.node("gpu-1"),
        o.deployment("chat", "ml", replicas=2, ready=2),
        [o.deployment_pod("chat", i, "ml", gpus=2, node_name=f"gpu-{i % 2}") for i in range(2)],
        leaving,
    )
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    plan, _ = plan_rebalance(snap, NOW, RebalanceConfig(), RebalanceState(), managed={"ml/chat"})
    assert not plan.moves, plan.moves  # evicting serving replicas to make room for a pod that is going away


def test_a_bound_pod_being_deleted_holds_its_gpus_and_says_it_is_terminating(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    from autoscaler.core.cluster import free_gpus

    going = o.pod("going", "ml", gpus=4, phase="Running", node_name="gpu-0", ready=True)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    apiserver.seed(o.node("gpu-0"), going)
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    (pod,) = snap.pods
    assert pod.terminating and not pod.ready  # leaving: no serving capacity, no victim again
    assert free_gpus(snap) == 8 - 4  # its GPUs are held until its grace period ends
    assert pod.deletion_at == 1767225900.0  # 2026-01-01T00:05:00Z: when its grace period ends (review 43)
