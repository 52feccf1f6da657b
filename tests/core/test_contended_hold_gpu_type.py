"""The contended hold counts only the GPUs the service's replicas could come back to.

The contended hold (``core.tick.read_forecasts``) keeps a forecasting service from a scale-down that opens a hole for
waiting lower-priority GPU work when the replicas its forecast wants back within the window would then find too few
free GPUs: the work started in the hole would be preempted at the next rise.

The defect: the room the replicas come back to was the free GPUs of every ready node, of every GPU type
(``sum(room.free.values())``), and the GPUs higher-priority floors take were counted against it whatever their
type: free GPUs on nodes of another type than the service's Deployment selects (``DeploymentInfo.gpu_product``)
are no room for its replicas, so the hold was let go when they sat on other-type nodes; a higher-priority service
of another type takes none of the service's room, so the hold was kept for nothing. Now the room, the GPUs taken
before, and what the hole's waiting gang takes (``_gang_takes``) are counted on the service's GPU type only (every
type when the Deployment selects none).

chat runs 10 replicas of 1 GPU: 8 on n1 (full), 2 on n2 (6 free, marked to go first); its floor asks for 8, its
forecast wants 12 back within the contended window (a comeback of 2). Removing n2's 2 replicas opens an 8-GPU hole on
n2. 10 kept (held at 9, within the scale-down tolerance): the hold; 8: no hold.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo, WorkloadInfo
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
