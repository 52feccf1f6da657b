"""Review of the actuator's handling of ``ScaleNodePool.remove_unregistered`` (commit 5b4a9b2).

Each xfail test fails on the current code and says what is wrong and what the right behaviour is; the other tests
pin behaviour checked and found right."""

from __future__ import annotations

from typing import Any

from autoscaler.actuator import Actuator, GuardContext, _contradictions
from autoscaler.core.model import ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster

T0 = 1_800_000_000.0
GIVE_BACK = ScaleNodePool("burst", 1, 2, Reason.BURST_NODE_NOT_REGISTERED, "never registered", remove_unregistered=True)


class ForwardCompatiblePlugin:
    """A provider plug-in written before ``remove_unregistered`` that takes ``**options`` so that newer keywords do
    not break it (``can_write`` and the like), and ignores the ones it does not know: its ``scale`` lowers the size
    and lets the provider delete a node of its own choosing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any]]] = []

    def node_count(self, pool: str) -> int:
        return 2

    def scale(
        self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None, **options: Any
    ) -> None:
        self.calls.append((pool, nodes, options))


def test_a_plugin_taking_only_kwargs_is_not_asked_to_remove_an_unregistered_node() -> None:
    """Fixed. It was wrong: the actuator's safety check for a plug-in that cannot name the Machine to remove is
    ``takes_keyword(scale, "remove_unregistered")``, which is also true of any ``**kwargs`` -- the usual way to write
    a plug-in that keeps working when the port grows keywords. Such a plug-in silently drops the flag and lowers the
    size: the provider removes a node of its own choosing (Random by default), possibly a registered, busy one, while
    the stuck Machine stays. For ``can_write`` (harmless when ignored) the lenient check is right; for a keyword
    whose being ignored deletes a busy node it is not.
    Now a scale-down with ``remove_unregistered`` goes only to a ``scale`` with an explicit ``remove_unregistered``
    parameter (``name in signature.parameters``); otherwise the action fails, nothing called."""
    plugin = ForwardCompatiblePlugin()
    (result,) = Actuator(FakeCluster(), plugin).apply([GIVE_BACK], GuardContext(T0, {}))
    assert plugin.calls == []
    assert result.result == "failed"


def test_a_give_back_and_another_resize_of_the_pool_from_the_same_size_are_a_contradiction() -> None:
    """Checked, right: were the plan ever to carry the give-back and a spare-node give-back (or a scale-up) of the
    same pool from the same size, neither is applied (``_effect`` includes ``remove_unregistered``)."""
    spare = ScaleNodePool("burst", 1, 2, Reason.BURST_SCALE_DOWN, "spare", "burst-a")
    assert set(_contradictions([GIVE_BACK, spare])) == {0, 1}
    assert set(_contradictions([GIVE_BACK, GIVE_BACK])) == {1}


def test_a_give_back_is_held_while_metrics_are_unreadable() -> None:
    """Checked, right: the give-back is a scale-down (``is_destructive``): a Prometheus outage holds it."""
    cluster = FakeCluster()
    cluster.add_pool("burst", 1, gpu_product="A100")
    cluster.add_unregistered("burst", 1)
    (result,) = Actuator(cluster, cluster).apply([GIVE_BACK], GuardContext(T0, {}, {}, "prometheus down"))
    assert result.result != "applied"
    assert cluster.node_count("burst") == 2
