"""Canonical trace formats: loading, binning, resampling, writing, and the file:line:column errors."""

from __future__ import annotations

import gzip
import math
import pickle
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from autoscaler.traces import (
    RateSeries,
    RequestLog,
    TraceFormatError,
    bin_requests,
    load_request_log,
    load_trace,
    parse_time,
    resample,
    write_rate_series,
    write_request_log,
)
from autoscaler.traces.formats import sniff_format, summarise, summarise_request_log


def write(path: Path, text: str) -> Path:
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# RateSeries


def test_rate_series_properties() -> None:
    series = RateSeries(start=100.0, step_s=15.0, rates=np.array([1.0, 2.0, 3.0]), source="x")
    assert series.times.tolist() == [100.0, 115.0, 130.0]
    assert series.duration_s == 45.0
    assert series.end == 145.0
    assert series.total_requests == 90.0
    assert len(series) == 3
    assert series.rates.dtype == np.float64


def test_rate_series_is_immutable_and_copies_its_input() -> None:
    rates = np.array([1.0, 2.0])
    series = RateSeries(0.0, 60.0, rates)
    rates[0] = 99.0
    assert series.rates[0] == 1.0
    with pytest.raises(ValueError):
        series.rates[0] = 5.0
    with pytest.raises(AttributeError):
        series.step_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("start", "step", "rates", "match"),
    [
        (0.0, 0.0, [1.0], "step_s"),
        (0.0, -60.0, [1.0], "step_s"),
        (0.0, math.nan, [1.0], "step_s"),
        (math.inf, 60.0, [1.0], "start"),
        (0.0, 60.0, [1.0, -0.5], ">= 0"),
        (0.0, 60.0, [1.0, math.nan], "finite"),
        (0.0, 60.0, [[1.0]], "one-dimensional"),
    ],
)
def test_rate_series_rejects_invalid_values(start: float, step: float, rates: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RateSeries(start, step, np.array(rates))


# ---------------------------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("name", ["series.csv", "series.csv.gz"])
def test_rate_series_round_trip_is_exact(tmp_path: Path, name: str) -> None:
    rng = np.random.default_rng(7)
    series = RateSeries(1_700_000_000.25, 15.0, rng.random(500) * 300, source="test")
    path = tmp_path / name
    write_rate_series(series, path)
    loaded = load_trace(path)
    assert loaded.start == series.start
    assert loaded.step_s == series.step_s
    assert np.array_equal(loaded.rates, series.rates)  # repr() round-trips floats exactly
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")


def test_written_gzip_is_deterministic(tmp_path: Path) -> None:
    series = RateSeries(0.0, 60.0, np.arange(10.0))
    write_rate_series(series, tmp_path / "a.csv.gz")
    time.sleep(1.1)  # a gzip header with the current mtime would now differ
    write_rate_series(series, tmp_path / "b.csv.gz")
    assert (tmp_path / "a.csv.gz").read_bytes() == (tmp_path / "b.csv.gz").read_bytes()


def test_write_rate_series_text_and_rounding(tmp_path: Path) -> None:
    series = RateSeries(0.0, 60.0, np.array([1 / 3, 2.0, 0.0]))
    path = tmp_path / "r.csv"
    write_rate_series(series, path, decimals=3)
    assert path.read_text() == "timestamp,rate\n0,0.333\n60,2\n120,0\n"


@pytest.mark.parametrize("decimals", [-1, 16, 400, True, 1.5])
def test_write_rate_series_refuses_decimals_out_of_range_and_writes_nothing(tmp_path: Path, decimals: object) -> None:
    path = tmp_path / "out.csv"
    with pytest.raises(ValueError, match="decimals must be a whole number from 0 to 15"):
        write_rate_series(RateSeries(0.0, 60.0, np.array([1.0, 2.0])), path, decimals=decimals)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_one_row_rate_series_cannot_be_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2 rows"):
        write_rate_series(RateSeries(0.0, 60.0, np.array([1.0])), tmp_path / "one.csv")
    assert not (tmp_path / "one.csv").exists()


def test_request_log_round_trip(tmp_path: Path) -> None:
    log = RequestLog(
        np.array([1_700_000_000.000001, 1_700_000_000.5, 1_700_000_003.25]),
        np.array([10, 20, 30]),
        np.array([1, 2, 3]),
    )
    path = tmp_path / "log.csv.gz"
    write_request_log(log, path)
    loaded = load_request_log(path)
    assert np.allclose(loaded.times, log.times, rtol=0, atol=1e-6)
    assert loaded.input_tokens is not None and loaded.input_tokens.tolist() == [10, 20, 30]
    assert loaded.output_tokens is not None and loaded.output_tokens.tolist() == [1, 2, 3]


def test_request_log_without_tokens_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    write_request_log(RequestLog(np.array([5.0, 1.0])), path)
    assert path.read_text() == "timestamp\n1.000000\n5.000000\n"  # sorted on the way in
    loaded = load_request_log(path)
    assert loaded.times.tolist() == [1.0, 5.0]
    assert loaded.input_tokens is None


def test_request_log_sorts_and_keeps_tokens_with_their_request() -> None:
    log = RequestLog(np.array([3.0, 1.0, 2.0]), np.array([30, 10, 20]), np.array([3, 1, 2]))
    assert log.times.tolist() == [1.0, 2.0, 3.0]
    assert log.input_tokens is not None and log.input_tokens.tolist() == [10, 20, 30]
    assert log.output_tokens is not None and log.output_tokens.tolist() == [1, 2, 3]


# ---------------------------------------------------------------------------------------------------------------------
# Timestamps


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0.0),
        ("1700000000.5", 1_700_000_000.5),
        ("1970-01-01T00:01:00", 60.0),
        ("1970-01-01 00:01:00", 60.0),
        ("1970-01-01T00:01:00Z", 60.0),
        ("1970-01-01T02:01:00+02:00", 60.0),
        ("2023-11-16 18:15:46.6805900", 1_700_158_546.68059),
        ("1970-01-02", 86_400.0),
    ],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_time(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "neither Unix seconds nor an ISO 8601 time"),
        ("yesterday", "neither Unix seconds nor an ISO 8601 time"),
        ("nan", "not a finite time"),
        ("inf", "not a finite time"),
        ("2023-13-01", "neither Unix seconds nor an ISO 8601 time"),
        ("1e300", "is outside 1970-01-01..9999-12-31"),
        ("-1", "is outside 1970-01-01..9999-12-31"),
        ("1969-12-31T23:59:59Z", "is outside 1970-01-01..9999-12-31"),
        ("253402300800", "is outside 1970-01-01..9999-12-31"),
    ],
)
def test_parse_time_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_time(text)


def test_iso_and_unix_rate_series_agree(tmp_path: Path) -> None:
    iso = write(tmp_path / "iso.csv", "timestamp,rate\n2024-01-01T00:00:00,1\n2024-01-01T00:01:00,2\n")
    unix = write(tmp_path / "unix.csv", "timestamp,rate\n1704067200,1\n1704067260,2\n")
    a, b = load_trace(iso), load_trace(unix)
    assert (a.start, a.step_s, a.rates.tolist()) == (b.start, b.step_s, b.rates.tolist()) == (1_704_067_200, 60, [1, 2])


def test_tolerates_jitter_and_quotes_spaces_blank_lines_bom(tmp_path: Path) -> None:
    text = '\ufeffTimestamp, Rate\n0,1\n\n60.4,"2"\n119.7 , 3\n180,4\n'
    series = load_trace(write(tmp_path / "jitter.csv", text))
    assert series.step_s == 60.0
    assert series.start == 0.0
    assert series.rates.tolist() == [1, 2, 3, 4]


def test_gzip_detected_by_content_as_well_as_name(tmp_path: Path) -> None:
    path = tmp_path / "no-suffix.csv"
    path.write_bytes(gzip.compress(b"timestamp,rate\n0,1\n60,2\n"))
    assert load_trace(path).rates.tolist() == [1, 2]


def test_sniff_format(tmp_path: Path) -> None:
    assert sniff_format(write(tmp_path / "r.csv", "timestamp,rate\n0,1\n60,1\n")) == "rate series"
    assert sniff_format(write(tmp_path / "l.csv", "timestamp\n0\n")) == "request log"


# ---------------------------------------------------------------------------------------------------------------------
# Binning a request log


@pytest.mark.parametrize(
    ("times", "step", "start", "expected_counts"),
    [
        ([0.0, 1.0, 59.999, 60.0, 61.0, 179.0], 60.0, 0.0, [3, 2, 1]),
        ([10.0, 10.0, 10.0], 60.0, 10.0, [3]),  # simultaneous requests all count
        ([5.0, 20.0, 35.0, 50.0], 15.0, 5.0, [1, 1, 1, 1]),  # a request on a bin edge belongs to the later bin
        ([100.0, 400.0], 60.0, 100.0, [1, 0, 0, 0, 0, 1]),  # empty bins stay at zero
        ([3.0, 1.0, 2.0], 1.0, 1.0, [1, 1, 1]),  # unsorted input
    ],
)
def test_bin_requests_counts_exactly(times: list[float], step: float, start: float, expected_counts: list[int]) -> None:
    series = bin_requests(np.array(times), step)
    assert series.start == start
    assert series.step_s == step
    assert (series.rates * step).round(9).tolist() == expected_counts
    assert series.total_requests == pytest.approx(len(times))


def test_bin_requests_with_explicit_end_divides_a_partial_last_bin_by_its_length() -> None:
    series = bin_requests(np.array([0.0, 60.0, 61.0, 125.0]), 60.0, start=0.0, end=150.0)
    assert series.rates.tolist() == [1 / 60, 2 / 60, 1 / 30]


def test_bin_requests_rejects_arrivals_outside_the_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        bin_requests(np.array([0.0, 200.0]), 60.0, start=0.0, end=120.0)


@pytest.mark.parametrize(("step", "expected_rows"), [(None, 2), (30.0, 3), (10.0, 7)])
def test_load_trace_bins_request_logs(tmp_path: Path, step: float | None, expected_rows: int) -> None:
    path = write(tmp_path / "log.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n30,1,1\n61,1,1\n")
    series = load_trace(path, step_s=step)
    assert len(series) == expected_rows
    assert series.step_s == (60.0 if step is None else step)
    assert series.total_requests == pytest.approx(3)
    assert "request log, 3 requests" in series.source


def test_load_trace_resamples_a_rate_series_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path / "r.csv", "timestamp,rate\n0,1\n60,3\n")
    assert load_trace(path, step_s=120).rates.tolist() == [2.0]
    assert load_trace(path, step_s=60).rates.tolist() == [1.0, 3.0]
    with pytest.raises(ValueError, match="step_s"):
        load_trace(path, step_s=0)


# ---------------------------------------------------------------------------------------------------------------------
# Resampling


@pytest.mark.parametrize(
    ("rates", "old_step", "new_step", "expected"),
    [
        ([1.0, 3.0], 60.0, 30.0, [1.0, 1.0, 3.0, 3.0]),  # finer: hold
        ([1.0, 3.0, 5.0, 7.0], 60.0, 120.0, [2.0, 6.0]),  # coarser: mean
        ([1.0, 3.0, 5.0], 60.0, 180.0, [3.0]),
        ([2.0, 4.0], 60.0, 40.0, [2.0, 3.0, 4.0]),  # 1.5x finer: the middle bin straddles, time-weighted
        ([2.0, 4.0, 6.0], 60.0, 90.0, [8 / 3, 16 / 3]),  # 1.5x coarser: (2*60 + 4*30)/90, (4*30 + 6*60)/90
        ([6.0, 0.0, 3.0], 60.0, 45.0, [6.0, 2.0, 1.0, 3.0]),  # 180 s = 4 x 45 s, edges at 45, 90, 135
        ([1.0, 2.0, 3.0], 60.0, 120.0, [1.5, 3.0]),  # last new bin covers only 60 s: mean of what it covers
    ],
)
def test_resample_values(rates: list[float], old_step: float, new_step: float, expected: list[float]) -> None:
    series = RateSeries(1000.0, old_step, np.array(rates), source="s")
    out = resample(series, new_step)
    assert out.start == 1000.0
    assert out.step_s == new_step
    assert out.rates.tolist() == pytest.approx(expected, rel=1e-12)
    assert "resampled" in out.source


@pytest.mark.parametrize("new_step", [1.0, 7.5, 15.0, 20.0, 45.0, 60.0, 90.0, 120.0, 300.0, 3600.0])
def test_resample_conserves_total_requests(new_step: float) -> None:
    rng = np.random.default_rng(1)
    series = RateSeries(0.0, 60.0, rng.random(720) * 100)  # 12 h: a multiple of every step above
    out = resample(series, new_step)
    assert out.duration_s == pytest.approx(series.duration_s)
    assert out.total_requests == pytest.approx(series.total_requests, rel=1e-12)


def test_resample_up_then_down_is_identity() -> None:
    series = RateSeries(0.0, 60.0, np.random.default_rng(2).random(100))
    back = resample(resample(series, 15.0), 60.0)
    assert np.allclose(back.rates, series.rates, rtol=1e-12, atol=0)


def test_resample_same_step_returns_the_series() -> None:
    series = RateSeries(0.0, 60.0, np.ones(3))
    assert resample(series, 60.0) is series


# ---------------------------------------------------------------------------------------------------------------------
# Errors: file, line, column, message


ERROR_CASES: list[tuple[str, str, int, int, str]] = [
    # (id, file content, line, column, start of the message)
    ("empty file", "", 1, 1, "empty file: expected a header"),
    ("only blank lines", "\n\n  \n", 1, 1, "empty file"),
    ("header only", "timestamp,rate\n", 2, 1, "no data rows after the header"),
    ("missing header", "0,1.5\n60,2\n", 1, 1, "missing header: expected 'timestamp,rate'"),
    ("missing header iso", "2024-01-01T00:00:00,1\n", 1, 1, "missing header"),
    ("unknown header", "timestamp,rps\n0,1\n", 1, 2, "unknown header 'rps': expected 'timestamp,rate'"),
    ("unknown header order", "rate,timestamp\n1,0\n", 1, 1, "unknown header 'rate,timestamp'"),
    ("too many columns", "timestamp,rate\n0,1\n60,2,3\n", 3, 3, "expected 2 columns (timestamp,rate), got 3"),
    ("too few columns", "timestamp,rate\n0,1\n60\n", 3, 2, "expected 2 columns (timestamp,rate), got 1"),
    ("rate not a number", "timestamp,rate\n0,1\n60,abc\n", 3, 2, "rate: 'abc' is not a number"),
    ("rate nan", "timestamp,rate\n0,nan\n60,1\n", 2, 2, "rate: 'nan' is not a finite number"),
    ("rate inf", "timestamp,rate\n0,1\n60,inf\n", 3, 2, "rate: 'inf' is not a finite number"),
    ("negative rate", "timestamp,rate\n0,1\n60,-1\n", 3, 2, "rate: '-1' is negative"),
    ("timestamp not a number", "timestamp,rate\n0,1\nsoon,2\n", 3, 1, "timestamp: 'soon' is not a number"),
    (
        "mixed timestamp kinds",
        "timestamp,rate\n2024-01-01T00:00:00,1\n60,2\n",
        3,
        1,
        "timestamp: '60' is not an ISO 8601 time or Unix seconds (this file's timestamps are ISO 8601",
    ),
    ("repeated timestamp", "timestamp,rate\n0,1\n60,1\n60,1\n", 4, 1, "timestamp: '60' is not after the previous"),
    ("decreasing timestamp", "timestamp,rate\n0,1\n60,1\n30,1\n", 4, 1, "timestamp: '30' is not after the previous"),
    (
        "irregular step",
        "timestamp,rate\n0,1\n60,1\n120,1\n240,1\n300,1\n",
        5,
        1,
        "timestamp: '240' is 120 s after the previous row, but the series' step is 60 s",
    ),
    ("jitter above tolerance", "timestamp,rate\n0,1\n60,1\n124,1\n180,1\n", 4, 1, "timestamp: '124' is 64 s after"),
    ("single row", "timestamp,rate\n0,1\n", 2, 1, "a rate series needs at least 2 rows"),
    ("blank lines keep line numbers", "timestamp,rate\n\n0,1\n\n60,x\n", 5, 2, "rate: 'x' is not a number"),
    (
        "log wrong columns",
        "timestamp,input_tokens,output_tokens\n0,1,2\n1,2\n",
        3,
        3,
        "expected 3 columns (timestamp,input_tokens,output_tokens), got 2",
    ),
    ("log negative tokens", "timestamp,input_tokens,output_tokens\n0,-5,2\n", 2, 2, "input_tokens: '-5' is negative"),
    (
        "log fractional tokens",
        "timestamp,input_tokens,output_tokens\n0,5,2.5\n",
        2,
        3,
        "output_tokens: '2.5' is not a whole number",
    ),
    ("log bad timestamp", "timestamp\n0\n1\nlater\n", 4, 1, "timestamp: 'later' is not a number"),
    ("log bad iso", "timestamp\n2024-01-01T00:00:00\n2024-01-32T00:00:00\n", 3, 1, "timestamp: '2024-01-32T00:00:00'"),
    ("unterminated quote", 'timestamp,rate\n0,1\n60,"2\n', 3, 1, "malformed CSV"),
    # Valid-looking numbers that are no time: refused by range, before datetime or numpy see them.
    ("timestamp 1e300", "timestamp,rate\n1e300,1\n2e300,2\n", 2, 1, "timestamp: '1e300' is outside 1970-01-01..9999"),
    ("timestamp in ms", "timestamp,rate\n1700000000000,1\n1700000060000,2\n", 2, 1, "timestamp: '1700000000000' is"),
    ("negative timestamp", "timestamp\n-1e12\n1e12\n", 2, 1, "timestamp: '-1e12' is outside 1970-01-01..9999"),
    ("log 1e300 then 1", "timestamp\n1e300\n1\n", 2, 1, "timestamp: '1e300' is outside"),
    ("log later row out of range", "timestamp\n1\n2\n1e300\n", 4, 1, "timestamp: '1e300' is outside"),
    ("iso before 1970", "timestamp,rate\n1969-12-31T23:59:00,1\n1970-01-01T00:00:00,1\n", 2, 1, "timestamp: '1969-12"),
    ("iso after 9999 with a zone", "timestamp\n9999-12-31T23:59:00-01:00\n", 2, 1, "timestamp: '9999-12-31T23:59"),
    (
        "log spanning too many bins",
        "timestamp\n1000\n0\n2e9\n",
        4,
        1,
        "timestamp: '2e9' is 63.38 years after the earliest request ('0', line 3): binned at 60 s that is 33,333,334"
        " bins, more than the maximum of 20,000,000",
    ),
    (
        "input tokens beyond int64",
        "timestamp,input_tokens,output_tokens\n1,99999999999999999999999,3\n",
        2,
        2,
        "input_tokens: '99999999999999999999999' is too large (at most 9,007,199,254,740,991)",
    ),
    (
        "output tokens of 2**53",
        "timestamp,input_tokens,output_tokens\n1,1,3\n2,1,9007199254740992\n",
        3,
        3,
        "output_tokens: '9007199254740992' is too large",
    ),
    ("a megabyte cell is cut short", "timestamp,rate\n0,1\n60," + "x" * 100_000 + "\n", 3, 2, "rate: 'xxx"),
]


@pytest.mark.parametrize(
    ("content", "line", "column", "message"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_format_errors_name_file_line_column(
    tmp_path: Path, content: str, line: int, column: int, message: str
) -> None:
    path = write(tmp_path / "trace.csv", content)
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    error = caught.value
    assert (error.path, error.line, error.column) == (str(path), line, column), error
    assert error.message.startswith(message), error.message
    assert str(error) == f"{path}:{line}:{column}: {error.message}"
    assert isinstance(error, ValueError)


def test_errors_quote_at_most_a_few_dozen_characters_of_a_cell(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.csv", "timestamp,rate\n0,1\n60," + "x" * 100_000 + "\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert len(str(caught.value)) < 200 and "(100,000 characters)" in str(caught.value)


def test_the_largest_token_count_and_the_last_second_of_9999_load(tmp_path: Path) -> None:
    text = "timestamp,input_tokens,output_tokens\n253402300799,9007199254740991,0\n0,0,0\n"
    log = load_request_log(write(tmp_path / "log.csv", text))
    assert log.times.tolist() == [0.0, 253_402_300_799.0]
    assert log.input_tokens is not None and log.input_tokens.tolist() == [0, 2**53 - 1]


# Sizes that would need more than MAX_BINS (20 M) bins: refused with the file's name before anything is allocated
# (a 3-row series at 1e-9 s asked numpy for 1.31 TiB; a request log at that step was OOM-killed).
STEP_LIMIT_CASES: list[tuple[str, str, float, str]] = [
    ("rate series at 1 ns", "timestamp,rate\n0,1\n60,2\n120,3\n", 1e-9, "resampling 3 min to a step of 1e-09 s makes"),
    ("rate series at 1e-300 s", "timestamp,rate\n0,1\n60,2\n120,3\n", 1e-300, "more than the maximum of 20,000,000"),
    ("rate series, a day at 1 ms", "timestamp,rate\n0,1\n86400,2\n", 1e-3, "172,800,000 bins, more than the maximum"),
    ("request log at 1 ns", "timestamp\n0\n60\n120\n", 1e-9, ":4:1: timestamp: '120' is 2 min after the earliest"),
    ("request log at 1e-300 s", "timestamp\n0\n1\n", 1e-300, ":3:1: timestamp: '1' is 1 s after the earliest"),
]


@pytest.mark.parametrize(
    ("content", "step", "message"), [c[1:] for c in STEP_LIMIT_CASES], ids=[c[0] for c in STEP_LIMIT_CASES]
)
def test_binning_and_resampling_beyond_the_bin_limit_are_refused(
    tmp_path: Path, content: str, step: float, message: str
) -> None:
    path = write(tmp_path / "trace.csv", content)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning on the way either
        with pytest.raises(ValueError) as caught:
            load_trace(path, step_s=step)
    text = str(caught.value)
    assert text.startswith(str(path)) and message in text and "more than the maximum of 20,000,000" in text, text


def test_the_bin_limit_is_the_simulators() -> None:
    from autoscaler.sim.scenario import MAX_TRACE_BINS
    from autoscaler.traces.formats import MAX_BINS

    assert MAX_BINS == MAX_TRACE_BINS


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: bin_requests([0.0, 1e12], 60.0), "more than the maximum of 20,000,000"),
        (lambda: bin_requests([1.0, 1e300], 60.0), "more than the maximum of 20,000,000"),
        (lambda: bin_requests([0.0, 1.0], 1e-300), "more than the maximum of 20,000,000"),
        (lambda: bin_requests([5.0], 60.0, start=0.0, end=1e300), "more than the maximum of 20,000,000"),
        (lambda: bin_requests([1.0, 1e300], 60.0, start=0.0, end=600.0), "1 arrivals fall outside [start, end)"),
        (lambda: bin_requests([-1e300, 1.0], 60.0, start=0.0, end=600.0), "1 arrivals fall outside"),
        (lambda: bin_requests([float("nan")], 60.0), "arrival times must be finite"),
        (lambda: resample(RateSeries(0.0, 60.0, np.ones(3)), 1e-9), "180,000,000,000 bins, more than the maximum"),
        (lambda: resample(RateSeries(0.0, 1e-9, np.ones(3)), 1e-300), "more than the maximum of 20,000,000"),
        (lambda: resample(RateSeries(0.0, 60.0, np.full(3, 1e308)), 45.0), "too large to resample"),
    ],
)
def test_bin_requests_and_resample_refuse_sizes_beyond_the_limit(call: object, message: str) -> None:
    assert callable(call)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError) as caught:
            call()
    assert message in str(caught.value)


def test_resample_to_a_huge_step_is_one_bin() -> None:
    series = resample(RateSeries(0.0, 1e-300, np.ones(4)), 1e300)
    assert len(series) == 1 and series.rates.tolist() == [1.0]


@pytest.mark.parametrize(
    ("thing", "expected"),
    [
        (RateSeries(1e300, 60.0, np.ones(2)), "span 2 min from Unix second 1e+300, mean 1 req/s"),
        (RateSeries(0.0, 60.0, np.full(2, 1e308)), "mean 1e+308 req/s, peak 1e+308 req/s"),
        (RateSeries(0.0, 3.2e9, np.ones(2)), "span 202.8 years from 1970-01-01T00:00:00Z"),
        (
            RequestLog(np.array([0.0, 1e10])),
            "span 316.9 years from 1970-01-01T00:00:00Z, mean 2e-10 req/s, peak not"
            " computed (more than 20,000,000 bins of 60 s)",
        ),
        (RequestLog(np.array([5.0, 5.0, 5.0])), "all at one instant: no mean rate, peak 0.05 req/s"),
    ],
)
def test_summaries_of_extreme_series_do_not_overflow(thing: RateSeries | RequestLog, expected: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        line = summarise(thing) if isinstance(thing, RateSeries) else summarise_request_log(thing)
    assert expected in line, line


def test_error_string_matches_the_documented_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rows = "".join(f"{60 * i},1\n" for i in range(15))
    Path("trace.csv").write_text(f"timestamp,rate\n{rows}900,abc\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace("trace.csv")
    assert str(caught.value) == "trace.csv:17:2: rate: 'abc' is not a number"


def test_errors_inside_gzip_files_use_the_decompressed_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.csv.gz", "timestamp,rate\n0,1\n60,-2\n")
    with pytest.raises(TraceFormatError, match=r"trace\.csv\.gz:3:2: rate: '-2' is negative"):
        load_trace(path)


@pytest.mark.parametrize(
    ("raw", "line", "column", "message"),
    [
        (b"\x1f\x8b\x08\x00garbage", 1, 1, "not a valid gzip file"),
        (b"timestamp,rate\n0,1\n60,\xff\n", 3, 4, "not UTF-8 text (byte 0xff)"),
    ],
)
def test_binary_garbage_is_a_format_error(tmp_path: Path, raw: bytes, line: int, column: int, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(raw)
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert (caught.value.line, caught.value.column) == (line, column)
    assert caught.value.message.startswith(message)


def test_request_log_loader_rejects_a_rate_series(tmp_path: Path) -> None:
    path = write(tmp_path / "r.csv", "timestamp,rate\n0,1\n60,1\n")
    with pytest.raises(TraceFormatError, match="not a request log"):
        load_request_log(path)


def test_trace_format_error_pickles_with_its_attributes() -> None:
    error = pickle.loads(pickle.dumps(TraceFormatError("a.csv", 3, 2, "rate: 'x' is not a number")))
    assert (error.path, error.line, error.column, error.message) == ("a.csv", 3, 2, "rate: 'x' is not a number")
    assert str(error) == "a.csv:3:2: rate: 'x' is not a number"


def test_missing_file_is_not_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "absent.csv")


# ---------------------------------------------------------------------------------------------------------------------
# Speed: the simulator loads 14-day traces at 15 s; the bound is ~10x what a laptop needs, to catch an O(n²) or a
# per-row Python-object regression, not to benchmark.


def test_large_files_load_completely(tmp_path: Path) -> None:
    # Load speed is measured by benchmarks, not asserted here; this checks the sizes the benchmarks use load whole.
    rng = np.random.default_rng(3)
    series = RateSeries(1_700_000_000.0, 15.0, np.round(rng.random(14 * 86_400 // 15) * 300, 3))
    write_rate_series(series, tmp_path / "14d.csv.gz")
    times = np.sort(1_700_000_000.0 + rng.random(20_000) * 3600)
    log = RequestLog(times, rng.integers(1, 4000, 20_000), rng.integers(1, 500, 20_000))
    write_request_log(log, tmp_path / "log.csv")
    loaded = load_trace(tmp_path / "14d.csv.gz")
    binned = load_trace(tmp_path / "log.csv")
    assert len(loaded) == 80_640 and binned.total_requests == pytest.approx(20_000)
    assert np.array_equal(loaded.rates, series.rates)


def test_summarise_names_rows_step_span_mean_and_peak() -> None:
    line = summarise(RateSeries(0.0, 60.0, np.array([1.0, 3.0])))
    assert line == "2 rows, step 60 s, span 2 min from 1970-01-01T00:00:00Z, mean 2 req/s, peak 3 req/s"
