"""The reader keeps a Deployment template's hard topology spread constraints (``hard_spread_constraints_of``), which
the capacity arbitration honours (``tests/core/test_topology_spread.py``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from autoscaler.adapters.kubernetes import KubeClusterReader
from autoscaler.adapters.kubernetes.reader import hard_spread_constraints_of
from autoscaler.core.cluster import TopologySpreadConstraint
from tests.kube import objects as o

ZONE = "topology.kubernetes.io/zone"
BY_ZONE = {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "chat"}}}  # fmt: skip
READ = TopologySpreadConstraint(1, ZONE, {"app": "chat"})


@pytest.mark.parametrize(
    ("constraints", "expected"),
    [
        pytest.param([BY_ZONE], (READ,), id="maxSkew 1 by zone"),
        pytest.param([{**BY_ZONE, "whenUnsatisfiable": "ScheduleAnyway"}], (), id="ScheduleAnyway scores only"),
        pytest.param([{**BY_ZONE, "minDomains": 3, "nodeAffinityPolicy": "Ignore", "nodeTaintsPolicy": "Honor"}],
                     (TopologySpreadConstraint(1, ZONE, {"app": "chat"}, 3, False, True),), id="the policies"),
        pytest.param([{**BY_ZONE, "labelSelector": None}], (TopologySpreadConstraint(1, ZONE, {}),),
                     id="a null labelSelector counts no pod"),
        pytest.param([{**BY_ZONE, "maxSkew": 0}], (), id="maxSkew 0: refused by the API server, not kept"),
        pytest.param([{**BY_ZONE, "maxSkew": True}], (), id="maxSkew not an integer"),
        pytest.param([{**BY_ZONE, "topologyKey": ""}], (), id="no key"),
        pytest.param([{**BY_ZONE, "minDomains": 0}], (), id="minDomains 0"),
        pytest.param([{**BY_ZONE, "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Nope"}]}}], (),
                     id="a selector the API server refuses"),
        pytest.param(["odd", None, BY_ZONE], (READ,), id="items that are no objects are skipped"),
    ],
)  # fmt: skip
def test_hard_spread_constraints(constraints: list[Any], expected: tuple[TopologySpreadConstraint, ...]) -> None:
    assert hard_spread_constraints_of({"topologySpreadConstraints": constraints}) == expected


def test_none_read_as_none() -> None:
    assert hard_spread_constraints_of({}) == ()
    assert hard_spread_constraints_of({"topologySpreadConstraints": "odd"}) == ()


def test_a_deployment_spread_over_zones_is_read_with_its_constraint() -> None:
    raw = copy.deepcopy(o.deployment("chat", "inference"))
    raw["spec"]["template"]["spec"]["topologySpreadConstraints"] = [BY_ZONE]
    assert KubeClusterReader._deployment(raw).spread_constraints == (READ,)
    assert KubeClusterReader._deployment(o.deployment("chat", "inference")).spread_constraints == ()
