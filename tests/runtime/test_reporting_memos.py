"""The reporter's memos (the policy status written, the Warning Events reported) follow the objects the tick lists.

Before the fix they were never pruned: a GPUScalingPolicy deleted and created again under the same name (a new object,
generation 1 again, an empty status and no Events) matched the memo of the deleted one, so its status was never
written and its MetricsStale / InvalidSpec / HpaConflict Warnings never emitted; and the memos grew by one entry per
deleted policy (and, in a dry run, per pod a plan ever targeted) for the life of the process.
"""

from __future__ import annotations

from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, policy_object

from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.ports import PolicyObject
from tests.runtime.test_controller import make

T0 = 1_800_000_000.0
KEY = "ml/chat"
POLICY = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0)


def churn(c: Controller, cluster: FakeCluster, metrics: FakeMetrics, policies: FakePolicies, stale: bool) -> None:
    """50 policies, each listed for one tick and then deleted, then none."""
    for i in range(50):
        p = ServicePolicy("ml", f"svc{i}", min_replicas=1, max_replicas=20, target=70.0)
        cluster.deployments[p.key] = [2, 2]
        if stale:
            metrics.stale[p.key] = ("empty result",)
        else:
            metrics.util[p.key] = 70.0
        policies.objects = [policy_object(p)]
        c.run_once(T0 + 15 * i)
    policies.objects = []
    c.run_once(T0 + 15 * 51)


# ---- status ----------------------------------------------------------------------------------------------------------


def test_a_policy_created_again_under_the_same_name_gets_its_status_written() -> None:
    c, _, _, policies, status = make()
    c.run_once(T0)
    assert ("ml", "chat-policy") in status.status
    policies.objects = []  # kubectl delete: the object and its status are gone
    del status.status[("ml", "chat-policy")]
    c.run_once(T0 + 15)
    policies.objects = [policy_object(POLICY)]  # kubectl apply again: a new object, generation 1, empty status
    c.run_once(T0 + 30)
    assert ("ml", "chat-policy") in status.status
    assert status.status[("ml", "chat-policy")]["currentReplicas"] == 2


def test_status_memos_of_deleted_policies_are_dropped() -> None:
    c, cluster, metrics, policies, _ = make()
    churn(c, cluster, metrics, policies, stale=False)
    assert c.reporter._written_status == {}
    assert c.reporter._written_forecast == {}


def test_a_failed_policy_read_forgets_nothing() -> None:
    c, _, _, policies, status = make()
    c.run_once(T0)
    policies.fail = RuntimeError("apiserver restarting")
    c.run_once(T0 + 15)
    policies.fail = None
    writes = status.writes
    c.run_once(T0 + 30)
    assert status.writes == writes  # still remembered: a steady status is not written again


# ---- Warning Events --------------------------------------------------------------------------------------------------


def test_a_policy_created_again_while_its_metrics_are_stale_gets_its_warning() -> None:
    c, cluster, metrics, policies, _ = make()
    metrics.stale[KEY] = ("empty result",)
    c.run_once(T0)
    assert [e["reason"] for e in cluster.events] == ["MetricsStale"]
    policies.objects = []
    c.run_once(T0 + 15)
    policies.objects = [policy_object(POLICY)]  # a new object: no Events of its own
    c.run_once(T0 + 30)
    c.run_once(T0 + 45)  # once per episode still
    assert [e["reason"] for e in cluster.events] == ["MetricsStale", "MetricsStale"]


def test_an_invalid_policy_created_again_gets_its_warning() -> None:
    c, cluster, _, policies, _ = make()
    bad = PolicyObject("ml", "bad-policy", None, error="spec.maxReplicas: must be >= minReplicas", generation=1)
    policies.objects = [bad]
    c.run_once(T0)
    policies.objects = []
    c.run_once(T0 + 15)
    policies.objects = [bad]
    c.run_once(T0 + 30)
    assert [e["reason"] for e in cluster.events] == ["InvalidSpec", "InvalidSpec"]


def test_event_memos_of_deleted_policies_are_dropped() -> None:
    c, cluster, metrics, policies, _ = make()
    churn(c, cluster, metrics, policies, stale=True)
    assert c.actuator.reported == {}


def test_dry_run_event_memos_of_pods_and_deployments_gone_are_dropped() -> None:
    c, cluster, metrics, _, _ = make(dry_run=True)
    metrics.util[KEY] = 140.0
    c.run_once(T0)
    c.run_once(T0 + 15)
    scaled = [e for e in cluster.events if e["kind"] == "Deployment"]
    assert len(scaled) == 1 and scaled[0]["message"].startswith("[dry-run]")  # a repeated plan: one Event
    assert ("Deployment/ml/chat", "action") in c.actuator.reported
    c.actuator.reported[("Pod/ml/chat-gone", "action")] = "PreemptForInference|[dry-run] would evict"
    c.run_once(T0 + 30)
    assert ("Pod/ml/chat-gone", "action") not in c.actuator.reported  # the pod is in no snapshot any more
    assert ("Deployment/ml/chat", "action") in c.actuator.reported  # still listed: still remembered
    assert len([e for e in cluster.events if e["kind"] == "Deployment"]) == 1
    del cluster.deployments[KEY]
    c.run_once(T0 + 45)
    assert ("Deployment/ml/chat", "action") not in c.actuator.reported


# ---- deleted and created again between two ticks ---------------------------------------------------------------------


def with_uid(obj: PolicyObject, uid: str) -> PolicyObject:
    return PolicyObject(obj.namespace, obj.name, obj.policy, obj.error, obj.generation, obj.queries, uid=uid)


def test_a_policy_created_again_between_two_ticks_gets_its_status_written() -> None:
    """Deleted and applied again within one tick interval, the policy is listed at both ticks under its name: only its
    uid says it is a new object, with an empty status that the memo of the old one would never rewrite."""
    c, _, _, policies, status = make()
    policies.objects = [with_uid(policy_object(POLICY), "uid-1")]
    c.run_once(T0)
    assert ("ml", "chat-policy") in status.status
    del status.status[("ml", "chat-policy")]  # kubectl delete + apply between the two ticks
    policies.objects = [with_uid(policy_object(POLICY), "uid-2")]
    c.run_once(T0 + 15)
    assert status.status[("ml", "chat-policy")]["currentReplicas"] == 2
    writes = status.writes
    c.run_once(T0 + 30)
    assert status.writes == writes  # the new object's status is remembered again


def test_an_invalid_policy_created_again_between_two_ticks_gets_its_warning() -> None:
    c, cluster, _, policies, _ = make()
    bad = PolicyObject("ml", "bad-policy", None, error="spec.maxReplicas: must be >= minReplicas", generation=1)
    policies.objects = [with_uid(bad, "uid-1")]
    c.run_once(T0)
    policies.objects = [with_uid(bad, "uid-2")]
    c.run_once(T0 + 15)
    c.run_once(T0 + 30)
    assert [e["reason"] for e in cluster.events] == ["InvalidSpec", "InvalidSpec"]


def test_kube_policy_source_carries_the_uid() -> None:
    from autoscaler.adapters.kubernetes.policies import PolicySet, validate_policy
    from autoscaler.app import KubePolicySource

    obj = {
        "metadata": {"namespace": "ml", "name": "chat-policy", "uid": "abc-123", "generation": 3},
        "spec": {"targetRef": {"name": "chat"}, "minReplicas": 1, "maxReplicas": 4},
    }
    loaded = validate_policy(obj)

    class Loader:
        def load(self) -> PolicySet:
            return PolicySet(valid=(loaded,)) if not hasattr(loaded, "field") else PolicySet(invalid=(loaded,))

    (listed,) = KubePolicySource(Loader()).list_policies()
    assert listed.uid == "abc-123" and listed.generation == 3
