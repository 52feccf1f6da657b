"""The rebalancer's move ledger (``autoscaler.ports.MoveLedger``) as a ConfigMap in the controller's own namespace.

The hourly bound on rebalance moves is counted from the evictions of the last hour. Kept only in memory, it would be
forgotten by every restart and every change of leader, and a new leader could spend a second hour's budget within
the same hour (two leaders in one hour: twice the disruption the bound promises). The ConfigMap survives both. It is
written with the ``resourceVersion`` of this process's last read or write, so a former leader's late write cannot
overwrite what the new one recorded: it gets 409 and changes nothing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from autoscaler.adapters.kubernetes._api import JSON, KubeApiError, call_json
from autoscaler.ports import PortError

DATA_KEY = "moveTimes"  # a JSON list of Unix seconds, one per evicted pod
TARGETS_KEY = "movedFor"  # a JSON list of [target, Unix seconds of a pass that moved for it], the latest few each


class KubernetesMoveLedger:
    def __init__(self, api_client: Any, namespace: str, name: str, request_timeout_s: float = 5.0) -> None:
        from kubernetes import client

        self._api = client.CoreV1Api(api_client)
        self.namespace, self.name = namespace, name
        self._timeout = request_timeout_s
        self._resource_version: str | None = None  # of this process's last read or write; None: not there yet
        self._targets: tuple[tuple[str, float], ...] = ()  # as the last read found them

    @property
    def _what(self) -> str:
        return f"move ledger configmap {self.namespace}/{self.name}"

    def read(self) -> tuple[float, ...]:
        try:
            body = call_json(
                f"{self._what}: read", self._api.read_namespaced_config_map, self.name, self.namespace,
                timeout_s=self._timeout,
            )
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            self._resource_version = None
            self._targets = ()
            return ()
        data = body.get("data") or {}
        move_times = parse_move_times(data.get(DATA_KEY), self._what)
        self._targets = parse_targets(data.get(TARGETS_KEY), self._what)
        self._resource_version = (body.get("metadata") or {}).get("resourceVersion")
        return move_times

    def targets(self) -> tuple[tuple[str, float], ...]:
        return self._targets

    def write(self, move_times: tuple[float, ...], targets: tuple[tuple[str, float], ...] = ()) -> None:
        data = {
            DATA_KEY: json.dumps([float(t) for t in move_times]),
            TARGETS_KEY: json.dumps([[str(target), float(t)] for target, t in targets]),
        }
        metadata: JSON = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/name": "gpu-autoscaler", "app.kubernetes.io/component": "rebalancer"},
            "annotations": {
                "gpuautoscaler.dev/description": (
                    "Unix seconds of the rebalancer's evictions of the last hour (moveTimes; its hourly bound "
                    "counts them across restarts and changes of leader) and the targets it moved for (movedFor: "
                    "each waits retryAfter before it is moved for again). Deleting it resets both."
                )
            },
        }
        body: JSON = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
        if self._resource_version is None:
            # Not there when last read: create. Somebody else creating it first answers 409, as a stale update does.
            written = call_json(
                f"{self._what}: create", self._api.create_namespaced_config_map, self.namespace, body,
                timeout_s=self._timeout,
            )
        else:
            metadata["resourceVersion"] = self._resource_version
            written = call_json(
                f"{self._what}: update", self._api.replace_namespaced_config_map, self.name, self.namespace, body,
                timeout_s=self._timeout,
            )
        self._resource_version = (written.get("metadata") or {}).get("resourceVersion")


def parse_move_times(text: object, what: str) -> tuple[float, ...]:
    """The ledger's ``moveTimes`` value; PortError naming the problem when it is not a JSON list of finite numbers
    (an edited ConfigMap: the rebalancer then moves nothing until it is fixed or deleted)."""
    if text is None:
        return ()
    values = _json(text, DATA_KEY, what)
    if not isinstance(values, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        raise PortError(f"{what}: data.{DATA_KEY} must be a list of Unix seconds; delete the ConfigMap to reset")
    return tuple(sorted(float(v) for v in values))


def parse_targets(text: object, what: str) -> tuple[tuple[str, float], ...]:
    """The ledger's ``movedFor`` value (absent: none); PortError naming the problem when it is not a JSON list of
    [target, Unix seconds] pairs."""
    if text is None:
        return ()
    values = _json(text, TARGETS_KEY, what)
    if not isinstance(values, list) or not all(
        isinstance(v, list)
        and len(v) == 2
        and isinstance(v[0], str)
        and isinstance(v[1], (int, float))
        and not isinstance(v[1], bool)
        and math.isfinite(v[1])
        for v in values
    ):
        raise PortError(
            f"{what}: data.{TARGETS_KEY} must be a list of [target, Unix seconds]; delete the ConfigMap to reset"
        )
    return tuple((str(v[0]), float(v[1])) for v in values)


def _json(text: object, key: str, what: str) -> object:
    try:
        return json.loads(str(text))
    except ValueError as exc:
        raise PortError(f"{what}: data.{key} is not JSON ({exc}); delete the ConfigMap to reset") from exc
