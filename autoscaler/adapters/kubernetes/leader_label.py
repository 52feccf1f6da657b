"""The leader's label on its own pod, so that a Service selecting the label reaches the leader alone (the
scheduler-extender overlay's ``gpu-autoscaler-extender``: the standby's cluster view lags the leader's, and the
leader's rebalancer is the one that knows which nodes it is emptying).

The label is ``gpuautoscaler.dev/leader: <Lease name>``: replicas electing on another Lease (a dry-run install in the
same namespace elects on ``<name>-dry-run``) carry another value, so one group's leader never removes the other's.

Who writes what, and why a late write cannot take the label from the current leader:

- the new leader labels its own pod first, then removes the label from every other pod of its namespace carrying it
  (a crashed or partitioned former leader's): two endpoints for a moment rather than none;
- both writes go out only while the write guard says yes (``LeaderElector.may_write``: the Lease held, and time for
  the request to land before a follower could take the Lease over), as every acting write of the controller does: a
  former leader's late sweep cannot land after its successor labelled itself;
- a replica that stops leading removes the label from its own pod only, unguarded: no other replica's label is
  touched, so it can never remove its successor's.

Every change is a JSON merge patch of ``metadata.labels`` (null removes the key; a patch that changes nothing writes
nothing). Writes are never retried here: the caller tries again on a later tick.
"""

from __future__ import annotations

import logging
from typing import Any

from autoscaler.adapters.kubernetes._api import JSON, MERGE_PATCH, KubeApiError, call_json, may_write
from autoscaler.policy import LABEL_VALUE_MAX
from autoscaler.ports import WriteGuard

log = logging.getLogger(__name__)

LEADER_LABEL = "gpuautoscaler.dev/leader"


class KubernetesLeaderPodLabel:
    """Labels pod ``namespace/pod_name`` (this replica's) as the leader of Lease ``lease_name``, or unlabels it."""

    def __init__(
        self, api_client: Any, namespace: str, pod_name: str, lease_name: str, request_timeout_s: float = 5.0
    ) -> None:
        from kubernetes import client

        if len(lease_name) > LABEL_VALUE_MAX:
            raise ValueError(
                f"Lease name {lease_name!r} is longer than a label value may be ({LABEL_VALUE_MAX} characters)"
            )
        self._core = client.CoreV1Api(api_client)
        self.namespace, self.pod_name, self.value = namespace, pod_name, lease_name
        self._timeout = request_timeout_s

    def mark_leader(self, can_write: WriteGuard) -> None:
        """Label this replica's pod, then take the label off every other pod of the namespace that carries it.
        ``can_write`` is asked before each write (``WriteNotAllowed`` when it says no). Raises ``PortError`` when a
        request fails; a pod gone before its label could be removed needs nothing more."""
        self._patch(self.pod_name, self.value, can_write)
        for name in self._labelled_pods():
            if name == self.pod_name:
                continue
            try:
                self._patch(name, None, can_write)
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
            else:
                log.info("removed %s from pod %s/%s: this replica leads now", LEADER_LABEL, self.namespace, name)

    def unmark(self) -> None:
        """Take the label off this replica's pod only (another pod may be the leader's by now). A pod that is gone
        carries no label."""
        try:
            self._patch(self.pod_name, None, None)
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    def _patch(self, name: str, value: str | None, can_write: WriteGuard | None) -> None:
        pod = f"pod {self.namespace}/{name}"
        what = f"label {pod} {LEADER_LABEL}={value}" if value else f"unlabel {pod} {LEADER_LABEL}"
        may_write(what, can_write)
        body: JSON = {"metadata": {"labels": {LEADER_LABEL: value}}}
        call_json(
            what,
            self._core.patch_namespaced_pod,
            name,
            self.namespace,
            body,
            timeout_s=self._timeout,
            _content_type=MERGE_PATCH,
        )

    def _labelled_pods(self) -> list[str]:
        answer = call_json(
            f"list pods {self.namespace} labelled {LEADER_LABEL}={self.value}",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{LEADER_LABEL}={self.value}",
            timeout_s=self._timeout,
        )
        return [str((pod.get("metadata") or {}).get("name")) for pod in answer.get("items") or []]
