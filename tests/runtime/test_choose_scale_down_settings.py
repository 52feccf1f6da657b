"""``capacity.choose_scale_down_replicas`` reaches the core's ``CapacityConfig`` from the controller's environment
and from a scenario's ``capacity.chooseScaleDownReplicas``; off by default in both."""

from __future__ import annotations

import pytest

from autoscaler.settings import load_settings
from autoscaler.sim.scenario import SCENARIO_DIR, load_scenario
from autoscaler.sim.training import capacity_config


def test_the_controller_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_CAPACITY__ENABLED", "true")
    assert load_settings().capacity.to_config().choose_scale_down_replicas is False
    monkeypatch.setenv("AUTOSCALER_CAPACITY__CHOOSE_SCALE_DOWN_REPLICAS", "true")
    settings = load_settings()
    assert settings.capacity.choose_scale_down_replicas is True
    assert settings.capacity.to_config().choose_scale_down_replicas is True


def test_the_scenario_key() -> None:
    scenario, _ = load_scenario(SCENARIO_DIR / "mixed-training.yaml")
    assert capacity_config(scenario).choose_scale_down_replicas is False
    on = scenario.model_copy(
        update={"capacity": type(scenario.capacity).model_validate({"chooseScaleDownReplicas": True})}
    )
    assert capacity_config(on).choose_scale_down_replicas is True
