"""Review of stop 50 (a running pod's own required anti-affinity in the symmetric check, ``PodInfo.anti_affinity``).

The rule ``core.cluster.anti_affinity_barred`` states: a pod whose own terms were read is judged by them, whoever owns
it, and its Deployment's template only when they were not read (None). Every other place that applies the symmetric
check must say the same.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.cluster import (
    DeploymentInfo,
    PodAntiAffinityTerm,
    PodInfo,
)
from autoscaler.core.rebalance import RebalanceConfig, _Cluster
from tests.core.test_pod_anti_affinity import (
    AWAY_FROM_CODE,
    CODE,
    CODE_LABELS,
    PLAIN,
    _replica,
    _snapshot,
)

CHAT_AWAY_FROM_CODE = replace(PLAIN, anti_affinity=(AWAY_FROM_CODE,))


def _code_pod(node: str) -> PodInfo:
    return replace(_replica(5, node), name="code-5", owner_name="code", labels=CODE_LABELS)


# -- the rebalancer: a landing pod of a Deployment is judged by its own terms where they were read -------------------


@pytest.mark.parametrize(
    ("chat", "own_terms", "code_kept_off_n3"),
    [
        pytest.param(PLAIN, None, False, id="not read, the template keeps nothing"),
        pytest.param(CHAT_AWAY_FROM_CODE, None, True, id="not read, the template keeps code away"),
        pytest.param(PLAIN, (AWAY_FROM_CODE,), True, id="read: its own terms keep code away, the template none"),
        pytest.param(CHAT_AWAY_FROM_CODE, (AWAY_FROM_CODE,), True, id="read, same as the template"),
    ],
)  # fmt: skip
def test_a_landing_deployment_pod_keeps_the_replicas_its_own_terms_select_off(
    chat: DeploymentInfo, own_terms: tuple[PodAntiAffinityTerm, ...] | None, code_kept_off_n3: bool
) -> None:
    """A Pending replica of chat (a waiting target) is expected on n3. Its own terms, as read, are the spec it is
    scheduled with (a webhook's, or its ReplicaSet's during a rollout): once bound, kube-scheduler keeps code's next
    replica off n3 by them -- as ``anti_affinity_barred`` counts the running pods' own terms."""
    waiting = replace(_replica(1, None), anti_affinity=own_terms)
    snapshot = replace(_snapshot(waiting, _code_pod("n2")), deployments=(chat, CODE))
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert cluster.allowed("n3", None, False, [_code_pod("n2")])
    cluster.lands([waiting], ["n3"])
    assert cluster.allowed("n3", None, False, [_code_pod("n2")]) is not code_kept_off_n3


def test_a_landing_deployment_pod_whose_own_terms_were_read_empty_is_judged_by_them() -> None:
    """As ``anti_affinity_barred``: read without terms (``()``) is no term, whatever the template says -- with both
    a running chat pod read so and one landing, code may go on either node."""
    running = replace(_replica(0, "n1"), anti_affinity=())
    snapshot = replace(_snapshot(running, _code_pod("n2")), deployments=(CHAT_AWAY_FROM_CODE, CODE))
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert cluster.allowed("n1", None, False, [_code_pod("n2")]), "the running pod: its own (no) terms"
    cluster.lands([replace(_replica(1, None), anti_affinity=())], ["n3"])
    assert cluster.allowed("n3", None, False, [_code_pod("n2")])
