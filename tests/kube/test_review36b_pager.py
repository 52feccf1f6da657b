"""Review of 38a05d4: ``Pager.converted`` (pods and nodes converted page by page in the reader).

No defect was found: these tests pin what was checked -- all or nothing on errors mid-list (the API's and the
conversion's), no double conversion after a restart, the whole-list fallback, ``items()`` as before, and the
reader's stats."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes._api import KubeApiError, Pager
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def pager(page_size: int = 2, max_restarts: int = 1) -> Pager:
    return Pager(
        page_size=page_size, timeout_s=1.0, retries=0, backoff_s=0.0, max_backoff_s=0.0, max_restarts=max_restarts
    )


def lister(
    items: list[dict[str, Any]], fail_at: dict[int, int] | None = None, calls: list[dict[str, Any]] | None = None
):  # type: ignore[no-untyped-def]
    """Pages of ``limit`` items; ``fail_at``: call number (0-based) -> HTTP status raised instead."""
    state = {"n": 0}

    def list_things(**kwargs: Any) -> SimpleNamespace:
        n = state["n"]
        state["n"] += 1
        if calls is not None:
            calls.append(dict(kwargs))
        if fail_at and n in fail_at:
            raise KubeApiError("list things", fail_at[n], "Err", "injected")
        limit = kwargs.get("limit")
        start = int(kwargs.get("_continue") or 0)
        end = len(items) if limit is None else min(len(items), start + limit)
        meta = {"continue": str(end)} if end < len(items) else {}
        return SimpleNamespace(data=json.dumps({"items": items[start:end], "metadata": meta}).encode())

    return list_things


ITEMS = [{"n": i} for i in range(7)]


def test_an_error_mid_list_raises_and_never_returns_the_pages_already_converted() -> None:
    converted: list[int] = []

    def convert(item: dict[str, Any]) -> int:
        converted.append(item["n"])
        return int(item["n"])

    with pytest.raises(KubeApiError) as exc:
        pager().converted("list things", convert, lister(ITEMS, fail_at={2: 500}))
    assert exc.value.status == 500
    assert converted == [0, 1, 2, 3]  # two pages converted, then the error: nothing returned


def test_a_conversion_error_mid_list_propagates_is_not_retried_and_stops_the_paging() -> None:
    calls: list[dict[str, Any]] = []

    def convert(item: dict[str, Any]) -> int:
        if item["n"] == 3:
            raise ValueError("malformed")
        return int(item["n"])

    with pytest.raises(ValueError):
        pager().converted("list things", convert, lister(ITEMS, calls=calls))
    assert len(calls) == 2  # no further page asked for, no restart


def test_a_restart_gives_each_item_once_in_order_and_counts_the_list_once() -> None:
    seen: list[int] = []

    def convert(item: dict[str, Any]) -> int:
        seen.append(item["n"])
        return int(item["n"])

    out, count = pager().converted("list things", convert, lister(ITEMS, fail_at={2: 410}))
    assert (out, count) == (list(range(7)), 7)
    assert seen == [0, 1, 2, 3, *range(7)]  # the first attempt's conversions are thrown away with it


def test_restarts_spent_then_the_whole_list_converted_once() -> None:
    calls: list[dict[str, Any]] = []
    out, count = pager(max_restarts=1).converted(
        "list things", lambda i: i["n"], lister(ITEMS, fail_at={1: 410, 3: 410}, calls=calls)
    )
    assert (out, count) == (list(range(7)), 7)
    assert "limit" not in calls[-1]


def test_items_is_the_list_as_before_across_page_boundaries_and_empty_pages() -> None:
    assert pager(page_size=3).items("list things", lister(ITEMS)) == ITEMS
    assert pager().items("list things", lister([])) == []
    assert pager(page_size=7).items("list things", lister(ITEMS)) == ITEMS
    assert pager().items("list things", lister([{}, {"n": 1}])) == [{}, {"n": 1}]  # a falsy item kept


def test_reader_stats_count_every_pod_and_node_listed_also_through_the_whole_list_fallback(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.continue_ttl_s = -1.0  # every continue token expired: restarts, then one whole list
    apiserver.seed(
        o.node("gpu-0"),
        o.node("cpu-0", 0, product=None),
        *(o.pod(f"p{i}", gpus=1, node_name="gpu-0") for i in range(5)),
        *(o.pod(f"c{i}", gpus=0, node_name="cpu-0") for i in range(4)),
    )
    reader = KubeClusterReader(api_client, ReaderConfig(page_size=2), sleep=lambda s: None)
    snap = reader.snapshot(NOW)
    assert sorted(p.name for p in snap.pods) == [f"p{i}" for i in range(5)]
    objects = reader.last_stats.objects
    assert (objects["pods"], objects["gpu_pods"], objects["nodes"], objects["gpu_nodes"]) == (9, 5, 2, 1)


def test_volcano_gang_minimum_still_filled_after_paged_conversion(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``_with_podgroup_min_available`` runs on the converted pods, after every list, as before."""
    pods = [
        o.pod(f"w{i}", gpus=1, node_name="gpu-0", annotations={"scheduling.k8s.io/group-name": "g1"}) for i in range(3)
    ]
    apiserver.seed(o.podgroup_crd(), o.podgroup("g1", "default", min_member=2), o.node("gpu-0"), *pods)
    reader = KubeClusterReader(api_client, ReaderConfig(page_size=1), sleep=lambda s: None)
    snap = reader.snapshot(NOW)
    assert {(p.gang, p.gang_min_available) for p in snap.pods} == {("volcano/default/g1", 2)}
