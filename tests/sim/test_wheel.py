"""The package as a user installs it: a wheel built from the repository carries everything `autoscaler simulate`
needs (the default scenario, the packaged traces and their licence notes). Issue 13 found `pip install .` followed by
`autoscaler simulate` failing: the scenario was not package data.

The wheel is installed with ``--no-deps`` into a folder put first on ``PYTHONPATH`` and run from outside the
repository, so the editable install of the development venv cannot supply a missing file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of the tracked files only: a build/ or *.egg-info left in the working tree would otherwise
    # supply files the package configuration forgets (it did, when this test was written).
    source = tmp_path_factory.mktemp("source")
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True, timeout=60)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_carries_the_default_scenario_and_its_traces(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "autoscaler/sim/scenarios/default.yaml" in names
    assert any(n.startswith("autoscaler/data/") and n.endswith(".csv.gz") for n in names)


def test_simulate_runs_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    probe = subprocess.run(
        [sys.executable, "-c", "import autoscaler; print(autoscaler.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert probe.stdout.strip().startswith(str(site)), probe.stdout
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "simulate", "--policies", "hpa,static"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "requests within SLO" in done.stdout
    assert (tmp_path / "out").is_dir()
    helped = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0 and "exit codes" in helped.stdout
