"""The reader keeps a Deployment's pod template labels and its required pod anti-affinity
(``required_pod_anti_affinity_of``), which the capacity arbitration honours
(``tests/core/test_pod_anti_affinity.py``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from autoscaler.adapters.kubernetes import KubeClusterReader
from autoscaler.adapters.kubernetes.reader import required_pod_anti_affinity_of
from autoscaler.core.cluster import HOSTNAME_LABEL, LabelTest, PodAntiAffinityTerm, PodInfo, spread_domains
from tests.kube import objects as o


def _spec(*terms: Any) -> dict[str, Any]:
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}}


ONE_PER_NODE = {"labelSelector": {"matchLabels": {"app": "chat"}}, "topologyKey": HOSTNAME_LABEL}


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        pytest.param(
            [ONE_PER_NODE], (PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, frozenset({"inference"})),),
            id="no namespaces: the pod's own",
        ),
        pytest.param(
            [{**ONE_PER_NODE, "namespaces": ["a", "b"]}],
            (PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, frozenset({"a", "b"})),),
            id="namespaces listed",
        ),
        pytest.param(
            [{**ONE_PER_NODE, "namespaceSelector": {}}], (PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, None),),
            id="a namespaceSelector: every namespace",
        ),
        pytest.param(
            [{**ONE_PER_NODE, "namespaceSelector": {"matchLabels": {"team": "ml"}}}],
            (PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, None),),
            id="a namespaceSelector with labels: every namespace too (their labels are not read)",
        ),
        pytest.param(
            [{"topologyKey": "zone"}], (PodAntiAffinityTerm({}, "zone", frozenset({"inference"})),),
            id="a null labelSelector: selects no pod",
        ),
        pytest.param([{"labelSelector": {"matchLabels": {"app": "chat"}}}], (), id="no topologyKey: not kept"),
        pytest.param(
            [{"labelSelector": {"matchExpressions": [{"key": "app", "operator": "Bogus"}]}, "topologyKey": "zone"}],
            (), id="a selector the API server refuses: not kept",
        ),
        pytest.param(["odd", None], (), id="terms that are no objects"),
    ],
)  # fmt: skip
def test_required_pod_anti_affinity_terms(terms: list[Any], expected: tuple[PodAntiAffinityTerm, ...]) -> None:
    assert required_pod_anti_affinity_of(_spec(*terms), "inference") == expected


def test_match_expressions_are_read_as_the_pdb_selectors_are() -> None:
    term = {
        "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["chat", "code"]}]},
        "topologyKey": HOSTNAME_LABEL,
    }
    (read,) = required_pod_anti_affinity_of(_spec(term), "inference")
    assert isinstance(read.selector["app"], LabelTest)
    code = PodInfo("inference", "p", "n1", 1, 0, "Running", True, labels={"app": "code"})
    assert read.selects(code) and not read.selects(PodInfo("inference", "q", "n1", 1, 0, "Running", True))


def test_no_anti_affinity_reads_as_none() -> None:
    assert required_pod_anti_affinity_of({}, "inference") == ()
    assert required_pod_anti_affinity_of({"affinity": {"nodeAffinity": {}}}, "inference") == ()
    assert required_pod_anti_affinity_of({"affinity": "odd"}, "inference") == ()


def test_a_deployment_spread_one_per_node_is_read_as_spread() -> None:
    raw = copy.deepcopy(o.deployment("chat", "inference"))
    raw["spec"]["template"]["spec"].update(_spec(ONE_PER_NODE))
    deployment = KubeClusterReader._deployment(raw)
    assert deployment.pod_labels == {"app": "chat"}
    assert deployment.anti_affinity == (PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, frozenset({"inference"})),)
    assert spread_domains(deployment, ()) == {}
    plain = KubeClusterReader._deployment(o.deployment("chat", "inference"))
    assert plain.anti_affinity == () and spread_domains(plain, ()) is None


def test_a_pods_own_terms_are_read_whoever_owns_it() -> None:
    """kube-scheduler's symmetric check reads each running pod's own terms (stop 50): a StatefulSet's pod, a bare
    pod; a pod without any reads as none (an empty tuple: read, not "unknown")."""
    from kubernetes import client

    from autoscaler.adapters.kubernetes.reader import ReaderConfig

    reader = KubeClusterReader(client.ApiClient(), ReaderConfig(), sleep=lambda s: None)
    raw = o.pod("embed-0", "inference", owner=("StatefulSet", "embed"), labels={"app": "embed"})
    raw["spec"].update(_spec({**ONE_PER_NODE, "labelSelector": {"matchLabels": {"app": "code"}}}))
    pod = reader._pod(raw, {}, 0)
    assert pod is not None and pod.owner_kind == "StatefulSet"
    assert pod.anti_affinity == (PodAntiAffinityTerm({"app": "code"}, HOSTNAME_LABEL, frozenset({"inference"})),)
    plain = reader._pod(o.pod("solo", "inference"), {}, 0)
    assert plain is not None and plain.anti_affinity == ()
