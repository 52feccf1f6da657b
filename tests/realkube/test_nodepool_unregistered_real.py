"""A scale-down that gives back a Machine that never registered a Node (``remove_unregistered``), against the real
apiserver: the Machines are real objects (created with plain REST, their creationTimestamp set by the apiserver),
the mark and the size write go through the official client, preconditions and the scale subresource included; a
Machine younger than the minimum age the core passes (its provision limit) is never given back."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes.nodepool import (
    DELETE_MACHINE_ANNOTATION,
    MARKED_BY_ANNOTATION,
    NoUnregisteredMachineError,
)
from autoscaler.ports import WriteOutcome
from tests.kube import objects as o
from tests.realkube.control_plane import ControlPlane
from tests.realkube.test_adapter_faults_real import crd

pytestmark = [pytest.mark.integration, pytest.mark.realkube]


def test_a_scale_down_gives_back_the_oldest_machine_without_a_node(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    """Two registered Machines, two without a Node: the older of those (created a second and more before the other,
    the creationTimestamp's resolution) is marked, then the size lowered; no registered Machine is touched."""
    cp = control_plane
    group = "/apis/cluster.x-k8s.io/v1beta1/namespaces/" + namespace
    with crd(cp, o.machine_deployment_crd()), crd(cp, o.machine_crd()):
        body = o.machine_deployment("b", namespace, replicas=4)
        status = body.pop("status")
        cp.request("POST", f"{group}/machinedeployments", body)
        live = cp.get(f"{group}/machinedeployments/b")
        cp.request("PUT", f"{group}/machinedeployments/b/status", {**live, "status": status})
        for name, node in (("b-1", "burst-1"), ("b-2", "burst-2"), ("b-old", None), ("b-anew", None)):
            if name == "b-anew":
                time.sleep(1.1)  # a creationTimestamp has whole seconds
            machine = o.machine(name, "b", node, namespace)
            machine_status = machine.pop("status")
            cp.request("POST", f"{group}/machines", machine)
            live = cp.get(f"{group}/machines/{name}")
            cp.request("PUT", f"{group}/machines/{name}/status", {**live, "status": machine_status})

        def annotations(name: str) -> dict[str, str]:
            return cp.get(f"{group}/machines/{name}")["metadata"].get("annotations") or {}

        pools = MachineDeploymentNodePools(api_client, namespace, sleep=lambda s: None)
        # none of them has waited an hour (the apiserver's creationTimestamp): nothing given back, nothing written
        with pytest.raises(NoUnregisteredMachineError, match="2 created less than 3600s ago"):
            pools.scale("b", 3, expected=4, remove_unregistered=True, unregistered_min_age_s=3600.0)
        assert cp.get(f"{group}/machinedeployments/b")["spec"]["replicas"] == 4
        assert not any(DELETE_MACHINE_ANNOTATION in annotations(m) for m in ("b-1", "b-2", "b-old", "b-anew"))
        outcome = pools.scale("b", 3, expected=4, remove_unregistered=True, unregistered_min_age_s=1.0)
        assert outcome is WriteOutcome.WROTE
        assert cp.get(f"{group}/machinedeployments/b")["spec"]["replicas"] == 3
        mark = annotations("b-old")
        assert mark[DELETE_MACHINE_ANNOTATION].startswith("gpu-autoscaler ")
        assert mark[MARKED_BY_ANNOTATION] == mark[DELETE_MACHINE_ANNOTATION]
        for other in ("b-1", "b-2", "b-anew"):
            assert DELETE_MACHINE_ANNOTATION not in annotations(other), other
