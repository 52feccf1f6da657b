"""Review 39: the CLI commands other than ``run`` and ``simulate``'s engine -- ``trace convert``/``trace info``,
``backtest``, ``import-hpa`` -- and the trace readers/converters, checked against the README.

Defects (each was a strict xfail below, its docstring saying what is WRONG and what is RIGHT). All twelve tests (7 is
two) are fixed and pass; each docstring now starts "Fixed (was a strict xfail)." and keeps its WRONG/RIGHT:

1. ``trace convert azure-llm a.csv a.csv`` merges the same file twice: every request counted twice, exit 0 (the
   servegen converter refuses a client given twice for exactly this reason). Fixed: convert.read_azure_llm refuses a
   file given twice (compared by resolved path): exit 2 naming it, OUT not written.
2. ``backtest`` on a request log scores every model against the log's last bin, which the log covers only up to its
   last request but which is divided by the whole step: a perfectly constant 1 req/s log gets a naive MAE of 0.16
   and 80 % interval coverage (the packaged azure-llm-2023-conv ends with 0.62 req/s after ~4 req/s). Fixed:
   backtest loads the trace with ``load_trace(..., complete_bins=True)``, which drops a request log's last, partly
   observed bin; load_trace's default and bin_requests (the simulator's demand, trace info) keep every request.
3. ``import-hpa FILE -n NS`` (and ``--kubeconfig``/``--context`` with a FILE) silently ignores the option: the
   policy is written for the file's namespace or ``default``, not NS. Fixed: exit 2 naming the options, which apply
   only to a live HPA (--name).
4. ``backtest --json DIR/OUT.json`` with DIR not there yet runs the whole backtest, then exits 1 (a code the README
   does not list for backtest) having written nothing; ``simulate`` creates the directory. Fixed: --json is checked
   before the run (exit 2: a directory, under a file, not writable) and its directory made when it is written.
5. ``backtest TRACE --json TRACE`` overwrites the input trace with the JSON report (``trace convert`` refuses an
   output that is an input). Fixed: exit 2 naming --json, before the run.
6. ``trace convert ... --output DIR/`` with a bad second input leaves the first input's output written and the
   third input unconverted, although the help says "on an error, OUT is left as it was". Fixed: every input is
   converted first (each bad one named), then the outputs are written all or none (formats.write_texts).
7. A rate series' jitter is checked interval by interval against the median interval, not against a grid:
   (a) a series whose step changes by less than 5 % part way (60 s, then 62.9 s) loads as one regular series of
   61.45 s, rows placed up to 24 steps away from their own timestamps; (b) a short series whose timestamps are all
   within 2 % of a step of a regular grid is refused as having a gap. Fixed: each timestamp is checked against
   ``start + i * step``, the step from the first row to the last (a clear gap is still named as the gap).
8. A quoted field followed by a space (``"0" ,1``) is "malformed CSV", though the README says fields may be quoted
   or padded with spaces (a space before a quoted field is accepted). Fixed: when the strict parse fails on such
   padding, it is removed (quote-aware, line breaks kept) and the text parsed again.
9. A request log's summary line can print a mean above its peak (``mean 0.0311 req/s, peak 0.01667 req/s``):
   the mean is n / (last - first) while the peak is over 60 s bins. Fixed: the mean is over the same bins.
10. ``backtest --models last_value,last_value`` prints the model twice (and lists it twice in the JSON). Fixed:
    de-duplicated in order.
11. ``backtest`` prints an undefined pinball ratio as an unpadded ``-``: the table's columns shift left. Fixed: ``-``
    is right-aligned in its column (an undefined coverage too).

The other tests pin right behaviour checked during the review that no other test pins.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler import cli
from autoscaler.adapters.kubernetes.hpa import import_hpa
from autoscaler.adapters.kubernetes.policies import LoadedPolicy, validate_policy
from autoscaler.core.model import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, RateKind, RatePolicy
from autoscaler.traces import load_trace, packaged_trace_path
from autoscaler.traces.formats import TraceFormatError

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:16:50.9951690,3,1\n"

HPA = """\
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: chat}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: chat}
  minReplicas: 2
  maxReplicas: 10
  metrics:
  - type: Pods
    pods:
      metric: {name: DCGM_FI_DEV_GPU_UTIL}
      target: {type: AverageValue, averageValue: "70"}
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AUTOSCALER_") or key in ("KUBECONFIG",):
            monkeypatch.delenv(key)


def _hpa(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(HPA)
    doc["spec"].update(spec)
    return doc


def _constant_log(path: Path, seconds: int = 1811) -> Path:
    """A request log of exactly 1 request per second for ``seconds`` seconds (t = 0, 1, ..., seconds - 1)."""
    path.write_text("timestamp\n" + "".join(f"{1_700_000_000 + i}\n" for i in range(seconds)))
    return path


def _daily_rates(path: Path, steps: int = 432) -> Path:
    rows = [f"{i * 600},{50 + 30 * ((i % 144) / 144):.3f}" for i in range(steps)]
    path.write_text("timestamp,rate\n" + "\n".join(rows) + "\n")
    return path


# ---- 1. azure-llm: one file given twice ------------------------------------------------------------------------------


def test_azure_llm_refuses_a_file_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``autoscaler trace convert azure-llm conv.csv conv.csv -o out.csv`` (a repeated glob, or a directory
    listed twice) exits 0 and writes every request twice (4 rows from a 2-request file): the replayed demand is
    doubled and nothing says so. convert.servegen_files refuses exactly this for ServeGen ("given twice ... each
    client would be counted twice"), read_azure_llm has no such check.
    RIGHT: exit 2 naming the file given twice and OUT not written (or the file read once: 2 requests)."""
    source = tmp_path / "conv.csv"
    source.write_text(AZURE)
    out = tmp_path / "out.csv"
    code = cli.main(["trace", "convert", "azure-llm", str(source), str(source), "-o", str(out)])
    err = capsys.readouterr().err
    if code == 2:
        assert "conv.csv" in err and not out.exists()
    else:
        assert code == 0 and len(out.read_text().splitlines()) == 1 + 2


# ---- 2. backtest: the last, partly observed bin of a request log -----------------------------------------------------


def test_backtest_of_a_constant_request_log_has_no_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: a request log is binned (formats.bin_requests) so that the last bin is the one holding the last request,
    divided by the whole step although the log says nothing past its last request. backtest scores every model
    against it: a log of exactly 1 request/s for 1,811 s (30 full minutes and 11 s) binned at 60 s ends with a bin
    of 11/60 = 0.18 req/s, and last_value -- exact on this trace -- gets MAE 0.163 and 80 % P10-P90 coverage. The
    packaged azure-llm-2023-conv (usable as TRACE) ends with 0.62 req/s after ~4 req/s for the same reason.
    RIGHT: the backtest scores complete bins only (drop a last bin the log covers for less than a step, or divide it
    by the time it covers): a constant trace has (almost) no error."""
    trace = _constant_log(tmp_path / "const.csv")
    out = tmp_path / "bt.json"
    argv = ["backtest", str(trace), "--models", "last_value", "--horizon", "60", "--origins", "5", "--json", str(out)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    models = {m["name"]: m for m in json.loads(out.read_text())["models"]}
    assert models["last_value"]["mae"] < 0.05
    assert models["last_value"]["interval_coverage"] == 1.0


def test_packaged_request_log_ends_with_a_partly_observed_bin() -> None:
    """The data behind the defect above, on the packaged trace: binned at 60 s, the conversation log's last bin
    holds 21.7 s of requests divided by 60 s (documented: sum(rates) x step is the request count)."""
    series = load_trace(packaged_trace_path("azure-llm-2023-conv"))
    assert len(series) == 59 and series.step_s == 60.0
    assert series.rates[-1] < 0.2 * series.rates[-4:-1].mean()
    assert series.total_requests == pytest.approx(19_366)


# ---- 3. import-hpa: -n with a FILE -----------------------------------------------------------------------------------


def test_import_hpa_from_a_file_does_not_ignore_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``autoscaler import-hpa hpa.yaml -n prod`` (an HPA manifest without metadata.namespace, as most are
    kept in git) exits 0 and writes ``metadata.namespace: default``: -n (like --kubeconfig and --context) is read
    only for a live HPA and silently dropped with a FILE. ``kubectl apply -f`` of the output then creates the policy
    in ``default``, where the Deployment is not (or fails on the namespace mismatch with ``-n prod``). The trace
    command refuses an option that does not apply ("a silently ignored option is a wrong trace nobody notices").
    RIGHT: exit 2 saying -n/--kubeconfig/--context apply only to --name (or -n used as the namespace)."""
    path = tmp_path / "hpa.yaml"
    path.write_text(HPA)
    code = cli.main(["import-hpa", str(path), "-n", "prod"])
    out = capsys.readouterr()
    if code == 0:
        assert yaml.safe_load(out.out)["metadata"]["namespace"] == "prod"
    else:
        assert code == 2 and ("-n" in out.err or "--namespace" in out.err)


def test_import_hpa_from_a_file_without_options_uses_the_default_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hpa.yaml"
    path.write_text(HPA)
    assert cli.main(["import-hpa", str(path)]) == 0
    policy = yaml.safe_load(capsys.readouterr().out)
    assert policy["metadata"] == {"name": "chat", "namespace": "default"}
    assert policy["spec"]["metric"] == {"type": "gpu_utilization", "target": 70.0}
    assert policy["spec"]["behavior"] == {"hpaWithoutBehavior": True}


# ---- 4, 5. backtest --json -------------------------------------------------------------------------------------------


def test_backtest_json_into_a_new_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``autoscaler backtest TRACE --json out/bt.json`` in a fresh checkout (no out/) runs the whole backtest
    (minutes with quantile_gbm on 14 days), prints the table, then "cannot write out/bt.json: No such file or
    directory" and exits 1 -- a code the README does not give backtest ("exit 2 on bad input") -- having written
    nothing. ``simulate --json`` creates the directory (report.write_json: mkdir parents), so does trace convert.
    RIGHT: the directory is created and the JSON written (exit 0), or the path refused before the run (exit 2)."""
    trace = _daily_rates(tmp_path / "rates.csv")
    out = tmp_path / "new" / "bt.json"
    code = cli.main(["backtest", str(trace), "--models", "last_value", "--origins", "3", "--json", str(out)])
    printed = capsys.readouterr()
    assert code in (0, 2), printed.err
    if code == 0:
        assert json.loads(out.read_text())["steps"] == 432
    else:
        assert "selected:" not in printed.out


def test_backtest_json_does_not_overwrite_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``autoscaler backtest rates.csv --json rates.csv`` exits 0 and replaces the trace with the JSON
    report; the next ``trace info rates.csv`` says "malformed CSV". trace convert refuses this ("the output ... is
    the input ...: give --output another file").
    RIGHT: exit 2 naming --json before the run; the trace is left as it was."""
    trace = _daily_rates(tmp_path / "rates.csv")
    before = trace.read_bytes()
    code = cli.main(["backtest", str(trace), "--models", "last_value", "--origins", "3", "--json", str(trace)])
    capsys.readouterr()
    assert trace.read_bytes() == before
    assert code == 2


# ---- 6. trace convert into a directory: an error part way ------------------------------------------------------------


def test_convert_into_a_directory_is_all_or_each_good_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``trace convert azure-llm a.csv bad.csv c.csv --output out/`` writes out/a.csv.gz, stops at bad.csv with
    exit 2 and never converts c.csv. The help says "An output is written only once its input converted without
    error (never half-written): on an error, OUT is left as it was", and the README "the output left as it was":
    OUT, the directory, is not; and which inputs were converted depends on their order.
    RIGHT: either nothing is written when one input fails (convert all, then write), or every good input is converted
    and each bad one named (as import-hpa does with several HPAs), exit 2 either way."""
    good_a, bad, good_c = tmp_path / "a.csv", tmp_path / "bad.csv", tmp_path / "c.csv"
    good_a.write_text(AZURE)
    good_c.write_text(AZURE)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,1\n")
    out = tmp_path / "out"
    code = cli.main(["trace", "convert", "azure-llm", str(good_a), str(bad), str(good_c), "--output", f"{out}/"])
    assert code == 2
    assert "bad.csv:2:2: ContextTokens: 'x' is not a number" in capsys.readouterr().err
    written = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert written in ([], ["a.csv.gz", "c.csv.gz"])


# ---- 7. rate series: a step that drifts ------------------------------------------------------------------------------


def test_rate_series_whose_step_changes_is_not_taken_as_regular(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).
    WRONG: formats._rate_series_from_table checks each *interval* against the median step (5 %), then places row i
    at ``start + i * mean step``. A file whose first 1,000 intervals are 60 s and next 1,000 are 62.9 s (two exports
    concatenated, a clock that changed) passes every check and loads as one series of 61.45 s: the row stamped
    60,000 s is placed at 61,450 s -- 24 bins late -- and the step is one neither half has. The README: "The step
    is the time between rows and must be the same on every row, up to a jitter of 5 % of the step".
    RIGHT: refused naming the first row that is more than 5 % of the step off the grid (a jitter check against
    ``start + i * step``, not interval by interval), or every row loaded within 5 % of a step of its timestamp."""
    times, t = [], 0.0
    for i in range(2001):
        times.append(t)
        t += 60.0 if i < 1000 else 62.9
    path = tmp_path / "drift.csv"
    path.write_text("timestamp,rate\n" + "".join(f"{x:.1f},{i % 7}\n" for i, x in enumerate(times)))
    try:
        series = load_trace(path)
    except TraceFormatError as error:
        assert error.line > 2
        return
    off = [abs(placed - stamped) for placed, stamped in zip(series.times.tolist(), times, strict=True)]
    assert max(off) <= 0.05 * series.step_s


def test_rate_series_with_jitter_around_a_grid_loads_on_the_grid(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).
    WRONG: the same interval-by-interval check, against the *median interval*, refuses a series whose every
    timestamp is within 2 % of a step (1.2 s) of a regular 60 s grid: two rows 1.2 s late and 1.2 s early make an
    interval of 57.6 s, and the median interval of this short file is 61.1 s, so "'1118.8' is 57.6 s after the
    previous row, but the series' step is 61.1 s (... gaps must be filled)". STEP_JITTER_TOLERANCE is documented as
    "how far (as a fraction of the step) a rate series' timestamps may wander from a regular grid", 5 %, and the
    README allows "a jitter of 5 % of the step". So the check lets a drifting step through (above) and refuses
    jitter well inside the tolerance.
    RIGHT: loads on the grid: start 1000, step 60, the rows in order (check each timestamp against
    ``start + i * step``, the step from first to last row)."""
    jitter = [0.0, 1.2, -1.2, 0.6, -0.3, 1.2, -1.1, 0.0]
    path = tmp_path / "jitter.csv"
    path.write_text("timestamp,rate\n" + "".join(f"{1000 + 60 * i + j},{i}\n" for i, j in enumerate(jitter)))
    series = load_trace(path)
    assert (series.start, series.step_s, len(series)) == (1000.0, 60.0, 8)
    assert series.rates.tolist() == [float(i) for i in range(8)]


def test_rate_series_with_scrape_jitter_loads_on_the_grid(tmp_path: Path) -> None:
    """Millisecond jitter (timestamps stamped at scrape time) loads on the grid, the step snapped to 60 s."""
    jitter = [0.0, 0.004, -0.003, 0.002, -0.001, 0.003, -0.004, 0.0]
    path = tmp_path / "jitter.csv"
    path.write_text("timestamp,rate\n" + "".join(f"{1000 + 60 * i + j},{i}\n" for i, j in enumerate(jitter)))
    series = load_trace(path)
    assert (series.start, series.step_s, len(series)) == (1000.0, 60.0, 8)
    assert series.rates.tolist() == [float(i) for i in range(8)]


# ---- 8. quoted fields padded with spaces -----------------------------------------------------------------------------


def test_quoted_field_padded_with_spaces_loads(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``"0" ,1`` and ``"60", "2" `` fail with ``malformed CSV (',' expected after '"')``: read_csv uses
    csv.reader(strict=True, skipinitialspace=True), which accepts a space *before* a quoted field but not after it.
    The README: "fields may be quoted or padded with spaces" (formats.py: "surrounded by spaces or double quotes").
    RIGHT: loads as timestamps 0, 60 and rates 1, 2 (strip the padding around a quoted field, as before one)."""
    path = tmp_path / "quoted.csv"
    path.write_text('timestamp,rate\n"0" ,1\n"60", "2" \n')
    series = load_trace(path)
    assert (series.start, series.step_s, series.rates.tolist()) == (0.0, 60.0, [1.0, 2.0])


def test_quoted_fields_with_leading_spaces_load(tmp_path: Path) -> None:
    path = tmp_path / "quoted.csv"
    path.write_text('timestamp , rate\n "0", "1"\n 60 ,  2\n')
    assert load_trace(path).rates.tolist() == [1.0, 2.0]


# ---- 9. a request log's mean above its peak --------------------------------------------------------------------------


def test_request_log_summary_mean_is_not_above_its_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``trace info`` (and ``trace convert azure-llm``) print for a two-request log 64.3 s long ``mean 0.0311
    req/s, peak 0.01667 req/s (over 60 s bins)``: the mean is n / (last - first) -- n requests over n - 1 intervals
    -- while the peak is a count per 60 s bin; a mean above the peak beside it is a contradiction (the same file's
    ``binned:`` summary says mean 0.01667).
    RIGHT: the mean printed is never above the peak printed with it (e.g. both over the same bins)."""
    path = tmp_path / "two.csv"
    path.write_text("timestamp\n0\n64.3\n")
    assert cli.main(["trace", "info", str(path)]) == 0
    line = capsys.readouterr().out.split("; binned:")[0]
    mean = float(re.search(r"mean ([0-9.e+-]+) req/s", line).group(1))  # type: ignore[union-attr]
    peak = float(re.search(r"peak ([0-9.e+-]+) req/s", line).group(1))  # type: ignore[union-attr]
    assert mean <= peak, line


# ---- 10, 11. backtest's table ----------------------------------------------------------------------------------------


def test_backtest_lists_a_model_named_twice_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed (was a strict xfail).
    WRONG: ``--models last_value,last_value`` (or ``--models seasonal_naive,...`` with a different --baseline
    named again) backtests it once (the candidates are a dict) but prints two identical rows and writes two entries
    to the JSON's ``models``, as if two models had been compared.
    RIGHT: each model once (de-duplicated in order), or exit 2 naming the repeated model."""
    trace = _daily_rates(tmp_path / "rates.csv")
    out = tmp_path / "bt.json"
    argv = ["backtest", str(trace), "--models", "last_value,last_value", "--origins", "3", "--json", str(out)]
    code = cli.main(argv)
    printed = capsys.readouterr().out
    if code == 2:
        return
    assert sum(line.startswith("last_value") for line in printed.splitlines()) == 1
    assert [m["name"] for m in json.loads(out.read_text())["models"]].count("last_value") == 1


def test_backtest_table_keeps_its_columns_when_a_ratio_is_undefined(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fixed (was a strict xfail).
    WRONG: on a trace the baseline forecasts exactly (all zeros: its pinball loss is 0), every ratio is undefined
    and backtest._fmt returns a bare ``-`` where the other cells are padded to their column: the row reads
    ``seasonal_naive*   0 -        100.0%   100.0%``, the coverages under the wrong headers.
    RIGHT: ``-`` right-aligned in the 12-character pinball/base column, as the numbers are."""
    path = tmp_path / "zero.csv"
    path.write_text("timestamp,rate\n" + "".join(f"{i * 600},0\n" for i in range(300)))
    assert cli.main(["backtest", str(path), "--models", "last_value", "--origins", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("model"))
    end = header.index("pinball/base") + len("pinball/base")
    row = next(line for line in lines if line.startswith("last_value"))
    assert row[end - 1] == "-" and row[end - 2] == " ", row


# ---- pins: trace info on the shipped data ----------------------------------------------------------------------------


def test_trace_info_on_the_shipped_traces(capsys: pytest.CaptureFixture[str]) -> None:
    """README "trace info": ``FILE: KIND, `` then the summary line; a request log adds ``; binned: ``; a file that is
    no trace (the packaged training runtimes) is one error line FILE:LINE:COLUMN and exit 2, the others printed."""
    data = packaged_trace_path("servegen-m-large").parent
    files = [data / "servegen-m-large-14d-60s.csv.gz", data / "azure-llm-2023-conv.csv.gz"]
    files.append(data / "philly-runtimes-2000.csv.gz")
    assert cli.main(["trace", "info", *map(str, files)]) == 2
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0] == (
        f"{files[0]}: rate series, 20160 rows, step 60 s, span 14 d from 1970-01-01T00:00:00Z, mean 195.9 req/s,"
        " peak 593.9 req/s"
    )
    assert lines[1].startswith(f"{files[1]}: request log, 19366 rows, no step")
    assert "; binned: 59 rows, step 60 s, span 59 min from 2023-11-16T18:15:46Z" in lines[1]
    assert err.startswith(f"autoscaler trace info: error: {files[2]}:1:1: unknown header 'runtime_seconds': expected")
    assert err.count("\n") == 1


def test_trace_info_step_bins_a_request_log_and_conserves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _constant_log(tmp_path / "log.csv", seconds=600)
    assert cli.main(["trace", "info", "--step", "120", str(trace)]) == 0
    binned = capsys.readouterr().out.split("; binned: ")[1]
    assert binned.startswith("5 rows, step 2 min, span 10 min from 2023-11-14T22:13:20Z, mean 1 req/s, peak 1 req/s")


# ---- pins: time zones ------------------------------------------------------------------------------------------------


def test_rate_series_across_a_dst_change_keeps_its_step(tmp_path: Path) -> None:
    """Local times with their offsets across the spring-forward hour (01:59+01:00 -> 03:00+02:00 is one minute)."""
    path = tmp_path / "dst.csv"
    stamps = ["2023-03-26T01:58:00+01:00", "2023-03-26T01:59:00+01:00", "2023-03-26T03:00:00+02:00"]
    stamps.append("2023-03-26T03:01:00+02:00")
    path.write_text("timestamp,rate\n" + "".join(f"{s},{i}\n" for i, s in enumerate(stamps)))
    series = load_trace(path)
    assert (series.step_s, len(series)) == (60.0, 4)
    assert series.start == 1_679_792_280.0  # 2023-03-26T00:58:00Z


def test_convert_azure_functions_start_with_an_offset_is_utc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "inv.csv"
    source.write_text("HashFunction,HashOwner,HashApp,1_minute,2_minute\nabc,o,a,60,120\n")
    out = tmp_path / "fn.csv"
    argv = ["trace", "convert", "azure-functions", str(source), "-o", str(out), "--start", "2024-01-01T02:00:00+02:00"]
    assert cli.main(argv) == 0
    series = load_trace(out)
    assert (series.start, series.step_s, series.rates.tolist()) == (1_704_067_200.0, 60.0, [1.0, 2.0])
    assert "span 2 min from 2024-01-01T00:00:00Z" in capsys.readouterr().out


# ---- pins: import-hpa behaviour --------------------------------------------------------------------------------------


def _service(doc: dict[str, Any]) -> Any:
    loaded = validate_policy(import_hpa(doc).manifest)
    assert isinstance(loaded, LoadedPolicy), loaded
    return loaded.service


def test_import_hpa_empty_behavior_is_the_defaulted_behavior() -> None:
    """``behavior: {}`` is a behavior block to the API server (it defaults both directions): the HPA takes the
    rate-limited path, not the behaviour-less one. The policy has no behavior block, i.e. the same defaults."""
    manifest = import_hpa(_hpa(behavior={})).manifest
    assert "behavior" not in manifest["spec"]
    service = _service(_hpa(behavior={}))
    assert service.behavior is True
    assert (service.scale_up, service.scale_down) == (DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)
    assert _service(_hpa()).behavior is False


def test_import_hpa_partial_behavior_keeps_the_hpa_defaults_for_the_rest() -> None:
    """Only scaleDown.policies given: the HPA keeps scaleDown's 300 s window (the controller's flag) and the default
    scale-up; tolerances given as quantities per direction are carried over."""
    behavior = {
        "scaleDown": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}], "tolerance": "50m"},
        "scaleUp": {"tolerance": 0.2},
    }
    service = _service(_hpa(behavior=behavior))
    assert service.scale_down.stabilisation_s == 300.0
    assert service.scale_down.policies == (RatePolicy(RateKind.PODS, 2, 60.0),)
    assert service.scale_down.tolerance == pytest.approx(0.05)
    assert service.scale_up.policies == DEFAULT_SCALE_UP.policies and service.scale_up.stabilisation_s == 0.0
    assert service.scale_up.tolerance == pytest.approx(0.2)
    assert (service.min_replicas, service.max_replicas) == (2, 10)


def test_import_hpa_adopt_names_the_hpa_not_the_deployment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _hpa()
    doc["metadata"] = {"name": "chat-hpa", "namespace": "ml"}
    path = tmp_path / "hpa.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["import-hpa", str(path), "--adopt", "-o", "json"]) == 0
    policy = json.loads(capsys.readouterr().out)
    assert policy["spec"]["adoptHpa"] == "chat-hpa" and policy["spec"]["targetRef"]["name"] == "chat"
    assert policy["metadata"] == {"name": "chat-hpa", "namespace": "ml"}


# ---- pins: backtest origins ------------------------------------------------------------------------------------------


def test_backtest_origins_are_the_latest_and_end_with_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README: "--origins N: the latest N of the trace"; the last forecast's horizon ends where the trace ends, and
    the origins are --origin-every apart, the horizon not a multiple of the step rounded up (and said)."""
    trace = _daily_rates(tmp_path / "rates.csv")
    out = tmp_path / "bt.json"
    argv = ["backtest", str(trace), "--models", "last_value", "--origins", "4", "--origin-every", "1200"]
    assert cli.main([*argv, "--horizon", "1000", "--json", str(out)]) == 0
    assert "horizon 2 steps (1200 s), 4 origins every 1200 s" in capsys.readouterr().out
    report = json.loads(out.read_text())
    end = report["start"] + report["steps"] * report["step_s"]
    assert report["origin_times"] == [end - 1200.0 - 1200.0 * k for k in (3, 2, 1, 0)]
    assert report["horizon_s"] == 1200.0


def test_cli_without_a_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main([])
    assert caught.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


# ---- pins for the fixes above ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [["--kubeconfig", "kc"], ["--context", "prod"]])
def test_import_hpa_from_a_file_refuses_the_live_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str]
) -> None:
    path = tmp_path / "hpa.yaml"
    path.write_text(HPA)
    assert cli.main(["import-hpa", str(path), *option]) == 2
    out = capsys.readouterr()
    assert option[0] in out.err and out.out == ""


@pytest.mark.parametrize("target", ["dir", "under-a-file"])
def test_backtest_json_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    trace = _daily_rates(tmp_path / "rates.csv")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    out = tmp_path / "dir" if target == "dir" else tmp_path / "file" / "bt.json"
    assert cli.main(["backtest", str(trace), "--models", "last_value", "--origins", "3", "--json", str(out)]) == 2
    printed = capsys.readouterr()
    assert "--json" in printed.err and "selected:" not in printed.out


def test_backtest_request_log_says_its_last_bin_is_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _constant_log(tmp_path / "const.csv")
    assert cli.main(["backtest", str(trace), "--models", "last_value", "--horizon", "60", "--origins", "5"]) == 0
    assert "last, partly observed bin of 11 requests dropped): 30 steps of 60 s" in capsys.readouterr().out
    assert len(load_trace(trace)) == 31  # load_trace (the simulator's demand) keeps every request


def test_convert_into_a_directory_writes_nothing_when_an_output_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory where the second output goes: refused before the first is put in place."""
    good_a, good_c = tmp_path / "a.csv", tmp_path / "c.csv"
    good_a.write_text(AZURE)
    good_c.write_text(AZURE)
    out = tmp_path / "out"
    (out / "c.csv.gz").mkdir(parents=True)
    assert cli.main(["trace", "convert", "azure-llm", str(good_a), str(good_c), "--output", f"{out}/"]) == 2
    assert "c.csv.gz: it is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["c.csv.gz"]


def test_padding_after_a_quoted_field_is_removed_outside_quotes_only(tmp_path: Path) -> None:
    from autoscaler.traces.formats import read_csv

    path = tmp_path / "quoted.csv"
    path.write_text('"a"" ,b" ,c\n"d",  "e"\t\n')
    assert read_csv(path).rows == [['a" ,b', "c"], ["d", "e"]]
