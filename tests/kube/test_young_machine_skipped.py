"""A give-back of a pool's node that never registered, when every Machine without a Node is younger than the minimum
age (the stuck one was replaced by a MachineHealthCheck, or a scale-up created it): the premise of the give-back is
gone, like a Deployment's replicas changed since the tick read them. Until stop 42 the actuator reported it
``failed`` -- an error counted (GPUAutoscalerActionsFailing while the replacement boots) and the pool's give-backs
held back for ``give_back_retry_s``, its idle registered nodes too. Now ``skipped``: nothing written, no error, no
back-off; the next tick decides again. Through the REST-faithful fake API server."""

from __future__ import annotations

from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext, forget_unapplied
from autoscaler.adapters.kubernetes.nodepool import NoUnregisteredMachineError, UnregisteredMachineBootingError
from autoscaler.core.model import CapacityState, ControllerState, ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_nodepool_marks import NOW, deployment, machine, marked, patched, pools, seed, size
from tests.kube.test_review38_min_age import created, registered


def _give_back() -> ScaleNodePool:
    return ScaleNodePool("burst", 1, 2, Reason.BURST_NODE_NOT_REGISTERED, "never registered", remove_unregistered=True,
                         unregistered_min_age_s=900.0)  # fmt: skip


def _apply(api_client: client.ApiClient) -> tuple[str, ControllerState]:
    errors: list[str] = []
    actuator = Actuator(FakeCluster(), pools(api_client), on_error=errors.append)
    (result,) = actuator.apply([_give_back()], GuardContext(NOW, {}))
    before = ControllerState(capacity=CapacityState())
    state = forget_unapplied(before, before, [result], NOW)
    assert result.result != "skipped" or not errors, errors
    return result.result, state


def test_a_young_replacement_is_skipped_not_failed(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    seed(apiserver, deployment(2), registered("burst-a", "node-a"), created(machine("burst-repl", None), 300.0))
    result, state = _apply(api_client)
    assert result == "skipped"
    assert state.capacity.give_back_failed_at == {}  # no back-off: the pool's other give-backs are not held
    assert size(apiserver) == 2 and marked(apiserver) == set() and not patched(apiserver)


def test_no_machine_without_a_node_at_all_still_fails(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """Pinned: when no Machine lacks a Node (the count the core saw is wrong, or a person's), the give-back fails as
    before: retried after the back-off, the error counted."""
    seed(apiserver, deployment(2), registered("burst-a", "node-a"), registered("burst-b", "node-b"))
    result, state = _apply(api_client)
    assert result == "failed"
    assert state.capacity.give_back_failed_at == {"burst": NOW}


def test_the_booting_error_is_still_a_no_unregistered_machine_error() -> None:
    """Callers that catch the wider error (the provider's own retries) keep catching it."""
    assert issubclass(UnregisteredMachineBootingError, NoUnregisteredMachineError)
