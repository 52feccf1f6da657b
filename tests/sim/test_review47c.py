"""Review 47c: the simulator's "scale-downs undone within a cold start" (commit 11750cb).

A scale-down is undone within a cold start when the service's replicas rise back above the level they fell to no more
than a cold start later. Both moves are decisions at step boundaries, so a rise ``k`` steps after the fall came
``k x stepSeconds`` later: within a cold start of ``c`` seconds only while ``k <= floor(c / step)``. The engine
rounded the cold start *up* to steps, so a 100 s cold start at 15 s steps counted a rise 105 s after the fall (and a
10 s cold start any rise one step, 15 s, later) as undone within it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from autoscaler.sim import engine
from autoscaler.sim.run import run_scenario
from autoscaler.sim.scenario import default_scenario_path, parse_scenario


def test_a_cold_start_not_a_multiple_of_the_step_counts_only_rises_within_it(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(yaml.safe_load(default_scenario_path().read_text(encoding="utf-8")))
    data["durationSeconds"] = 2 * 3600
    chat = data["services"][0]
    others = []
    for name, cold in (("chat-100", 100), ("chat-10", 10)):
        other = copy.deepcopy(chat)
        other["metadata"]["name"] = name
        other["spec"]["targetRef"]["name"] = name
        other["spec"]["coldStartSeconds"] = cold
        others.append(other)
    data["services"] = [chat, *others]
    seen: list[int] = []
    counted = engine.scale_downs_undone

    def spy(spec: np.ndarray, within_steps: int) -> tuple[int, int]:
        seen.append(within_steps)
        return counted(spec, within_steps)

    monkeypatch.setattr(engine, "scale_downs_undone", spy)
    run_scenario(parse_scenario(data), default_scenario_path().parent, ("reactive",))
    # 90 s: 6 steps of 15 s; 100 s: 6 (the 7th step is 105 s after the fall); 10 s: none fits in one step
    assert seen == [6, 6, 0]
