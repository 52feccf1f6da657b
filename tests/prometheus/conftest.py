"""Fixtures that run a real Prometheus (Debian's ``prometheus`` package, 2.42) on 127.0.0.1.

History is backfilled with ``promtool`` before the server starts (a running server only loads new blocks about a
minute later). Without the binaries the integration tests are skipped, except in CI (``CI`` set), where that is a
failure: the CI script must install the package (``apt-get install -y --no-install-recommends prometheus``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from genai_dataset import GenaiDataset
from prom_helpers import genai_settings
from promserver import EMPTY_CONFIG, PrometheusServer, backfill, binaries, in_ci

from autoscaler.adapters.prometheus import PrometheusMetricsSource

MISSING = (
    "the prometheus and promtool binaries are not installed; install Debian's package: "
    "apt-get install -y --no-install-recommends prometheus"
)


@pytest.fixture(scope="session")
def prom_binaries() -> tuple[str, str]:
    found = binaries()
    if found is None:
        if in_ci():
            pytest.fail(f"CI is set but {MISSING}")
        pytest.skip(MISSING)
    return found


@pytest.fixture(scope="session")
def genai() -> GenaiDataset:
    return GenaiDataset()


@pytest.fixture(scope="session")
def genai_blocks(prom_binaries: tuple[str, str], genai: GenaiDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pristine backfilled data dir; servers get copies (two processes cannot share one, it is locked)."""
    root = tmp_path_factory.mktemp("genai")
    openmetrics = root / "genai.om"
    genai.write_openmetrics(openmetrics)
    blocks = root / "blocks"
    backfill(prom_binaries[1], openmetrics, blocks)
    openmetrics.unlink()
    return blocks


@pytest.fixture
def start_prometheus(
    prom_binaries: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., PrometheusServer]]:
    """Start a Prometheus from a copy of ``blocks`` (or empty) with ``config``; stopped after the test."""
    servers: list[PrometheusServer] = []

    def start(blocks: Path | None = None, config: str = EMPTY_CONFIG) -> PrometheusServer:
        root = tmp_path_factory.mktemp("prom")
        data = root / "data"
        if blocks is not None:
            shutil.copytree(blocks, data)
        server = PrometheusServer(prom_binaries[0], data, config).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def genai_prometheus(
    prom_binaries: tuple[str, str], genai_blocks: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """One server with the GenAI history, shared by the read-only tests of the session."""
    root = tmp_path_factory.mktemp("genai-prom")
    shutil.copytree(genai_blocks, root / "data")
    server = PrometheusServer(prom_binaries[0], root / "data").start()
    yield server
    server.stop()


@pytest.fixture
def genai_source(genai_prometheus: PrometheusServer) -> Iterator[PrometheusMetricsSource]:
    source = PrometheusMetricsSource(genai_settings(genai_prometheus.url))
    yield source
    source.close()
