"""A list whose continue token keeps expiring: the pages of a very large cluster take longer than the API server
keeps the list's revision, so every paged restart expires the same way. The reader held every tick ("410 Expired"
after its restarts); it now lists in one request once the restarts are spent, as client-go's pager does
(``FullListIfExpired``), and still never returns a partial list."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes._api import KubeApiError, Pager
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def test_pages_that_keep_expiring_end_in_one_whole_list(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.continue_ttl_s = -1.0  # every continue token is expired by the time it is used
    apiserver.seed(o.node("gpu-0"), *(o.pod(f"p{i:02d}", gpus=1, node_name="gpu-0") for i in range(7)))
    reader = KubeClusterReader(api_client, ReaderConfig(page_size=3), sleep=lambda s: None)
    snap = reader.snapshot(NOW)
    assert sorted(p.name for p in snap.pods) == [f"p{i:02d}" for i in range(7)]


def test_a_failing_whole_list_still_fails_and_never_returns_part_of_it() -> None:
    calls: list[dict[str, object]] = []

    def list_things(**kwargs: object) -> SimpleNamespace:
        """A generated client method as ``call_json`` calls it (``_preload_content=False``: the raw body)."""
        calls.append(kwargs)
        if "_continue" in kwargs:
            raise KubeApiError("list things", 410, "Expired", "too old")
        if "limit" not in kwargs:  # the whole list
            raise KubeApiError("list things", 500, "InternalError", "etcd is down")
        return SimpleNamespace(data=json.dumps({"items": [{"n": 1}], "metadata": {"continue": "token"}}).encode())

    pager = Pager(page_size=1, timeout_s=1.0, retries=0, backoff_s=0.0, max_backoff_s=0.0, max_restarts=2)
    with pytest.raises(KubeApiError) as exc:
        pager.items("list things", list_things)
    assert exc.value.status == 500
    # three paged attempts (the first and two restarts), each expiring at its second page, then one whole list
    assert sum(1 for c in calls if "limit" not in c) == 1
    assert sum(1 for c in calls if "_continue" in c) == 3
