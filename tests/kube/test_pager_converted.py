"""``Pager.converted``: a list converted page by page (the reader's pods and nodes), so that a large cluster's raw
JSON is never held whole (its peak memory is measured in ``benchmarks/bench_kube.py``) -- and still all or nothing:
a restart after an expired continue token starts the conversion again, and the whole-list fallback is converted
too."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from autoscaler.adapters.kubernetes._api import KubeApiError, Pager


def pager(page_size: int = 2) -> Pager:
    return Pager(page_size=page_size, timeout_s=1.0, retries=0, backoff_s=0.0, max_backoff_s=0.0, max_restarts=1)


def lister(items: list[dict[str, Any]], expire_first: int = 0, expire_always: bool = False):  # type: ignore[no-untyped-def]
    """A generated client method as ``call_json`` calls it: pages of ``limit`` items; the first ``expire_first``
    continued pages (or all, ``expire_always``) answer 410."""
    state = {"expired": 0}

    def list_things(**kwargs: Any) -> SimpleNamespace:
        limit = kwargs.get("limit")
        start = int(kwargs.get("_continue") or 0)
        if "_continue" in kwargs and (expire_always or state["expired"] < expire_first):
            state["expired"] += 1
            raise KubeApiError("list things", 410, "Expired", "too old")
        end = len(items) if limit is None else min(len(items), start + limit)
        meta = {"continue": str(end)} if end < len(items) else {}
        return SimpleNamespace(data=json.dumps({"items": items[start:end], "metadata": meta}).encode())

    return list_things


ITEMS = [{"n": i} for i in range(7)]


def odd(item: dict[str, Any]) -> int | None:
    return item["n"] if item["n"] % 2 else None


def test_every_item_is_converted_and_those_mapped_to_none_left_out_but_counted() -> None:
    assert pager().converted("list things", odd, lister(ITEMS)) == ([1, 3, 5], 7)


def test_a_restart_after_an_expired_token_converts_from_scratch_never_twice() -> None:
    assert pager().converted("list things", odd, lister(ITEMS, expire_first=1)) == ([1, 3, 5], 7)


def test_the_whole_list_fallback_is_converted_too() -> None:
    assert pager().converted("list things", odd, lister(ITEMS, expire_always=True)) == ([1, 3, 5], 7)


def test_items_is_the_list_as_is() -> None:
    assert pager().items("list things", lister(ITEMS)) == ITEMS
