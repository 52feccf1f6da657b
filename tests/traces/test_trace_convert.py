"""Importers of public traces, on small fixtures written here (and a smoke test on ../shared/traces when present)."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import warnings
from math import gamma as gamma_function
from pathlib import Path

import numpy as np
import pytest

from autoscaler.traces import (
    PACKAGED_TRACES,
    TraceFormatError,
    default_trace_path,
    load_request_log,
    load_trace,
    packaged_trace_path,
)
from autoscaler.traces.convert import (
    ServeGenPool,
    convert_servegen,
    read_azure_functions,
    read_azure_llm,
    read_nab,
    read_servegen,
    servegen_files,
    servegen_rate_series,
)


def shared_traces() -> Path:
    """``../shared/traces`` beside the clone (CI copies it there), or ``$AUTOSCALER_SHARED_TRACES``."""
    override = os.environ.get("AUTOSCALER_SHARED_TRACES")
    return Path(override) if override else Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def expect_error(call: object, path: Path, line: int, column: int, message: str) -> None:
    assert callable(call)
    with pytest.raises(TraceFormatError) as caught:
        call()
    error = caught.value
    assert (error.path, error.line, error.column) == (str(path), line, column), str(error)
    assert error.message.startswith(message), error.message


# ---------------------------------------------------------------------------------------------------------------------
# Azure LLM inference 2023

AZURE_LLM = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:16:01.0000000,1000,1
"""


def test_azure_llm_reads_seven_digit_timestamps_as_utc(tmp_path: Path) -> None:
    log = read_azure_llm(write(tmp_path / "conv.csv", AZURE_LLM))
    assert log.times.tolist() == pytest.approx([1_700_158_546.68059, 1_700_158_550.995169, 1_700_158_561.0], abs=1e-6)
    assert log.input_tokens is not None and log.input_tokens.tolist() == [374, 396, 1000]
    assert log.output_tokens is not None and log.output_tokens.tolist() == [44, 109, 1]


def test_azure_llm_merges_files_in_time_order(tmp_path: Path) -> None:
    other = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48.0000000,7,8\n"
    log = read_azure_llm([write(tmp_path / "a.csv", AZURE_LLM), write(tmp_path / "b.csv.gz", other)])
    assert log.input_tokens is not None and log.input_tokens.tolist() == [374, 7, 396, 1000]
    assert "a.csv, b.csv.gz" in log.source


@pytest.mark.parametrize(
    ("content", "line", "column", "message"),
    [
        ("TIMESTAMP,Context,GeneratedTokens\n", 1, 2, "header 'Context': expected 'TIMESTAMP,ContextTokens"),
        ("2023-11-16 18:15:46.6805900,374,44\n", 1, 1, "missing header: expected 'TIMESTAMP,ContextTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", 2, 1, "no data rows after the header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens,X\n", 1, 4, "header: unexpected column 'X'"),
        (AZURE_LLM + "2023-11-16 18:16:02.0,5\n", 5, 3, "expected 3 columns"),
        (AZURE_LLM + "2023-11-16 25:00:00.0,5,5\n", 5, 1, "timestamp: '2023-11-16 25:00:00.0' is not an ISO 8601"),
        (AZURE_LLM + "2023-11-16 18:16:02.0,-5,5\n", 5, 2, "ContextTokens: '-5' is negative"),
        (AZURE_LLM + "2023-11-16 18:16:02.0,5,many\n", 5, 3, "GeneratedTokens: 'many' is not a number"),
        (AZURE_LLM + "2023-11-16 18:16:02.0,1e30,5\n", 5, 2, "ContextTokens: '1e30' is too large"),
        (AZURE_LLM + "1969-11-16 18:16:02.0,1,5\n", 5, 1, "timestamp: '1969-11-16 18:16:02.0' is outside 1970"),
        ("", 1, 1, "empty file"),
    ],
)
def test_azure_llm_errors(tmp_path: Path, content: str, line: int, column: int, message: str) -> None:
    path = write(tmp_path / "azure.csv", content)
    expect_error(lambda: read_azure_llm(path), path, line, column, message)


# ---------------------------------------------------------------------------------------------------------------------
# ServeGen


def servegen_rows(windows: list[tuple[float, str, float, float]], window_s: int = 600, first: int = 0) -> str:
    """Chunk-file text; each window is (rate, dist, shape, scale); the cv column is what the shape implies."""
    lines = []
    for i, (rate, dist, shape, scale) in enumerate(windows):
        cv = 1 / np.sqrt(shape) if dist == "Gamma" and rate > 0 else 0.0
        if rate == 0:
            dist, shape, scale = "", 0, 0
        lines.append(f"{first + i * window_s},{rate},{cv},{dist},{shape},{scale}")
    return "\n".join(lines) + "\n"


def make_pool(
    rate: float, dist: str, shape: float, scale: float, n_windows: int, window_s: float = 600.0
) -> ServeGenPool:
    kind = {"Gamma": 1, "Weibull": 2}[dist]
    return ServeGenPool(
        names=("c",),
        origin=0.0,
        window_s=window_s,
        rates=np.full((1, n_windows), rate),
        kind=np.full((1, n_windows), kind, dtype=np.int8),
        shape=np.full((1, n_windows), shape),
        scale=np.full((1, n_windows), scale),
    )


def test_servegen_directory_sums_clients_and_keeps_empty_windows_empty(tmp_path: Path) -> None:
    folder = tmp_path / "m-large"
    write(
        folder / "chunk-2-trace.csv.gz",
        servegen_rows([(2.0, "Gamma", 1.0, 0.5), (0, "", 0, 0), (1.0, "Gamma", 4.0, 0.25)]),
    )
    write(folder / "chunk-10-trace.csv", servegen_rows([(3.0, "Weibull", 0.5, 0.1), (0, "", 0, 0), (0, "", 0, 0)]))
    write(folder / "notes.txt", "ignored")
    assert [p.name for p in servegen_files([folder])] == ["chunk-2-trace.csv.gz", "chunk-10-trace.csv"]
    series = convert_servegen([folder], step_s=60.0, seed=5, start=1_000_000.0)
    assert (series.start, series.step_s, len(series)) == (1_000_000.0, 60.0, 30)
    assert np.all(series.rates[10:20] == 0)  # window 2 has no requests from anyone
    # Window totals: 5 req/s x 600 s and 1 req/s x 600 s, up to renewal noise.
    assert series.rates[:10].mean() == pytest.approx(5.0, rel=0.15)
    assert series.rates[20:].mean() == pytest.approx(1.0, rel=0.25)
    assert "2 clients" in series.source and "seed 5" in series.source


def test_servegen_is_reproducible_with_a_seed(tmp_path: Path) -> None:
    path = write(tmp_path / "chunk-0-trace.csv", servegen_rows([(4.0, "Gamma", 0.25, 1.0)] * 3))
    a = convert_servegen([path], seed=1)
    b = convert_servegen([path], seed=1)
    c = convert_servegen([path], seed=2)
    assert np.array_equal(a.rates, b.rates)
    assert not np.array_equal(a.rates, c.rates)


@pytest.mark.parametrize(
    ("dist", "shape", "scale"),
    [
        ("Gamma", 1.0, 0.5),  # Poisson, mean matches 1/rate
        ("Gamma", 1 / 9, 4.5),  # cv 3
        ("Gamma", 0.25, 10.0),  # mean 2.5 s: 5x too slow for rate 2, rescaled
        ("Weibull", 0.5, 0.1),  # mean 0.2 s: too fast, rescaled
        ("Weibull", 2.0, 1.0),  # more regular than Poisson
    ],
)
def test_servegen_arrivals_follow_rate_and_fitted_burstiness(dist: str, shape: float, scale: float) -> None:
    rate, n_windows = 2.0, 60
    series = servegen_rate_series(make_pool(rate, dist, shape, scale, n_windows), step_s=1.0, seed=11)
    counts = series.rates  # 1 s bins: arrivals per second
    assert counts.mean() == pytest.approx(rate, rel=0.05)
    # Index of dispersion of counts grows with the inter-arrival cv: compare the sampled counts at 60 s with a
    # Poisson process (dispersion 1) — bursty fits must stay bursty, regular ones regular.
    per_minute = counts.reshape(-1, 60).sum(axis=1)
    dispersion = per_minute.var() / per_minute.mean()
    weibull_cv2 = gamma_function(1 + 2 / shape) / gamma_function(1 + 1 / shape) ** 2 - 1
    cv2 = 1 / shape if dist == "Gamma" else weibull_cv2
    if cv2 > 1.5:
        assert dispersion > 1.5
    elif cv2 < 0.5:
        assert dispersion < 0.8
    else:
        assert 0.6 < dispersion < 1.5


def test_servegen_stationary_start_keeps_bursty_clients_at_their_rate() -> None:
    # cv 10 and 30 requests per window: restarting each window with an arrival at its edge would add
    # (cv**2 - 1) / 2 ≈ 50 arrivals per window (2.6x the rate); a stationary start adds none.
    rate, n_windows = 0.05, 2000
    series = servegen_rate_series(make_pool(rate, "Gamma", 0.01, 2000.0, n_windows), step_s=600.0, seed=3)
    per_window = series.rates * 600
    assert per_window.mean() == pytest.approx(30.0, abs=5.0)


def test_servegen_step_that_does_not_divide_the_window(tmp_path: Path) -> None:
    path = write(tmp_path / "chunk-0-trace.csv", servegen_rows([(10.0, "Gamma", 1.0, 0.1)] * 2))
    series = convert_servegen([path], step_s=250.0, seed=0)
    assert len(series) == 5  # 1200 s = 4 x 250 s + 200 s
    assert series.rates[-1] == pytest.approx(10.0, rel=0.2)  # the 200 s tail is not diluted
    assert series.rates.mean() == pytest.approx(10.0, rel=0.1)


def test_servegen_clients_on_shifted_windows_share_one_grid(tmp_path: Path) -> None:
    a = write(tmp_path / "chunk-0-trace.csv", servegen_rows([(1.0, "Gamma", 1.0, 1.0)] * 2))
    b = write(tmp_path / "chunk-1-trace.csv", servegen_rows([(1.0, "Gamma", 1.0, 1.0)] * 2, first=600))
    pool = read_servegen([a, b])
    assert pool.rates.tolist() == [[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]


def test_servegen_window_with_rate_but_no_distribution_is_poisson(tmp_path: Path) -> None:
    path = write(tmp_path / "chunk-0-trace.csv", "0,2.0,1.0,,0,0\n600,0,0,,0,0\n")
    pool = read_servegen([path])
    assert pool.kind.tolist() == [[1, 0]] and pool.shape[0, 0] == 1.0


GOOD = "0,1.0,1.0,Gamma,1.0,1.0\n"


@pytest.mark.parametrize(
    ("content", "line", "column", "message"),
    [
        ("", 1, 1, "empty file"),
        (GOOD + "600,1.0,1.0,Gamma,1.0\n", 2, 6, "expected 6 columns"),
        ("window_start_seconds,rate,cv,dist_name,dist_arg1,dist_arg2\n" + GOOD, 1, 1, "window_start_seconds: 'window"),
        (GOOD + "600,fast,1.0,Gamma,1.0,1.0\n", 2, 2, "rate: 'fast' is not a number"),
        (GOOD + "600,-1,1.0,Gamma,1.0,1.0\n", 2, 2, "rate: '-1' is negative"),
        (GOOD + "600,1.0,1.0,Pareto,1.0,1.0\n", 2, 4, "dist_name: 'Pareto' is not Gamma, Weibull or empty"),
        (GOOD + "600,1.0,1.0,Gamma,0,1.0\n", 2, 5, "dist_arg1 (shape): '0' must be > 0 for a Gamma window"),
        (GOOD + "600,1.0,1.0,Weibull,1.0,-2\n", 2, 6, "dist_arg2 (scale): '-2' must be > 0 for a Weibull window"),
        (GOOD + "0,1.0,1.0,Gamma,1.0,1.0\n", 2, 1, "window_start_seconds: '0' is not after the previous row's '0'"),
        (GOOD + "600,1,1,Gamma,1,1\n1500,1,1,Gamma,1,1\n", 3, 1, "window_start_seconds: '1500' breaks the 600 s"),
        # Inputs that crashed (Γ overflow) or would draw without end (zero-length intervals), or exhaust memory.
        (
            GOOD + "600,1.0,1.0,Gamma,0.0001,1.0\n",
            2,
            5,
            "dist_arg1 (shape): '0.0001' is below 0.001, the smallest Gamma",
        ),
        (GOOD + "600,1.0,1.0,Gamma,1e-300,1.0\n", 2, 5, "dist_arg1 (shape): '1e-300' is below 0.001"),
        (
            GOOD + "600,1.0,1.0,Weibull,0.001,1.0\n",
            2,
            5,
            "dist_arg1 (shape): '0.001' is below 0.01, the smallest Weibull",
        ),
        (
            GOOD + "600,2e4,1.0,Gamma,1,1\n",
            2,
            2,
            "rate: '2e4' req/s: the 600 s window at 600 s expects 1.2e+07 arrivals",
        ),
        (GOOD + "600,1e300,1.0,Gamma,1,1\n", 2, 2, "rate: '1e300' req/s: the 600 s window at 600 s expects 6e+302"),
        ("0,1,1,Gamma,1,1\n1e300,1,1,Gamma,1,1\n", 1, 2, "rate: '1' req/s: the 1e+300 s window at 0 s expects 1e+300"),
    ],
)
def test_servegen_errors(tmp_path: Path, content: str, line: int, column: int, message: str) -> None:
    path = write(tmp_path / "chunk-0-trace.csv", content)
    expect_error(lambda: read_servegen([path]), path, line, column, message)


def test_servegen_clients_must_share_the_window_length(tmp_path: Path) -> None:
    a = write(tmp_path / "chunk-0-trace.csv", "0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n")
    b = write(tmp_path / "chunk-1-trace.csv", "0,1,1,Gamma,1,1\n300,1,1,Gamma,1,1\n")
    expect_error(lambda: read_servegen([a, b]), b, 2, 1, "window_start_seconds: '300' breaks the 600 s")


def test_servegen_clients_far_apart_are_refused_before_the_grid_is_allocated(tmp_path: Path) -> None:
    # Two clients on the same 600 s grid, 6e12 s apart: 10 billion windows x 2 clients (160 GB per matrix).
    a = write(tmp_path / "chunk-0-trace.csv", "0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n")
    b = write(tmp_path / "chunk-1-trace.csv", "6e12,1,1,Gamma,1,1\n6000000000600,1,1,Gamma,1,1\n")
    expect_error(
        lambda: read_servegen([a, b]),
        b,
        2,
        1,
        "window_start_seconds: '6000000000600' is 10,000,000,001 windows of 600 s after the first window (at 0 s); with"
        " 2 client file(s) that is more than the maximum of 20,000,000 client-windows",
    )


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (1e-9, "2 windows of 600 s at a step of 1e-09 s make 1,200,000,000,000 bins, more than the maximum"),
        (1e-300, "2 windows of 600 s at a step of 1e-300 s make 1.2e+303 bins, more than the maximum of 20,000,000"),
    ],
)
def test_servegen_step_beyond_the_bin_limit_is_refused_before_drawing(
    tmp_path: Path, step: float, message: str
) -> None:
    path = write(tmp_path / "chunk-0-trace.csv", GOOD + "600,1,1,Gamma,1,1\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        convert_servegen([path], step_s=step)


def test_servegen_too_many_arrivals_in_all_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscaler.traces import convert

    monkeypatch.setattr(convert, "SERVEGEN_MAX_ARRIVALS", 1000)
    path = write(tmp_path / "chunk-0-trace.csv", "0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n")
    with pytest.raises(
        ValueError, match=re.escape("rates add up to 1.2e+03 arrivals to draw, more than the maximum of 1,000")
    ):
        read_servegen([path])


def test_servegen_window_drawing_far_more_than_expected_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscaler.traces import convert

    monkeypatch.setattr(convert, "SERVEGEN_MAX_WINDOW_ARRIVALS", 1000)
    with pytest.raises(ValueError, match=r"ServeGen window 0 \(at 0 s\): more than 2,000 arrivals drawn"):
        servegen_rate_series(make_pool(1000.0, "Gamma", 1.0, 1.0, 1), step_s=60.0)


def test_servegen_draws_from_the_smallest_shapes_allowed() -> None:
    series = servegen_rate_series(make_pool(1.0, "Gamma", 0.001, 1.0, 3), step_s=600.0)
    assert len(series) == 3 and np.all(np.isfinite(series.rates))
    series = servegen_rate_series(make_pool(1.0, "Weibull", 0.01, 1.0, 3), step_s=600.0)
    assert len(series) == 3 and np.all(np.isfinite(series.rates))


def test_servegen_clients_must_share_the_window_grid(tmp_path: Path) -> None:
    a = write(tmp_path / "chunk-0-trace.csv", "0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n")
    b = write(tmp_path / "chunk-1-trace.csv", "100,1,1,Gamma,1,1\n700,1,1,Gamma,1,1\n")
    expect_error(lambda: read_servegen([a, b]), b, 1, 1, "window_start_seconds: '100' is not on the 600 s grid")


def test_servegen_directory_without_chunks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no ServeGen chunk"):
        servegen_files([tmp_path])
    with pytest.raises(FileNotFoundError):
        servegen_files([tmp_path / "absent"])


# ---------------------------------------------------------------------------------------------------------------------
# Azure Functions 2019


def functions_csv(rows: list[tuple[str, list[int]]]) -> str:
    minutes = len(rows[0][1])
    header = "HashFunction,HashOwner,HashApp," + ",".join(f"{i}_minute" for i in range(1, minutes + 1))
    body = "\n".join(f"{name},owner,app," + ",".join(str(c) for c in counts) for name, counts in rows)
    return f"{header}\n{body}\n"


FUNCTIONS = [("aaa111", [60, 0, 120]), ("aab222", [0, 60, 0]), ("bcd333", [6, 6, 6])]


def test_azure_functions_sums_all_functions(tmp_path: Path) -> None:
    series = read_azure_functions(write(tmp_path / "inv.csv.gz", functions_csv(FUNCTIONS)), start=3600.0)
    assert (series.start, series.step_s) == (3600.0, 60.0)
    assert series.rates.tolist() == pytest.approx([1.1, 1.1, 2.1])


@pytest.mark.parametrize(
    ("prefix", "expected"), [("aaa", [1.0, 0.0, 2.0]), ("AAB2", [0.0, 1.0, 0.0]), ("b", [0.1] * 3)]
)
def test_azure_functions_selects_one_function_by_prefix(tmp_path: Path, prefix: str, expected: list[float]) -> None:
    series = read_azure_functions(write(tmp_path / "inv.csv", functions_csv(FUNCTIONS)), function=prefix)
    assert series.rates.tolist() == pytest.approx(expected)


@pytest.mark.parametrize(("prefix", "message"), [("aa", "2 functions start with 'aa'"), ("zz", "no HashFunction")])
def test_azure_functions_prefix_must_match_exactly_one(tmp_path: Path, prefix: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_azure_functions(write(tmp_path / "inv.csv", functions_csv(FUNCTIONS)), function=prefix)


@pytest.mark.parametrize(
    ("content", "line", "column", "message"),
    [
        (
            "HashFunction,HashOwner,HashApp,1_minute,3_minute\nf,o,a,1,2\n",
            1,
            5,
            "header '3_minute': expected '2_minute'",
        ),
        ("HashFunction,HashOwner,HashApp\nf,o,a\n", 1, 4, "expected minute columns"),
        ("HashFunction,Owner,HashApp,1_minute\nf,o,a,1\n", 1, 2, "header 'Owner': expected 'HashFunction,HashOwner"),
        ("HashFunction,HashOwner,HashApp,1_minute,2_minute\nf,o,a,1,-2\n", 2, 5, "2_minute: '-2' is negative"),
        ("HashFunction,HashOwner,HashApp,1_minute,2_minute\nf,o,a,1.5,2\n", 2, 4, "1_minute: '1.5' is not a whole"),
        ("HashFunction,HashOwner,HashApp,1_minute,2_minute\nf,o,a,x,2\n", 2, 4, "1_minute: 'x' is not a number"),
        ("HashFunction,HashOwner,HashApp,1_minute,2_minute\nf,o,a,1\n", 2, 5, "expected 5 columns"),
    ],
)
def test_azure_functions_errors(tmp_path: Path, content: str, line: int, column: int, message: str) -> None:
    path = write(tmp_path / "inv.csv", content)
    expect_error(lambda: read_azure_functions(path), path, line, column, message)


def test_azure_functions_counts_whose_sum_overflows(tmp_path: Path) -> None:
    path = write(tmp_path / "inv.csv", "HashFunction,HashOwner,HashApp,1_minute\nf,o,a,1e308\ng,o,a,1e308\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="invocation counts are too large: their sum overflows"):
            read_azure_functions(path)


# ---------------------------------------------------------------------------------------------------------------------
# NAB


def test_nab_keeps_the_file_step_and_scales_values(tmp_path: Path) -> None:
    text = "timestamp,value\n2014-07-01 00:00:00,100\n2014-07-01 00:30:00,200\n2014-07-01 01:00:00,50\n"
    series, repair = read_nab(write(tmp_path / "taxi.csv", text), scale=0.01)
    assert (series.start, series.step_s) == (1_404_172_800.0, 1800.0)
    assert series.rates.tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert (repair.merged, repair.filled, repair.moved) == (0, 0, 0)


def test_nab_repairs_gaps_duplicates_and_off_grid_samples(tmp_path: Path) -> None:
    # 5-minute samples with a missing 00:10, two samples stamped 00:20 (a DST-style clamp) and one at 00:26.
    text = (
        "timestamp,value\n"
        "2014-03-09 00:00:00,1\n2014-03-09 00:05:00,2\n2014-03-09 00:15:00,4\n"
        "2014-03-09 00:20:00,5\n2014-03-09 00:20:00,7\n2014-03-09 00:26:00,8\n2014-03-09 00:30:00,9\n"
    )
    series, repair = read_nab(write(tmp_path / "gappy.csv", text))
    assert series.step_s == 300.0
    assert series.rates.tolist() == pytest.approx([1, 2, 3, 4, 6, 8, 9])
    assert (repair.merged, repair.filled, repair.moved) == (1, 1, 1)


@pytest.mark.parametrize(
    ("content", "line", "column", "message"),
    [
        ("time,value\n0,1\n", 1, 1, "header 'time': expected 'timestamp,value'"),
        ("timestamp,value\n2014-01-01 00:00:00,1\n2014-01-01 00:05:00,-3\n", 3, 2, "value: '-3' is negative"),
        (
            "timestamp,value\n2014-01-01 00:05:00,1\n2014-01-01 00:10:00,1\n2014-01-01 00:00:00,1\n",
            4,
            1,
            "timestamp: '2014-01-01 00:00:00' is before the previous row's",
        ),
        ("timestamp,value\n2014-01-01 00:00:00,1\n", 3, 1, "need at least 2 rows"),
        ("timestamp,value\n2014-01-01 00:00:00,1\n2014-01-01 00:00:00,2\n", 3, 1, "all timestamps are equal"),
        ("timestamp,value\n2014-01-01 00:00:00,1\nnoon,2\n", 3, 1, "timestamp: 'noon' is not an ISO 8601 time"),
        ("timestamp,value\n0,1\n1e300,2\n", 3, 1, "timestamp: '1e300' is outside 1970-01-01..9999-12-31"),
        (
            "timestamp,value\n0,1\n0.000001,2\n0.000002,2\n9e9,3\n",
            5,
            1,
            "timestamp: '9e9' is 9,000,000,000,000,000 steps of 1e-06 s (the file's median step) after the first row:"
            " filling the gaps would make more than the maximum of 20,000,000 rows",
        ),
        ("timestamp,value\n0,1\n60,1e308\n120,1e308\n", 3, 2, "value: '1e308' x scale 10 is not a finite rate"),
    ],
)
def test_nab_errors(tmp_path: Path, content: str, line: int, column: int, message: str) -> None:
    path = write(tmp_path / "nab.csv", content)
    expect_error(lambda: read_nab(path, scale=10.0), path, line, column, message)


# ---------------------------------------------------------------------------------------------------------------------
# Packaged traces


def test_default_trace_is_packaged_and_loads() -> None:
    path = default_trace_path()
    assert path.is_file() and path.name.endswith(".csv.gz")
    series = load_trace(path)
    assert (series.start, series.step_s, len(series)) == (0.0, 60.0, 14 * 1440)
    assert series.duration_s == 14 * 86_400
    assert 150 < series.rates.mean() < 250 and series.rates.max() < 1000 and series.rates.min() > 0


@pytest.mark.parametrize(("name", "requests"), [("azure-llm-2023-conv", 19_366), ("azure-llm-2023-code", 8_819)])
def test_packaged_azure_llm_logs(name: str, requests: int) -> None:
    log = load_request_log(packaged_trace_path(name))
    assert len(log) == requests
    assert log.input_tokens is not None and log.input_tokens.min() >= 0


def test_sources_md_names_every_packaged_file_with_its_hash_and_licence() -> None:
    data = default_trace_path().parent
    sources = (data / "SOURCES.md").read_text()
    assert "f891d1189eb32b3868dfc443800c4150548c282a" in sources
    assert "Apache-2.0" in sources and "CC-BY-4.0" in sources
    for file_name in PACKAGED_TRACES.values():
        digest = hashlib.sha256((data / file_name).read_bytes()).hexdigest()
        assert f"`{file_name}`" in sources
        assert digest in sources, f"SOURCES.md has a stale sha256 for {file_name}"
    listed = set(re.findall(r"`([\w.-]+\.csv\.gz)`", sources))
    on_disk = {p.name for p in data.glob("*.csv.gz")}
    assert on_disk <= listed, f"undocumented files in autoscaler/data: {on_disk - listed}"


# ---------------------------------------------------------------------------------------------------------------------
# Smoke tests on the real upstream files (skipped when ../shared/traces is absent)

needs_shared = pytest.mark.skipif(not shared_traces().is_dir(), reason="../shared/traces not present")


@needs_shared
def test_real_azure_llm_files() -> None:
    folder = shared_traces() / "azure-llm-inference-2023"
    conv = read_azure_llm(folder / "AzureLLMInferenceTrace_conv.csv")
    code = read_azure_llm(folder / "AzureLLMInferenceTrace_code.csv")
    assert (len(conv), len(code)) == (19_366, 8_819)
    assert 50 * 60 < conv.times[-1] - conv.times[0] < 60 * 60


@needs_shared
def test_real_servegen_subset_matches_the_upstream_rates() -> None:
    folder = shared_traces() / "alibaba-servegen" / "language" / "m-large"
    files = servegen_files([folder])[:12]
    pool = read_servegen(files)
    assert pool.window_s == 600.0 and pool.n_windows == 2016
    series = servegen_rate_series(pool, step_s=600.0, seed=0)
    expected = pool.rates.sum(axis=0)
    assert series.total_requests == pytest.approx(float(expected.sum() * 600), rel=0.02)


@needs_shared
def test_real_azure_functions_and_nab() -> None:
    root = shared_traces()
    functions = read_azure_functions(root / "azure-functions-2019-invitro-sample" / "1000_inv.csv.gz")
    assert len(functions) == 1440
    assert functions.total_requests == pytest.approx(792_651)
    taxi, repair = read_nab(root / "nab" / "realKnownCause" / "nyc_taxi.csv")
    assert (len(taxi), taxi.step_s, repair.filled) == (10_320, 1800.0, 0)
