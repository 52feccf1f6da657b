"""The package as a user installs it: a wheel built from the repository carries everything `autoscaler simulate`
needs (the default scenario, the packaged traces and their licence notes). Issue 13 found `pip install .` followed by
`autoscaler simulate` failing: the scenario was not package data.

The wheel is installed into a new venv with the dependencies it declares (pip resolves them as for a user) and run
from outside the repository, so neither the editable install nor the development venv's packages can supply a
missing file or an undeclared dependency.
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


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with nothing but the wheel and the dependencies it declares, resolved by pip as a user's install
    would (from pip's cache when set-up filled it; about a minute and 730 MB)."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def _run(venv: Path, cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(
        [str(venv / "bin" / "autoscaler"), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )


def test_the_wheel_works_in_a_clean_venv(clean_venv: Path, tmp_path: Path) -> None:
    # run from outside the repository: nothing of the development tree can supply a missing file or dependency
    probe = subprocess.run(
        [str(clean_venv / "bin" / "python"), "-c", "import autoscaler, forecast; print(autoscaler.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    )
    assert probe.stdout.strip().startswith(str(clean_venv)), probe.stdout
    simulated = _run(clean_venv, tmp_path, "simulate", "--policies", "hpa,static", "--no-progress")
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    assert "requests within SLO" in simulated.stdout
    assert (tmp_path / "out").is_dir()
    # the "autoscaler forecast": forecasting from the command line is `backtest`
    backtested = _run(
        clean_venv, tmp_path, "backtest", "azure-llm-2023-conv", "--models", "last_value,phase_naive", "--origins",
        "5", "--horizon", "300",
    )
    assert backtested.returncode == 0, backtested.stderr[-3000:]
    assert "phase_naive" in backtested.stdout and "selected:" in backtested.stdout
    helped = _run(clean_venv, tmp_path, "run", "--help", timeout=60)
    assert helped.returncode == 0 and "exit codes" in helped.stdout
