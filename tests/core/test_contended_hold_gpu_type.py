"""The contended hold counts only the GPUs the service's replicas could come back to, and a gang too few of whose
pods exist to reach its minAvailable as unable to start.

The contended hold (``core.tick.read_forecasts``) keeps a forecasting service from a scale-down that opens a hole for
waiting lower-priority GPU work when the replicas its forecast wants back within the window would then find too few
free GPUs: the work started in the hole would be preempted at the next rise. Two defects:

1. The room the replicas come back to was the free GPUs of every ready node, of every GPU type
   (``sum(room.free.values())``), and the GPUs higher-priority floors take were counted against it whatever their
   type: free GPUs on nodes of another type than the service's Deployment selects (``DeploymentInfo.gpu_product``)
   are no room for its replicas, so the hold was let go when they sat on other-type nodes; a higher-priority service
   of another type takes none of the service's room, so the hold was kept for nothing. Now the room, the GPUs taken
   before, and what the hole's waiting gang takes (``_gang_takes``) are counted on the service's GPU type only (every
   type when the Deployment selects none).
2. A gang whose minAvailable exceeds the pods it has so far (placed and pending) cannot start: gang schedulers admit
   none of it until minAvailable of its pods exist. ``WaitingGpuWork.needed_pods`` clamped the minimum to the pending
   pods, so such a gang was counted as starting with all of them. Its pending pods that ask for no GPU (an MPI
   launcher) count towards its minAvailable as its placed ones do (the Kubernetes reader, which leaves such pods
   out unless includeNonGpuPods, takes them off the minAvailable it reads: ``tests/kube/test_gang_members_unread.py``).

chat runs 10 replicas of 1 GPU: 8 on n1 (full), 2 on n2 (6 free, marked to go first); its floor asks for 8, its
forecast wants 12 back within the contended window (a comeback of 2). Removing n2's 2 replicas opens an 8-GPU hole on
n2. 10 kept (held at 9, within the scale-down tolerance): the hold; 8: no hold.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo, WorkloadInfo, waiting_gpu_work
from autoscaler.core.model import ControllerState
from autoscaler.core.tick import ForecastReadConfig, TickConfig, decide_tick
from tests.core.test_contended_hold_gangs import RISE, _chat
from tests.core.test_review39_predictive import CHAT, CHAT_NO_WINDOW, _desired, _earned, _tick

HELD, FREE = 10, 8
VISION = replace(CHAT, name="vision", priority=2000)  # a higher-priority service, its floor 8 above its 0 replicas


def _node(name: str, product: str | None = "A100") -> NodeInfo:
    return NodeInfo(name, 8, product, None, True)


def _job(name: str, pods: tuple[int, ...], product: str | None = None) -> WorkloadInfo:
    return WorkloadInfo("Job", "ml", name, f"job/ml/{name}", True, 100, pods, product, suspended_by_us_at=-60.0)


def _pending(gang: str, sizes: tuple[int, ...], min_available: int | None = None) -> tuple[PodInfo, ...]:
    return tuple(
        replace(
            PodInfo("ml", f"{gang}-{i}", None, gpus, 100, "Pending", False, "Job", gang),
            gang=f"job/ml/{gang}", gang_min_available=min_available,
        )
        for i, gpus in enumerate(sizes)
    )  # fmt: skip


def _running(gang: str, count: int, min_available: int | None, node: str = "n1", gpus: int = 0) -> tuple[PodInfo, ...]:
    """Pods of the gang already placed (on n1, holding ``gpus`` each: n1 is full, so none by default)."""
    return tuple(
        replace(pod, name=f"{gang}-run-{i}", node=node, phase="Running", ready=True)
        for i, pod in enumerate(_pending(gang, (gpus,) * count, min_available))
    )


def _used(node: str, gpus: int) -> PodInfo:
    """A higher-priority job holding ``gpus`` of ``node``."""
    return PodInfo("ml", f"other-{node}", node, gpus, 5000, "Running", True, "Job", f"other-{node}")


def _decide(
    chat_type: str | None = "A100",
    n3: str | None = "A100",
    extra_nodes: tuple[NodeInfo, ...] = (),
    pods: tuple[PodInfo, ...] = (),
    workloads: tuple[WorkloadInfo, ...] = (),
    vision: bool = False,
    vision_type: str | None = None,
) -> int:
    """chat's decision; ``chat_type``: the GPU type its Deployment selects (None: any); n1 and n2 are A100 nodes, n3
    an 8-GPU node of type ``n3`` (free unless ``pods`` use it); ``vision``: with a higher-priority service of GPU type
    ``vision_type`` (None: any) whose floor takes 8 GPUs."""
    chat = (*_chat("n1", 8, 0), *_chat("n2", 2, 8, cost=-1))
    deployments = (DeploymentInfo("ml", "chat", 10, 10, gpu_product=chat_type),)
    policies = {CHAT.key: CHAT_NO_WINDOW}
    forecasts = {CHAT.key: _earned(CHAT, RISE)}
    services = {CHAT.key: (10, 24.0)}
    if vision:
        deployments += (DeploymentInfo("ml", "vision", 0, 0, gpu_product=vision_type),)
        policies[VISION.key] = VISION
        forecasts[VISION.key] = _earned(VISION, RISE)
        services[VISION.key] = (0, 24.0)
    nodes = (_node("n1"), _node("n2"), _node("n3", n3), *extra_nodes)
    snapshot = ClusterSnapshot(0.0, deployments, (*chat, *pods), nodes, workloads=workloads)
    tick = _tick(policies, forecasts, services, snapshot)
    plan, _ = decide_tick(tick, ControllerState(), TickConfig(ForecastReadConfig(contended_hold_s=1800.0)))
    return _desired(plan, CHAT.key)


# ---- 1. the room counted on the service's GPU type ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "desired", "why"),
    [
        pytest.param(
            {"n3": "H100", "workloads": (_job("solo", (8,), "A100"),)},
            HELD,
            "the A100 job takes the hole's 8; the 2 A100 replicas wanted back find n1 and n2 full, and n3's 8 free "
            "GPUs are H100s: the comeback would preempt the job (defect: n3's 8 counted, scaled to 8)",
            id="A100 service, the free GPUs on an H100 node",
        ),
        pytest.param(
            {"n3": "H100", "workloads": (_job("solo", (8,)),)},
            HELD,
            "the same with a job of any GPU type: it takes the hole (defect: scaled to 8)",
            id="A100 service, a job of any type, the free GPUs on an H100 node",
        ),
        pytest.param(
            {"n3": None, "workloads": (_job("solo", (8,), "A100"),)},
            HELD,
            "a node without a GPU type label is no node an A100 nodeSelector matches (defect: scaled to 8)",
            id="A100 service, the free GPUs on an unlabelled node",
        ),
        pytest.param(
            {"chat_type": None, "n3": "H100", "workloads": (_job("solo", (8,), "A100"),)},
            FREE,
            "a Deployment that selects no GPU type comes back to n3's H100s: nothing to hold",
            id="a service of any type, the free GPUs on an H100 node",
        ),
        pytest.param(
            {"workloads": (_job("solo", (8,), "A100"),), "extra_nodes": (_node("n4", "H100"),)},
            FREE,
            "n3's 8 A100s hold the comeback; n4's H100s change nothing",
            id="A100 service, free GPUs on an A100 and an H100 node",
        ),
        pytest.param(
            {"n3": "H100", "workloads": (_job("gang", (8, 8)),), "extra_nodes": (_node("n4"),)},
            HELD,
            "a 2 x 8 gang of any type starts on the hole and on n3 (H100) or n4 (A100): the scheduler may take n4, "
            "all the A100 room the comeback needs (defect: counted on n3, the first by name, and n3's H100s counted "
            "as room: scaled to 8)",
            id="a gang of any type, its second node an A100 or an H100",
        ),
        pytest.param(
            {
                "n3": "A100",
                "pods": (_used("n3", 4),),
                "workloads": (_job("gang", (8, 8)),),
                "extra_nodes": (_node("n4", "H100"),),
            },
            FREE,
            "a 2 x 8 gang of any type starts on the hole and n4 (H100; n3 has 4 free): it takes 8 of the A100 room, "
            "the comeback's 2 find n3's 4 (counting its H100 pod against the A100 room would hold for nothing)",
            id="a gang of any type, its second pod on an H100 node",
        ),
        pytest.param(
            {"vision": True, "vision_type": "H100", "workloads": (_job("solo", (8,), "A100"),)},
            FREE,
            "vision's floor takes 8 H100 GPUs (none free yet: it waits for a node), none of chat's A100 room: the job "
            "takes the hole, the comeback's 2 find n3's 8 (defect: vision's 8 counted against it, held)",
            id="a higher-priority H100 service's floor",
        ),
        pytest.param(
            {"vision": True, "vision_type": "A100", "workloads": (_job("solo", (8,), "A100"),)},
            HELD,
            "an A100 service's floor takes n3's 8: no room for the comeback",
            id="a higher-priority A100 service's floor",
        ),
        pytest.param(
            {"vision": True, "vision_type": None, "workloads": (_job("solo", (8,), "A100"),)},
            HELD,
            "a higher-priority service of any type may take n3's 8: counted against chat's room",
            id="a higher-priority service of any type",
        ),
    ],
)
def test_the_contended_hold_counts_the_room_of_the_services_gpu_type(
    kw: dict[str, object], desired: int, why: str
) -> None:
    assert _decide(**kw) == desired, why  # type: ignore[arg-type]


# ---- 2. a gang too few of whose pods exist to reach its minAvailable ---------------------------------------------


@pytest.mark.parametrize(
    ("pods", "desired", "why"),
    [
        pytest.param(
            _pending("g", (8, 8), min_available=3),
            FREE,
            "2 pods of a gang of minAvailable 3: the scheduler starts none of it until a third exists; the hole's 8 "
            "sit idle or go to one pod, the comeback finds n3's 8 (defect: counted as starting on the hole and n3, "
            "held)",
            id="2 pods of 3",
        ),
        pytest.param(
            (*_pending("g", (8, 8), min_available=4), *_running("g", 1, 4)),
            FREE,
            "1 placed and 2 pending of minAvailable 4: 3 pods, one short (defect: held)",
            id="3 pods of 4, one placed",
        ),
        pytest.param(
            _pending("g", (8, 8), min_available=2),
            HELD,
            "2 pods of minAvailable 2: it starts on the hole and n3, all 16 free GPUs",
            id="2 pods of 2",
        ),
        pytest.param(
            (*_pending("g", (8, 8), min_available=3), *_pending("g", (0,), min_available=3)),
            HELD,
            "2 GPU pods and a pending launcher without GPUs (read with includeNonGpuPods): 3 pods, it starts",
            id="2 GPU pods and a pending launcher of 3",
        ),
        pytest.param(
            (*_pending("g", (8, 8), min_available=3), *_running("g", 1, 3)),
            HELD,
            "2 pending and a running launcher without GPUs of minAvailable 3: its 2 GPU pods start it",
            id="2 GPU pods and a running launcher of 3",
        ),
    ],
)
def test_a_gang_too_few_of_whose_pods_exist_does_not_start(pods: tuple[PodInfo, ...], desired: int, why: str) -> None:
    assert _decide(pods=pods) == desired, why


@pytest.mark.parametrize(
    ("pods", "startable"),
    [
        pytest.param(_pending("g", (8, 8), 3), False, id="2 of 3"),
        pytest.param((*_pending("g", (8, 8), 3), *_running("g", 1, 3)), True, id="2 pending + 1 placed of 3"),
        pytest.param((*_pending("g", (8, 8), 3), *_pending("g", (0,), 3)), True, id="2 + a pending GPU-less of 3"),
        pytest.param(
            (*_pending("g", (8, 8), 3), replace(_running("g", 1, 3)[0], terminating=True)),
            False,
            id="2 pending + 1 being deleted of 3",
        ),
        pytest.param(_pending("g", (8, 8)), True, id="no minAvailable: all its pods"),
    ],
)
def test_waiting_gpu_work_needs_more_pods_than_it_has_when_too_few_exist(
    pods: tuple[PodInfo, ...], startable: bool
) -> None:
    works = [w for w in waiting_gpu_work(ClusterSnapshot(0.0, pods=pods, nodes=(_node("n1"), _node("n2")))) if w.gpus]
    assert works
    assert {w.needed_pods <= len(w.gang) for w in works} == {startable}
