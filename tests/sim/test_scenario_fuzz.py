"""Fuzzing `autoscaler simulate`'s input (issue 17, defects 5 and 6): a scenario file from somebody else gives a
clear error (exit code 2, the field or file named, never a traceback) or a run, never a hang, and never writes
outside the output folder.

A seeded mutator (no hypothesis dependency) derives a few hundred variants from the packaged scenario: missing
keys, values of the wrong type, extreme numbers, path-traversal names, odd files and odd traces. Every variant goes
through the loader and validation in-process (and, when it touches a trace, through the trace loading and run
sizing of ``build_services``); a sample, with the traversal names and the odd files, runs the real command as a
subprocess in a scratch folder whose every file is snapshotted before and after.
"""

from __future__ import annotations

import copy
import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import MAX_SCENARIO_BYTES, ScenarioError, default_scenario_path, load_scenario
from autoscaler.traces import TraceFormatError

SEED = 17
REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = yaml.safe_load(default_scenario_path().read_text(encoding="utf-8"))

WRONG_TYPES: tuple[Any, ...] = ("text", 7, 2.5, True, False, [], {}, None, [1, "a"], {"k": 1})
EXTREMES: tuple[Any, ...] = (
    0, -1, 1e-9, 1e308, -1e308, math.nan, math.inf, -math.inf, 10**30, 2**63, "1.0e400", "nan", True,
)
BAD_NAMES = (
    "../x", "../../evil", "../../../evil", "..", ".", "a/b", "/abs/evil", "~/x", "..\\x", ".hidden", "-rf", ":x",
    "", " ", "x" * 300, "a\x00b", "new\nline",
)
GOOD_NAMES = ("ok-name", "v1.2_final", "builtin:servegen-m-large-cold90")


@dataclass
class Variant:
    label: str
    data: Any = None  # written as YAML, unless ``raw`` is given
    raw: bytes | None = None
    scenario_is_dir: bool = False  # the scenario path is a directory
    loads_traces: bool = False  # also run build_services (reads the traces, sizes the run)
    outcome: str = ""
    message: str = field(default="", repr=False)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from _paths(item, (*prefix, index))


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _set(path: tuple[Any, ...], value: Any, base: Any = None) -> Any:
    data = copy.deepcopy(BASE if base is None else base)
    _get(data, path[:-1])[path[-1]] = value
    return data


def _delete(path: tuple[Any, ...]) -> Any:
    data = copy.deepcopy(BASE)
    del _get(data, path[:-1])[path[-1]]
    return data


def _with_trace(trace: str, **simulation: Any) -> dict[str, Any]:
    data = _set(("services", 0, "simulation", "trace"), trace)
    data["services"][0]["simulation"].update(simulation)
    return data


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in path)


def make_traces(folder: Path) -> dict[str, Path]:
    """Trace files good and bad, for the trace variants."""
    folder.mkdir()
    traces = {
        "good": "timestamp,rate\n" + "".join(f"{i * 60},{5 + i % 7}\n" for i in range(200)),
        "empty": "",
        "header-only": "timestamp,rate\n",
        "two-rows-a-gigasecond-apart": "timestamp,rate\n0,1\n1000000000,1\n",  # 16.7 M bins of 60 s
        "log-spanning-300-years": "timestamp\n0\n10000000000\n",  # a request log: binned by span, not rows
        "huge-rates": "timestamp,rate\n0,1e300\n60,1e300\n120,1e300\n",
        "nan-rate": "timestamp,rate\n0,nan\n60,1\n",
    }
    paths = {name: folder / f"{name}.csv" for name in traces}
    for name, text in traces.items():
        paths[name].write_text(text, encoding="utf-8")
    paths["latin1"] = folder / "latin1.csv"
    paths["latin1"].write_bytes("timestamp,rate\n0,1\n60,caf\xe9\n".encode("latin-1"))
    paths["binary"] = folder / "binary.csv"
    paths["binary"].write_bytes(bytes(random.Random(SEED).randrange(256) for _ in range(4096)))
    paths["bad-gzip"] = folder / "bad.csv.gz"
    paths["bad-gzip"].write_bytes(b"\x1f\x8b" + b"not really gzip")
    paths["directory"] = folder / "a-directory"
    paths["directory"].mkdir()
    if hasattr(os, "mkfifo"):
        paths["fifo"] = folder / "fifo.csv"
        os.mkfifo(paths["fifo"])  # opening it for reading would block forever
    return paths


def make_variants(traces: dict[str, Path]) -> list[Variant]:
    """The variants, in a fixed order for SEED; ``traces`` from :func:`make_traces` (its folder's parent is the
    scratch folder, where an absolute name points)."""
    rng = random.Random(SEED)
    variants = [Variant("unchanged", BASE)]
    all_paths = list(_paths(BASE))
    for path in all_paths:
        if isinstance(path[-1], str):
            variants.append(Variant(f"missing {_dotted(path)}", _delete(path)))
    for path in all_paths:
        for value in rng.sample(WRONG_TYPES, 2):
            variants.append(Variant(f"{_dotted(path)} = {value!r}", _set(path, value)))
    numeric = [p for p in all_paths if isinstance(_get(BASE, p), int | float) and not isinstance(_get(BASE, p), bool)]
    for path in numeric:
        for value in EXTREMES:
            variants.append(Variant(f"{_dotted(path)} = {value!r}", _set(path, value)))
    for name in (*BAD_NAMES, *GOOD_NAMES):
        variants.append(Variant(f"name = {name!r}", _set(("name",), name)))
    inside = traces["good"].parent.parent / "abs" / "evil"  # an absolute name, but under the test's folder
    variants.append(Variant("name = an absolute path", _set(("name",), str(inside))))
    # Whole-file oddities.
    text = yaml.safe_dump(BASE)
    variants += [
        Variant("empty file", raw=b""),
        Variant("only a comment", raw=b"# nothing here\n"),
        Variant("not UTF-8", raw=text.replace("default-servegen-chat", "caf\xe9").encode("latin-1")),
        Variant("UTF-16", raw=text.encode("utf-16")),
        Variant("binary", raw=bytes(rng.randrange(256) for _ in range(2048))),
        Variant("NUL bytes", raw=b"name: a\x00b\n"),
        Variant("a YAML list", raw=b"- name: x\n- stepSeconds: 15\n"),
        Variant("a YAML scalar", raw=b"42\n"),
        Variant("a YAML string", raw=b"just some words\n"),
        Variant("YAML syntax error", raw=b"name: x\nnodePools: [\n  {name: a\n"),
        Variant("deeply nested list", raw=b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n"),
        Variant("deeply nested mapping", raw=b"a:\n" + b"".join(b"  " * i + b"a:\n" for i in range(1, 400))),
        Variant("duplicate keys", raw=text.encode() + b"stepSeconds: 1\n"),
        Variant("a merge key", raw=_without("nodePools") + b"nodePools:\n  - &pool {name: a, nodes: 1}\n"
                b"  - {<<: *pool, name: b}\n"),
        Variant("a python tag", raw=b"name: !!python/object/apply:os.system ['echo hi']\n"),
        Variant("an unhashable key", raw=b"? [a, b]\n: 1\n"),
        Variant("a recursive alias in nodePools", raw=_without("nodePools") + b"nodePools: &p [*p]\n"),
        Variant("a recursive alias in modelParams", raw=_without("forecasting")
                + b"forecasting:\n  model: phase_naive\n  modelParams: &m {self: *m}\n"),
        Variant("a billion laughs in modelParams", raw=_without("forecasting")
                + b"forecasting:\n  model: phase_naive\n  modelParams:\n" + _laughs("    ")),
        Variant("a billion laughs in services", raw=_without("services") + b"laughs:\n" + _laughs("  ")
                + b"services: *l8\n"),
        Variant("larger than the limit", raw=text.encode() + b"#" * (MAX_SCENARIO_BYTES + 1)),
        Variant("the scenario path is a directory", scenario_is_dir=True),
        Variant("a YAML date as stepSeconds", raw=text.replace("stepSeconds: 15", "stepSeconds: 2024-01-01").encode()),
        Variant("binary YAML value as name", raw=text.replace(
            "name: default-servegen-chat", "name: !!binary aGVsbG8=").encode()),
    ]
    # Sizes.
    variants += [
        Variant("a million and one steps", _set(("durationSeconds",), 1_000_001, _set(("stepSeconds",), 1))),
        Variant("stepSeconds 1e-9", _set(("stepSeconds",), 1e-9)),
        Variant("stepSeconds true", _set(("stepSeconds",), True)),
        Variant("1001 services", _set(("services",), [BASE["services"][0]] * 1001)),
        Variant("too many service-steps", _set(
            ("services",),
            [_set(("metadata", "name"), f"s{i}", _set(("spec", "targetRef", "name"), f"s{i}", BASE["services"][0]))
             for i in range(300)],
            _set(("durationSeconds",), 7 * 86400),
        )),
        Variant("too many replica-steps", _set(("services", 0, "spec", "maxReplicas"), 10_000, _set(
            ("nodePools", 0, "nodes"), 10_000, BASE | {"stepSeconds": 1, "durationSeconds": 2 * 86400}))),
        Variant("infinite throughput", _set(("services", 0, "simulation", "throughputPerReplica"), math.inf)),
        Variant("a million GPUs", _set(("nodePools", 0, "nodes"), 1_000_000)),
        Variant("a forecast of a million points",
                BASE | {"forecasting": BASE["forecasting"] | {"resolutionSeconds": 1, "horizonSeconds": 1_000_000}}),
        Variant("modelParams of the wrong type", _set(("forecasting", "modelParams"), {"period_s": "often"})),
        Variant("modelParams bool as a number", _set(("forecasting", "modelParams"), {"residual_window": True})),
        Variant("modelParams NaN", _set(("forecasting", "modelParams"), {"min_share": math.nan})),
        Variant("modelParams unknown", _set(("forecasting", "modelParams"), {"no_such_parameter": 1})),
        Variant("modelParams reversion 0", _set(("forecasting", "modelParams"), {"reversion_periods": 0})),
        Variant("modelParams reversion bool", _set(("forecasting", "modelParams"), {"reversion_periods": True})),
        Variant("modelParams reversion on", _set(("forecasting", "modelParams"), {"reversion_periods": 6})),
        Variant("modelParams reversion off", _set(("forecasting", "modelParams"), {"reversion_periods": None})),
        Variant("modelParams valid", _set(("forecasting", "modelParams"), {"period_s": 600, "min_share": 0.1})),
    ]
    # Traces.
    for name, path in traces.items():
        variants.append(Variant(f"trace {name}", _with_trace(str(path)), loads_traces=True))
    variants += [
        Variant("trace missing", _with_trace(str(traces["good"].parent / "missing.csv")), loads_traces=True),
        Variant("trace NUL in path", _with_trace("a\x00b.csv"), loads_traces=True),
        Variant("trace name too long", _with_trace("x" * 5000), loads_traces=True),
        Variant("trace empty string", _with_trace(""), loads_traces=True),
        Variant("builtin unknown", _with_trace("builtin:nope"), loads_traces=True),
        Variant("builtin traversal", _with_trace("builtin:../../etc/passwd"), loads_traces=True),
        Variant("builtin absolute", _with_trace("builtin:/etc/passwd"), loads_traces=True),
        Variant("builtin glob", _with_trace("builtin:*"), loads_traces=True),
        Variant("good trace at 1 s bins and steps", _with_trace(str(traces["good"]), binSeconds=1)
                | {"stepSeconds": 1}, loads_traces=True),
        Variant("huge rates scaled", _with_trace(str(traces["huge-rates"]), traceScale=1e6), loads_traces=True),
        Variant("duration longer than the trace", _with_trace(str(traces["good"])) | {"durationSeconds": 86400},
                loads_traces=True),
    ]
    return variants


def _without(key: str) -> bytes:
    return yaml.safe_dump({k: v for k, v in BASE.items() if k != key}).encode()


def _laughs(indent: str) -> bytes:
    """YAML mapping lines whose last value, l8, expands to 10^9 items through aliases (9 small lists in memory)."""
    lines = [f"{indent}l0: &l0 [{', '.join(['1'] * 10)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    return ("\n".join(lines) + "\n").encode()


# ---- running the variants ------------------------------------------------------------------------------------------

# An error names the scenario file, a trace file (FILE:LINE:COLUMN), or a field (dotted path) first.
_FIELD = r"(services|nodePools|stepSeconds|durationSeconds|name|forecasting|baselines|metricsDelaySeconds)\b"
_PROBLEM_LINE = re.compile(r"^  (\S.*?: \S|\.\.\. and [\d,]+ more$|" + _FIELD + ")")


def names_field_or_file(message: str, scenario: Path) -> bool:
    first, *rest = message.splitlines() or [""]
    if first.endswith("invalid scenario"):  # FILE: invalid scenario, then one `field: problem` per line
        return first.startswith(str(scenario)) and bool(rest) and all(_PROBLEM_LINE.match(line) for line in rest)
    return (
        first.startswith(str(scenario))
        or re.match(r"^\S.*:\d+:\d+: \S", first) is not None  # a trace's FILE:LINE:COLUMN
        or re.match(r"^" + _FIELD + r"[.:\w]*: \S", first) is not None
    ) and len(message.splitlines()) <= 25


def write_variant(variant: Variant, path: Path) -> Path:
    if variant.scenario_is_dir:
        path.mkdir()
    elif variant.raw is not None:
        path.write_bytes(variant.raw)
    else:
        path.write_text(yaml.safe_dump(variant.data, allow_unicode=True), encoding="utf-8")
    return path


def run_in_process(variant: Variant, path: Path) -> None:
    """Loader + validation (+ trace loading and run sizing), classified as accepted / error / traceback."""
    try:
        scenario, base = load_scenario(path)
        if variant.loads_traces:
            build_services(scenario, base)
    except (ScenarioError, TraceFormatError) as error:
        variant.message = str(error)
        variant.outcome = "error" if names_field_or_file(variant.message, path) else "unclear error"
    except Exception as error:  # what the fuzz is looking for
        variant.outcome, variant.message = "traceback", f"{type(error).__name__}: {error}"[:500]
    else:
        variant.outcome = "accepted"


# Run as subprocesses: every traversal name, every odd file, the six defects of issue 17, and two accepted runs.
SUBPROCESS_SAMPLE = (
    "name = '../x'", "name = '../../evil'", "name = '../../../evil'", "name = '..'", "name = 'a/b'",
    "name = an absolute path",
    "empty file", "not UTF-8", "binary", "a YAML list", "deeply nested list", "duplicate keys",
    "trace directory", "trace fifo", "stepSeconds 1e-9", "stepSeconds true", "infinite throughput",
    "unchanged", "name = 'ok-name'",
)


def command(variant: Variant, path: Path) -> list[str]:
    """The command line for a variant; an accepted one is made short (one hour of its trace)."""
    if variant.outcome == "accepted":
        path.write_text(yaml.safe_dump(variant.data | {"durationSeconds": 3600}), encoding="utf-8")
    argv = [sys.executable, "-m", "autoscaler.cli", "simulate", str(path), "--no-progress"]
    return argv if variant.label == "unchanged" else [*argv, "--no-plot"]  # one plot is enough


def run_command(argv: list[str], work: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=90, check=False)


def snapshot(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*")}


def test_fuzzed_scenarios_give_a_clear_error_or_a_run_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = make_traces(tmp_path / "traces")
    variants = make_variants(traces)
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    paths = [write_variant(v, scenarios / f"v{i:04d}.yaml") for i, v in enumerate(variants)]
    for variant, path in zip(variants, paths, strict=True):
        run_in_process(variant, path)

    # The command itself, in a scratch working folder (its output folder is work/out); nothing may appear anywhere
    # else under tmp_path, nor next to tmp_path.
    work = tmp_path / "work"
    work.mkdir()
    by_label = {v.label: (v, p) for v, p in zip(variants, paths, strict=True)}
    sample = [by_label[label] for label in SUBPROCESS_SAMPLE]
    argvs = [command(variant, path) for variant, path in sample]
    before, beside = snapshot(tmp_path), set(tmp_path.parent.iterdir())
    with ThreadPoolExecutor(max_workers=2) as pool:  # the machine has 2 cores; a run takes 1-3 s
        results = list(pool.map(lambda argv: run_command(argv, work), argvs))
    written = snapshot(tmp_path) - before
    assert set(tmp_path.parent.iterdir()) == beside, "a file was written next to the test's folder"
    outside = {p for p in written if not p.is_relative_to(work / "out")}
    assert not outside, f"written outside the output folder: {sorted(outside)}"

    command_problems = []
    for (variant, path), result in zip(sample, results, strict=True):
        err = result.stderr
        if "Traceback" in err or result.returncode not in (0, 2):
            command_problems.append(f"{variant.label}: exit {result.returncode}: {err[-800:]}")
        elif result.returncode == 2 and not names_field_or_file(err.removeprefix("autoscaler simulate: "), path):
            command_problems.append(f"{variant.label}: unclear error: {err[:300]}")
        elif (result.returncode == 0) != (variant.outcome == "accepted"):
            command_problems.append(f"{variant.label}: exit {result.returncode} but in-process {variant.outcome}")
    accepted_runs = [v.label for (v, _), r in zip(sample, results, strict=True) if r.returncode == 0]
    assert (work / "out" / "default-servegen-chat.png").exists() and (work / "out" / "ok-name.json").exists()

    counts = {outcome: sum(v.outcome == outcome for v in variants)
              for outcome in ("error", "accepted", "unclear error", "traceback")}
    with capsys.disabled():
        print(f"\nscenario fuzz (seed {SEED}): {len(variants)} variants tried, {counts['error']} clear errors, "
              f"{counts['accepted']} accepted, {counts['unclear error']} unclear errors, "
              f"{counts['traceback']} tracebacks; {len(sample)} run as `autoscaler simulate` "
              f"({len(accepted_runs)} ran, {len(sample) - len(accepted_runs)} exit 2)")
    failures = [f"{v.label}: {v.outcome}: {v.message}" for v in variants if v.outcome in ("traceback", "unclear error")]
    assert counts["traceback"] == 0, "\n".join(failures)
    assert counts["unclear error"] == 0, "\n".join(failures)
    assert not command_problems, "\n".join(command_problems)
    assert len(variants) >= 300


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        # Spot checks that the fuzz's accepted/refused split is the intended one, not an accident.
        ("unchanged", None),
        ("name = 'builtin:servegen-m-large-cold90'", None),
        ("modelParams valid", None),
        ("a merge key", None),  # YAML's `<<: *anchor`: the keys beside it override, they are no duplicates
        ("name = '../../evil'", "name: '../../evil' is not a safe file name"),
        ("name = '/abs/evil'", "is not a safe file name"),
        ("stepSeconds true", "stepSeconds: Input should be a number, not a boolean"),
        ("stepSeconds 1e-9", "stepSeconds: Input should be greater than or equal to 1"),
        ("a million and one steps", "more than the maximum of 1,000,000 simulation steps"),
        ("too many service-steps", "more than the maximum of 10,000,000"),
        ("too many replica-steps", "more than the maximum of 1,000,000,000"),
        ("infinite throughput", "services.0.simulation.throughputPerReplica: Input should be a finite number"),
        ("services.0.spec.priority = 10**30".replace("10**30", repr(10**30)), "services.0.spec.priority: Input should "
         "be at most 2,147,483,647"),
        ("services.0.spec.latency.sloSeconds = nan", "services.0.spec.latency.sloSeconds: Input should be a finite"),
        ("services.0.spec.metric.target = '1.0e400'", "services.0.spec.metric.target: Input should be a finite"),
        ("modelParams bool as a number", "modelParams.residual_window: Input should be a number, not a boolean"),
        ("modelParams NaN", "modelParams.min_share: Input should be a finite number"),
        ("modelParams of the wrong type", "modelParams.period_s: Input should be a valid number"),
        # a constrained parameter (Annotated[int, Ge(1)]): its bound, and the boolean check through the Annotated
        ("modelParams reversion 0", "modelParams.reversion_periods: Input should be greater than or equal to 1"),
        ("modelParams reversion bool", "modelParams.reversion_periods: Input should be a number, not a boolean"),
        ("modelParams reversion on", None),
        ("modelParams reversion off", None),
        ("duplicate keys", "found duplicate key 'stepSeconds'"),
        ("deeply nested list", "nested too deeply"),
        ("not UTF-8", "not UTF-8 text (byte 0xe9)"),
        ("larger than the limit", "larger than 4 MiB"),
        ("the scenario path is a directory", "it is a directory"),
        ("trace directory", "services.0.simulation.trace: "),
        ("trace fifo", "is not a regular file"),
        ("trace two-rows-a-gigasecond-apart", "services.0.simulation.binSeconds: "),
        ("trace log-spanning-300-years", "more than the maximum of 20,000,000"),
        ("huge rates scaled", "services.0.simulation.traceScale: "),
        ("builtin traversal", "no packaged trace of that name"),
        ("builtin absolute", "no packaged trace of that name"),
        ("trace NUL in path", "services.0.simulation.trace: file not found: "),
        ("a million GPUs", "nodePools.0.nodes: Input should be less than or equal to 10000"),
        ("a forecast of a million points", "more than the maximum of 10,000"),
    ],
)
def test_fuzz_spot_checks(tmp_path: Path, label: str, expected: str | None) -> None:
    variants = {v.label: v for v in make_variants(make_traces(tmp_path / "traces"))}
    variant = variants[label]
    path = write_variant(variant, tmp_path / "scenario.yaml")
    run_in_process(variant, path)
    if expected is None:
        assert variant.outcome == "accepted", variant.message
    else:
        assert variant.outcome == "error", variant.message
        assert expected in variant.message
