"""Review of stop 48 (required node affinity): ``NodeRequirement.holds`` against kube-scheduler's NodeAffinity filter
(k8s.io/component-helpers/scheduling/corev1/nodeaffinity and apimachinery's ``labels.NewRequirement``). A requirement
kube-scheduler cannot parse makes its whole term match no node; one the autoscaler reads as holding counts room the
pod can never take (the resume, the victim search, the rebalancer)."""

from __future__ import annotations

import pytest

from autoscaler.core.cluster import NodeRequirement, NodeSelector, labels_select

LABELS = {"pool": "onprem", "zone": "a", "driver": "550", "huge": "99999999999999999999"}


def _req(key: str, operator: str, *values: str, on_name: bool = False) -> NodeRequirement:
    return NodeRequirement(key, operator, values, on_name)


@pytest.mark.parametrize(
    "requirement",
    [
        # In/NotIn need values: "for 'in', 'notin' operators, values set can't be empty" (a CRD's template is not
        # validated as a pod is): NotIn of nothing held on every node
        _req("zone", "NotIn"),
        _req("rack", "NotIn"),
        # Gt/Lt compare int64s (strconv.ParseInt(v, 10, 64)): a label or a bound beyond it parses to no match
        _req("huge", "Gt", "1"),
        _req("driver", "Lt", "99999999999999999999"),
        # a bound that is no valid label value (a label value starts alphanumeric: "-5", "+535") is refused by
        # NewRequirement although ParseInt takes the sign
        _req("driver", "Gt", "-5"),
        _req("driver", "Gt", "+535"),
        # the API server does not validate a pod's affinity values, kube-scheduler does (validateLabelValue): a NotIn
        # on a value no label can have ("NVIDIA A100", a space) makes the term unparsable, admitting no node
        _req("gpu", "NotIn", "NVIDIA A100"),
        _req("zone", "NotIn", "x" * 64),
        # a key that is no label key (validateLabelKey)
        _req("bad key", "DoesNotExist"),
        _req("a/b/c", "NotIn", "x"),
        # matchFields: only In and NotIn, with exactly one value (nodeSelectorRequirementsAsFieldSelector)
        _req("metadata.name", "Exists", on_name=True),
        _req("metadata.name", "DoesNotExist", on_name=True),
        _req("metadata.name", "In", "n1", "n2", on_name=True),
        _req("metadata.name", "NotIn", "x", "y", on_name=True),
        _req("metadata.name", "NotIn", on_name=True),
    ],
    ids=repr,
)
def test_a_requirement_kube_scheduler_cannot_parse_holds_on_no_node(requirement: NodeRequirement) -> None:
    assert requirement.holds(LABELS, "n1") is False
    assert not labels_select(LABELS, NodeSelector({}, ((requirement,),)), "n1")


@pytest.mark.parametrize(
    ("requirement", "holds"),
    [
        (_req("driver", "Lt", "9223372036854775807"), True),  # the int64 maximum still parses
        (_req("zone", "NotIn", "b", ""), True),  # an empty value is a valid label value
        (_req("example.com/zone", "DoesNotExist"), True),  # a prefixed key
        (_req("metadata.name", "NotIn", "n2", on_name=True), True),
    ],
    ids=repr,
)
def test_well_formed_requirements_still_hold(requirement: NodeRequirement, holds: bool) -> None:
    assert requirement.holds(LABELS, "n1") is holds


def test_a_workload_kept_off_a_gpu_type_by_a_value_no_label_can_have_is_not_resumed() -> None:
    """``NotIn ["NVIDIA A100"]`` (a space: no label value) passes the API server and leaves kube-scheduler no node
    for the pods; the free node n2 is no room for the workload, which stays suspended."""
    from tests.core import test_suspended_workload_placement as swp

    unparsable = NodeSelector({}, ((_req("nvidia.com/gpu.product", "NotIn", "NVIDIA A100"),),))
    resumed, _ = swp._resumes((swp._node("n1"), swp._node("n2")), swp._workload(unparsable))  # type: ignore[arg-type]
    assert resumed is False
