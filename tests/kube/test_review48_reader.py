"""Review of stop 48: a required node affinity the reader cannot read is one admitting no node (the pods made from
such a template are refused, or left Pending by kube-scheduler), never none at all (every node)."""

from __future__ import annotations

import pytest

from autoscaler.adapters.kubernetes.reader import node_selector_of
from autoscaler.core.cluster import labels_select

NODE = {"pool": "train", "zone": "a"}


def _required(required: object) -> dict[str, object]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


@pytest.mark.parametrize(
    "spec",
    [
        # the selector written as its list of terms (an object is required)
        pytest.param(
            _required([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}]), id="list"
        ),
        pytest.param(_required("pool=spot"), id="string"),
        pytest.param({"affinity": {"nodeAffinity": ["odd"]}}, id="nodeAffinity not an object"),
        pytest.param({"affinity": "odd"}, id="affinity not an object"),
        # values written as one string: DoesNotExist "with values" is refused, not read as DoesNotExist
        pytest.param(
            _required({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "gpu", "operator": "DoesNotExist", "values": "x"}]}]}),
            id="values not a list",
        ),
        # matchExpressions not a list beside a matchFields that holds: the term is not the matchFields alone
        pytest.param(
            _required({"nodeSelectorTerms": [{
                "matchExpressions": {"key": "pool", "operator": "In", "values": ["spot"]},
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
            }]}),
            id="matchExpressions not a list",
        ),
    ],
)  # fmt: skip
def test_an_unreadable_required_affinity_admits_no_node(spec: dict[str, object]) -> None:
    assert not labels_select(NODE, node_selector_of(spec), "n1")


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"affinity": None},
        {"affinity": {"nodeAffinity": None}},
        _required(None),
        {"affinity": {"podAntiAffinity": {}}},
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    ],
    ids=repr,
)
def test_no_required_affinity_still_admits_every_node(spec: dict[str, object]) -> None:
    selector = node_selector_of(spec)
    assert type(selector) is dict and labels_select(NODE, selector, "n1")
