"""A failed scale-down takes its delete-machine mark back; when the Machine was deleted meanwhile (a person, a
MachineHealthCheck remediation), the mark went with it. Before: the take-back's PATCH got 404 and the mark was
reported left behind (``unmark_failed``), a mark that does not exist reported as one that could delete a busy node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_nodepool_marks import MD, NS, deployment, error, pools, running, seed, size


def test_a_machine_deleted_before_the_take_back_is_not_reported_as_a_mark_left(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(apiserver, deployment(), *running())
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/scale"):
            # the size write is refused, and the marked Machine deleted before the take-back
            apiserver.delete_object(MD, "Machine", "burst-b", NS)
            return error(422)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    left: list[tuple[str, str]] = []
    with pytest.raises(Exception, match="422"):
        pools(api_client, on_mark_left=lambda name, why: left.append((name, why))).scale(
            "burst", 2, expected=3, remove_node="node-b"
        )
    assert left == []
    assert size(apiserver) == 3
