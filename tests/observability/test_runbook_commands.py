"""Shell commands in the runbooks and deploy/ docs that ask the right question."""

from __future__ import annotations

import re

from tests.observability.common import ROOT

DOCS = sorted((ROOT / "deploy").rglob("*.md"))


def test_can_i_names_subresources_with_the_subresource_flag() -> None:
    """``kubectl auth can-i VERB deployments/scale`` asks about the Deployment *named* "scale" (kubectl reads
    RESOURCE/NAME), not about the scale subresource the controller writes: its answer says nothing about the
    controller's permissions. The subresource needs ``--subresource=scale``."""
    assert DOCS
    wrong = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in DOCS
        for line in path.read_text().splitlines()
        if re.search(r"kubectl auth can-i \S+ [\w.-]+/\S+", line)
    ]
    assert not wrong, wrong
    actions = (ROOT / "deploy" / "runbooks" / "GPUAutoscalerActionsFailing.md").read_text()
    assert "kubectl auth can-i patch deployments --subresource=scale" in actions
    assert "kubectl auth can-i create pods --subresource=eviction" in actions
