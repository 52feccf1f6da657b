"""The Cluster Autoscaler min/max-size annotations: a scale-UP plan on a pool already above its max-size annotation
never shrinks the pool (it deleted running nodes once); a bound that is not an integer is ignored, logged once."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes.nodepool import MIN_SIZE_ANNOTATION as MIN_SIZE
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

MD = "cluster.x-k8s.io/v1beta1"


def test_scale_up_never_shrinks_a_pool_above_its_max(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    # 5 machines running; an operator lowered the CA max-size annotation to 3 (Cluster Autoscaler then just stops
    # growing the group, it never deletes nodes for it).
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=5, max_size=3))
    p = MachineDeploymentNodePools(api_client, "capi-system", sleep=lambda s: None)
    p.scale("b", 6, expected=5)  # the plan: +1 node, from the live size 5
    assert apiserver.get(MD, "MachineDeployment", "b", "capi-system")["spec"]["replicas"] >= 5


def test_keeping_the_live_size_never_shrinks(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=5, max_size=3))
    p = MachineDeploymentNodePools(api_client, "capi-system", sleep=lambda s: None)
    p.scale("b", 5, expected=5)  # "already there is fine" -- yet a write to 3 follows
    assert apiserver.get(MD, "MachineDeployment", "b", "capi-system")["spec"]["replicas"] == 5


def test_a_bound_that_is_not_an_integer_is_ignored_and_logged_once_per_value(
    apiserver: FakeApiServer, api_client: client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The bounds are read every tick: a bad annotation is logged when first seen (and again once its value changes),
    not on every read; the other bound is still applied."""
    md = o.machine_deployment("b", replicas=2, max_size=4)
    md["metadata"]["annotations"][MIN_SIZE] = "one"
    apiserver.seed(o.machine_deployment_crd(), md)
    p = MachineDeploymentNodePools(api_client, "capi-system", sleep=lambda s: None)
    with caplog.at_level(logging.WARNING):
        assert [p.bounds("b") for _ in range(3)] == [(None, 4)] * 3
    assert [r.getMessage() for r in caplog.records if "not an integer" in r.getMessage()] == [
        "MachineDeployment b: annotation " + MIN_SIZE + "='one' is not an integer: ignored (this bound is not applied)"
    ]
    caplog.clear()
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta1", "capi-system", "machinedeployments", "b",
        {"metadata": {"annotations": {MIN_SIZE: "two"}}},
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert p.bounds("b") == (None, 4)
        assert p.bounds("b") == (None, 4)
    assert len([r for r in caplog.records if "'two' is not an integer" in r.getMessage()]) == 1
