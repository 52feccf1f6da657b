"""Fixtures for the alert rules, runbooks and dashboard tests: the promtool and prometheus binaries."""

from __future__ import annotations

import pytest

from tests.observability.common import require_binary


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return require_binary("prometheus")
