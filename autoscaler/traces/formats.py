"""Canonical trace formats: what the simulator and the forecasters read.

Two CSV formats, told apart by their header (the first line):

**Request log** — one row per request, header ``timestamp`` or ``timestamp,input_tokens,output_tokens``::

    timestamp,input_tokens,output_tokens
    1700158546.68059,374,44
    1700158550.995169,396,109

Rows need not be sorted. Token counts, when present, are non-negative whole numbers below 2**53 (exact in a float64).
``load_trace`` bins a request
log into a rate series: the first bin starts at the first request, each bin's rate is its request count divided by
the step (default 60 s), so ``sum(rates) * step`` is exactly the number of requests.

**Rate series** — requests per second over a regular step, header ``timestamp,rate``::

    timestamp,rate
    2023-11-16T18:15:00,5.25
    2023-11-16T18:16:00,6.1

Each timestamp is the start of its bin; the step is the time between rows and must be the same on every row, up to a
jitter of 5 % of the step: with the step measured from the first row to the last, row ``i`` must be within 5 % of a
step of ``start + i * step`` (the time it is then taken as).
Timestamps strictly increase; rates are finite and >= 0. The last bin lasts one step.

In both formats:

- a timestamp is Unix seconds (a number, fractions allowed) or ISO 8601 (``2023-11-16T18:15:46.68``,
  ``2023-11-16 18:15:46``, ``...Z`` or ``...+02:00``); an ISO time without a zone is UTC. All rows of a file use the
  kind of timestamp its first row uses. Timestamps lie between 1970-01-01 and the end of 9999 (Unix seconds 0 to
  253,402,300,799: what an ISO 8601 time can say);
- binning a request log or resampling a rate series makes at most :data:`MAX_BINS` (20,000,000) bins, the simulator's
  limit: a longer span (or a shorter step) is an error, raised before anything is allocated;
- a file whose name ends in ``.gz`` (or that starts with the gzip magic bytes) is decompressed transparently;
- fields may be surrounded by spaces or double quotes; blank lines are ignored; the text is UTF-8.

A malformed file raises :class:`TraceFormatError` naming the file, line and column (both counted from 1), e.g.
``trace.csv:17:2: rate: 'abc' is not a number``.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import math
import os
import re
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Step used when a request log is binned and the caller gives none.
DEFAULT_REQUEST_LOG_STEP_S = 60.0
#: How far (as a fraction of the step) a rate series' timestamps may wander from a regular grid. Exported metrics
#: are stamped when they were scraped, a few ms to a second off the nominal step; anything larger is a gap.
STEP_JITTER_TOLERANCE = 0.05

REQUEST_LOG_HEADERS: tuple[tuple[str, ...], ...] = (("timestamp",), ("timestamp", "input_tokens", "output_tokens"))
RATE_SERIES_HEADER: tuple[str, ...] = ("timestamp", "rate")
_EXPECTED_HEADERS = (
    "'timestamp,rate' (rate series) or 'timestamp' / 'timestamp,input_tokens,output_tokens' (request log)"
)
_GZIP_MAGIC = b"\x1f\x8b"

#: Most bins :func:`bin_requests` and :func:`resample` make (and the loaders with them): the simulator's limit
#: (``autoscaler.sim.scenario.MAX_TRACE_BINS``), 160 MB of float64 rates. A request log spanning 1970 to 2200 at a
#: 60 s step would need 121 million bins: refused before anything is allocated.
MAX_BINS = 20_000_000
#: Timestamps are Unix seconds from 1970-01-01T00:00:00Z (0) up to the end of year 9999, the range an ISO 8601 time
#: (and Python's datetime) can express; anything else is a unit mistake (ms, ns) or garbage.
MIN_UNIX_SECONDS = 0.0
MAX_UNIX_SECONDS = 253_402_300_800.0  # 10000-01-01T00:00:00Z, excluded
#: Token counts must be below 2**53: every such whole number is exact in the float64 the CSV is parsed as, and fits
#: the int64 arrays.
MAX_TOKENS = 2**53 - 1
#: Most decimal places rates are rounded to when written: a float64 has 15-17 significant digits.
MAX_DECIMALS = 15


class TraceFormatError(ValueError):
    """A trace file is malformed; ``str()`` reads ``path:line:column: message`` (line and column from 1)."""

    def __init__(self, path: str | os.PathLike[str], line: int, column: int, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.message = message
        super().__init__(f"{self.path}:{line}:{column}: {message}")

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[str, int, int, str]]:
        # ValueError pickles only ``args``; keep the four attributes when an error crosses a process boundary.
        return (type(self), (self.path, self.line, self.column, self.message))


@dataclass(frozen=True, eq=False)
class RateSeries:
    """Requests per second in consecutive bins of ``step_s`` seconds, starting at ``start`` (Unix seconds).

    ``rates`` is a read-only float64 copy. Equality is identity (``eq=False``): comparing numpy arrays with ``==``
    has no single truth value, so compare ``rates`` with ``np.array_equal`` instead.
    """

    start: float
    step_s: float
    rates: FloatArray
    source: str = ""

    def __post_init__(self) -> None:
        rates = np.array(self.rates, dtype=np.float64, copy=True)
        if rates.ndim != 1:
            raise ValueError(f"rates must be one-dimensional, got shape {rates.shape}")
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"step_s must be a positive number of seconds, got {self.step_s!r}")
        if not math.isfinite(self.start):
            raise ValueError(f"start must be finite Unix seconds, got {self.start!r}")
        if rates.size and not (np.all(np.isfinite(rates)) and rates.min() >= 0):
            raise ValueError("rates must be finite and >= 0")
        rates.setflags(write=False)
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "start", float(self.start))
        object.__setattr__(self, "step_s", float(self.step_s))

    @property
    def times(self) -> FloatArray:
        """Start time (Unix seconds) of each bin."""
        return self.start + self.step_s * np.arange(self.rates.size, dtype=np.float64)

    @property
    def duration_s(self) -> float:
        return float(self.rates.size * self.step_s)

    @property
    def end(self) -> float:
        """End of the last bin (Unix seconds)."""
        return self.start + self.duration_s

    @property
    def total_requests(self) -> float:
        return float(self.rates.sum() * self.step_s)

    def __len__(self) -> int:
        return int(self.rates.size)


@dataclass(frozen=True, eq=False)
class RequestLog:
    """Arrival times (Unix seconds, sorted) and, when the log has them, token counts per request."""

    times: FloatArray
    input_tokens: IntArray | None = None
    output_tokens: IntArray | None = None
    source: str = ""

    def __post_init__(self) -> None:
        times = np.array(self.times, dtype=np.float64, copy=True)
        if times.ndim != 1:
            raise ValueError(f"times must be one-dimensional, got shape {times.shape}")
        tokens = [self.input_tokens, self.output_tokens]
        if (tokens[0] is None) != (tokens[1] is None):
            raise ValueError("give both input_tokens and output_tokens, or neither")
        arrays: list[IntArray | None] = [None if t is None else np.array(t, dtype=np.int64, copy=True) for t in tokens]
        for arr in arrays:
            if arr is not None and arr.shape != times.shape:
                raise ValueError("token arrays must have one entry per request")
        if times.size > 1 and np.any(np.diff(times) < 0):
            # A stable sort keeps tokens attached to their request and equal times in file order.
            order = np.argsort(times, kind="stable")
            times = times[order]
            arrays = [None if a is None else a[order] for a in arrays]
        times.setflags(write=False)
        for tokens_array in arrays:
            if tokens_array is not None:
                tokens_array.setflags(write=False)
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "input_tokens", arrays[0])
        object.__setattr__(self, "output_tokens", arrays[1])

    def __len__(self) -> int:
        return int(self.times.size)


# ---------------------------------------------------------------------------------------------------------------------
# Reading


@dataclass
class CsvTable:
    """Rows of a CSV file with the physical line each came from (blank lines dropped, fields stripped)."""

    path: str
    rows: list[list[str]]
    lines: list[int]


#: The most a gzip trace may expand to, bytes (the public traces the project reads are under 50 MB uncompressed).
MAX_DECOMPRESSED_BYTES = 1 << 30


def read_text(path: str | os.PathLike[str]) -> str:
    """Whole file as text, gunzipped when it is gzip; undecodable bytes are reported with their line."""
    raw = Path(path).read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        try:
            # Read up to the limit, not whole: a few MB of gzip can expand to tens of GB (a "zip bomb" took 10.5 GB
            # of memory and minutes before failing).
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
                raw = stream.read(MAX_DECOMPRESSED_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(path, 1, 1, f"not a valid gzip file ({exc})") from exc
        if len(raw) > MAX_DECOMPRESSED_BYTES:
            limit = f"{MAX_DECOMPRESSED_BYTES / 2**20:,.0f} MiB"
            raise TraceFormatError(path, 1, 1, f"expands to more than {limit}: split it into smaller files")
    # A byte-order mark is dropped first: positions in the error count from the text after it.
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TraceFormatError(path, line, column, f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from exc


#: One CSV field, consumed left to right so that a match never starts inside a quoted field: a quoted field followed
#: by spaces or tabs up to the delimiter or the end of the line (group ``quoted``: the field without that padding), a
#: quoted field, an unquoted field, or any one character (a delimiter, a line break, a stray quote).
_CSV_TOKEN = re.compile(
    r'(?P<quoted>[ \t]*"(?:[^"]|"")*")[ \t]+(?=[,\r\n]|\Z)|[ \t]*"(?:[^"]|"")*"|[^,\r\n"][^,\r\n]*|.',
    re.DOTALL,
)
_PADDED_QUOTE = re.compile(r'"[ \t]+(?:[,\r\n]|\Z)')


def _unpad_quoted_fields(text: str) -> str:
    """``text`` with the spaces and tabs after each quoted field (before its delimiter) removed: the csv module's
    ``skipinitialspace`` accepts padding before a quoted field, its strict mode none after one (``"0" ,1``)."""
    return _CSV_TOKEN.sub(lambda m: m.group("quoted") or m.group(0), text)


def read_csv(path: str | os.PathLike[str]) -> CsvTable:
    """Parse a CSV file into stripped fields, remembering each row's line number for error messages."""
    text = read_text(path)
    try:
        return _parse_csv(path, text)
    except TraceFormatError:
        # Padding after a quoted field is allowed as before one; the text is only rewritten (line breaks kept) when
        # the strict parse failed and the file has such padding, so well-formed files are parsed once, unchanged.
        if not _PADDED_QUOTE.search(text):
            raise
    return _parse_csv(path, _unpad_quoted_fields(text))


def _parse_csv(path: str | os.PathLike[str], text: str) -> CsvTable:
    reader = csv.reader(io.StringIO(text), skipinitialspace=True, strict=True)
    rows: list[list[str]] = []
    lines: list[int] = []
    start_line = 1
    try:
        for row in reader:
            # reader.line_num is the line the row *ended* on; a quoted field may span lines, report where it began.
            if row and any(cell.strip() for cell in row):
                rows.append([cell.strip() for cell in row])
                lines.append(start_line)
            start_line = reader.line_num + 1
    except csv.Error as exc:
        raise TraceFormatError(path, reader.line_num, 1, f"malformed CSV ({exc})") from exc
    return CsvTable(str(path), rows, lines)


def parse_floats(
    table: CsvTable,
    column: int,
    name: str,
    *,
    row_offset: int = 0,
    minimum: float | None = None,
) -> FloatArray:
    """Column ``column`` (0-based) of ``table.rows[row_offset:]`` as float64, finite and >= ``minimum``."""
    rows = table.rows[row_offset:]
    try:
        values = np.array([float(row[column]) for row in rows], dtype=np.float64)
    except ValueError:
        # The fast path failed somewhere: walk the column to name the first bad cell.
        for i, row in enumerate(rows):
            try:
                float(row[column])
            except ValueError:
                raise _cell_error(table, row_offset + i, column, name, "is not a number") from None
        raise  # pragma: no cover - float() failed above, so the loop finds the cell
    bad = ~np.isfinite(values)
    if minimum is not None:
        bad |= values < minimum
    if bad.any():
        i = int(np.argmax(bad))
        if not math.isfinite(values[i]):
            what = "is not a finite number"
        else:
            what = "is negative" if minimum == 0 else f"is below {minimum:g}"
        raise _cell_error(table, row_offset + i, column, name, what)
    return values


def parse_whole_numbers(table: CsvTable, column: int, name: str, *, row_offset: int = 0) -> IntArray:
    """Column of non-negative whole numbers (token counts); ``12.0`` is accepted, ``12.5`` is not."""
    values = parse_floats(table, column, name, row_offset=row_offset, minimum=0.0)
    fractional = values != np.floor(values)
    if fractional.any():
        raise _cell_error(table, row_offset + int(np.argmax(fractional)), column, name, "is not a whole number")
    too_large = values > MAX_TOKENS
    if too_large.any():
        # Checked before the cast: a float beyond int64 would wrap to a negative count.
        raise _cell_error(
            table, row_offset + int(np.argmax(too_large)), column, name, f"is too large (at most {MAX_TOKENS:,})"
        )
    return values.astype(np.int64)


def parse_timestamps(table: CsvTable, column: int = 0, *, row_offset: int = 0) -> FloatArray:
    """Timestamps as Unix seconds: every row uses the kind (number or ISO 8601) of the first row."""
    rows = table.rows[row_offset:]
    if not rows:
        return np.empty(0, dtype=np.float64)
    if _is_number(rows[0][column]):
        values = parse_floats(table, column, "timestamp", row_offset=row_offset)
    else:
        values = _parse_iso_column(table, column, row_offset)
    outside = (values < MIN_UNIX_SECONDS) | (values >= MAX_UNIX_SECONDS)
    if outside.any():
        raise _cell_error(table, row_offset + int(np.argmax(outside)), column, "timestamp", _OUT_OF_RANGE)
    return values


_OUT_OF_RANGE = (
    "is outside 1970-01-01..9999-12-31 (Unix seconds 0 to 253,402,300,799; timestamps are seconds, not ms or ns)"
)


def _parse_iso_column(table: CsvTable, column: int, row_offset: int) -> FloatArray:
    rows = table.rows[row_offset:]
    try:
        return np.array([_iso_to_unix(row[column]) for row in rows], dtype=np.float64)
    except ValueError:
        for i, row in enumerate(rows):
            cell = row[column]
            try:
                _iso_to_unix(cell)
            except ValueError:
                hint = " (this file's timestamps are ISO 8601, like its first row)" if _is_number(cell) else ""
                raise _cell_error(
                    table, row_offset + i, column, "timestamp", f"is not an ISO 8601 time or Unix seconds{hint}"
                ) from None
        raise  # pragma: no cover


def parse_time(text: str) -> float:
    """One timestamp (Unix seconds or ISO 8601, naive = UTC) as Unix seconds; ``ValueError`` if it is neither."""
    text = text.strip()
    if _is_number(text):
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{_shown(text)} is not a finite time")
    else:
        try:
            value = _iso_to_unix(text)
        except ValueError:
            raise ValueError(f"{_shown(text)} is neither Unix seconds nor an ISO 8601 time") from None
    if not MIN_UNIX_SECONDS <= value < MAX_UNIX_SECONDS:
        raise ValueError(f"{_shown(text)} {_OUT_OF_RANGE}")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _iso_to_unix(text: str) -> float:
    # datetime.fromisoformat (3.11+) reads any ISO 8601 form used in traces, including 7 fractional digits
    # (truncated to microseconds) and zones; it is C code, ~1 µs per value.
    stamp = datetime.fromisoformat(text)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _cell_error(table: CsvTable, row_index: int, column: int, name: str, what: str) -> TraceFormatError:
    value = table.rows[row_index][column]
    return TraceFormatError(table.path, table.lines[row_index], column + 1, f"{name}: {_shown(value)} {what}")


def _shown(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut short: a malformed cell can be megabytes long."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} characters)"


def check_columns(table: CsvTable, expected: int, names: str, *, row_offset: int = 0) -> None:
    """Every row from ``row_offset`` on has exactly ``expected`` fields."""
    for i in range(row_offset, len(table.rows)):
        row = table.rows[i]
        if len(row) != expected:
            # Point at the first extra field, or where the first missing one should be.
            raise TraceFormatError(
                table.path,
                table.lines[i],
                min(len(row), expected) + 1,
                f"expected {expected} column{'s' if expected != 1 else ''} ({names}), got {len(row)}",
            )


def _header_kind(table: CsvTable) -> str:
    """'rate' or 'requests', from the header row; errors for empty files, missing or unknown headers."""
    if not table.rows:
        raise TraceFormatError(table.path, 1, 1, f"empty file: expected a header, {_EXPECTED_HEADERS}")
    header = tuple(cell.lower() for cell in table.rows[0])
    line = table.lines[0]
    if header == RATE_SERIES_HEADER:
        kind = "rate"
    elif header in REQUEST_LOG_HEADERS:
        kind = "requests"
    else:
        first = table.rows[0][0]
        if _is_number(first) or _looks_like_iso(first):
            raise TraceFormatError(table.path, line, 1, f"missing header: expected {_EXPECTED_HEADERS}")
        known = ("timestamp", "rate", "input_tokens", "output_tokens")
        for column, name in enumerate(header):
            if name not in known:
                raise TraceFormatError(
                    table.path,
                    line,
                    column + 1,
                    f"unknown header {table.rows[0][column]!r}: expected {_EXPECTED_HEADERS}",
                )
        raise TraceFormatError(
            table.path, line, 1, f"unknown header {','.join(table.rows[0])!r}: expected {_EXPECTED_HEADERS}"
        )
    if len(table.rows) == 1:
        raise TraceFormatError(table.path, line + 1, 1, "no data rows after the header")
    return kind


def _looks_like_iso(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _rate_series_from_table(table: CsvTable, source: str) -> RateSeries:
    check_columns(table, 2, "timestamp,rate", row_offset=1)
    times = parse_timestamps(table, 0, row_offset=1)
    rates = parse_floats(table, 1, "rate", row_offset=1, minimum=0.0)
    if times.size < 2:
        raise TraceFormatError(
            table.path, table.lines[1], 1, "a rate series needs at least 2 rows: its step is the time between rows"
        )
    diffs = np.diff(times)
    not_increasing = diffs <= 0
    if not_increasing.any():
        i = int(np.argmax(not_increasing)) + 1
        raise TraceFormatError(
            table.path,
            table.lines[1 + i],
            1,
            f"timestamp: {table.rows[1 + i][0]!r} is not after the previous row's {table.rows[i][0]!r}"
            " (a rate series' timestamps must strictly increase)",
        )
    # Row i is placed at start + i * step, the step from the first row to the last: every timestamp must be within
    # the jitter tolerance of its place on that grid. (Checking each interval against the median interval instead
    # let a step that changes part way through pass -- rows placed many steps from their time -- and refused
    # jitter within the tolerance, two neighbours off in opposite directions.)
    grid_step = float(times[-1] - times[0]) / (times.size - 1)
    off_grid = times - (times[0] + grid_step * np.arange(times.size, dtype=np.float64))
    outside = np.abs(off_grid) > STEP_JITTER_TOLERANCE * grid_step
    if outside.any():
        raise _irregular_step_error(table, diffs, off_grid, outside, grid_step)
    return RateSeries(start=float(times[0]), step_s=_snap_to_ms(grid_step), rates=rates, source=source)


def _irregular_step_error(
    table: CsvTable, diffs: FloatArray, off_grid: FloatArray, outside: npt.NDArray[np.bool_], grid_step: float
) -> TraceFormatError:
    """The error for a rate series whose timestamps are not on a regular grid, naming the row to look at: a gap (or
    an interval no jitter within the tolerance can make) where there is one, else the first row off the grid."""
    median = float(np.median(diffs))  # robust to a single gap, so the error names the gap's row
    gaps = np.abs(diffs - median) > 2 * STEP_JITTER_TOLERANCE * median
    if gaps.any():
        i = int(np.argmax(gaps)) + 1
        return TraceFormatError(
            table.path,
            table.lines[1 + i],
            1,
            f"timestamp: {table.rows[1 + i][0]!r} is {float(diffs[i - 1]):g} s after the previous row, but"
            f" the series' step is {median:g} s (a rate series needs a regular step; gaps must be filled)",
        )
    i = int(np.argmax(outside))  # > 0: the first row is the grid's start
    off = float(off_grid[i])
    return TraceFormatError(
        table.path,
        table.lines[1 + i],
        1,
        f"timestamp: {table.rows[1 + i][0]!r} is {float(diffs[i - 1]):g} s after the previous row and"
        f" {abs(off):.4g} s {'after' if off > 0 else 'before'} its place on the series' regular grid"
        f" ({table.rows[1][0]!r} + {i} x {grid_step:.6g} s, the step from the first row to the last), more than the"
        f" jitter of {STEP_JITTER_TOLERANCE:.0%} of a step allowed (a rate series needs the same step on every row;"
        " gaps must be filled)",
    )


def _snap_to_ms(step: float) -> float:
    # Timestamps written with ms (or coarser) precision give steps like 14.999999: snap to a whole ms so that
    # resampling and bin arithmetic stay exact.
    snapped = round(step * 1000) / 1000
    return snapped if snapped > 0 and abs(snapped - step) <= 1e-6 * step + 1e-9 else step


def _request_log_from_table(table: CsvTable, source: str) -> tuple[RequestLog, FloatArray]:
    """The log, and its timestamps in file order (``times[i]`` is on ``table.lines[i + 1]``) for error messages."""
    n_columns = len(table.rows[0])
    check_columns(table, n_columns, ",".join(table.rows[0]).lower(), row_offset=1)
    times = parse_timestamps(table, 0, row_offset=1)
    if n_columns == 3:
        inputs = parse_whole_numbers(table, 1, "input_tokens", row_offset=1)
        outputs = parse_whole_numbers(table, 2, "output_tokens", row_offset=1)
        return RequestLog(times, inputs, outputs, source=source), times
    return RequestLog(times, source=source), times


def _check_log_span(table: CsvTable, times: FloatArray, step_s: float) -> None:
    """Refuse, naming the latest request's row, a log whose span needs more than :data:`MAX_BINS` bins of
    ``step_s`` (checked before :func:`bin_requests` allocates them)."""
    if times.size == 0:
        return
    first, last = int(np.argmin(times)), int(np.argmax(times))
    span = float(times[last] - times[first])
    bins = _bin_count(span / step_s) if span > 0 else 1.0
    if bins > MAX_BINS:
        raise TraceFormatError(
            table.path,
            table.lines[1 + last],
            1,
            f"timestamp: {_shown(table.rows[1 + last][0])} is {_fmt_seconds(span)} after the earliest request"
            f" ({_shown(table.rows[1 + first][0])}, line {table.lines[1 + first]}): binned at {step_s:g} s that is"
            f" {_fmt_count(bins)} bins, more than the maximum of {MAX_BINS:,} (use a longer step)",
        )


def sniff_format(path: str | os.PathLike[str]) -> str:
    """``"rate series"`` or ``"request log"``, from the header (errors as :func:`load_trace` would raise them)."""
    return "rate series" if _header_kind(read_csv(path)) == "rate" else "request log"


def load_request_log(path: str | os.PathLike[str]) -> RequestLog:
    """Read a canonical request log (sorted by time on the way in)."""
    table = read_csv(path)
    if _header_kind(table) != "requests":
        raise TraceFormatError(
            table.path, table.lines[0], 1, "this is a rate series ('timestamp,rate'), not a request log"
        )
    return _request_log_from_table(table, Path(path).name)[0]


def load_trace(path: str | os.PathLike[str], step_s: float | None = None, *, complete_bins: bool = False) -> RateSeries:
    """Read either canonical format (told apart by its header) as a rate series.

    A request log is binned into ``count / step_s`` per bin (``step_s`` defaults to 60 s); a rate series keeps its
    own step unless ``step_s`` is given, in which case it is :func:`resample`-d.

    The last bin of a binned request log is the one holding its last request: the log says nothing past that request,
    yet the bin's count is divided by the whole step (so that every request is kept, as the simulator needs). With
    ``complete_bins`` that partly observed bin is dropped (its requests with it), for uses that compare the rates
    with each other, such as scoring forecasts: a log of a constant 1 req/s ending 11 s into a 60 s bin would
    otherwise end with 0.18 req/s. A rate series is unaffected.
    """
    if step_s is not None and not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s!r}")
    table = read_csv(path)
    name = Path(path).name
    if _header_kind(table) == "rate":
        series = _rate_series_from_table(table, f"{name} (rate series)")
        if step_s is not None and not math.isclose(step_s, series.step_s, rel_tol=1e-12):
            try:
                series = resample(series, step_s)
            except ValueError as exc:  # too many bins, or rates too large: no row is at fault, name the file
                raise ValueError(f"{table.path}: {exc}") from None
        return series
    log, row_times = _request_log_from_table(table, name)
    step = DEFAULT_REQUEST_LOG_STEP_S if step_s is None else step_s
    _check_log_span(table, row_times, step)
    source = f"{name} (request log, {len(log)} requests)"
    series = bin_requests(log.times, step, source=source)
    if complete_bins:
        count = round(float(series.rates[-1]) * step)
        dropped = f"{count} request{'' if count == 1 else 's'}"
        source = f"{name} (request log, {len(log)} requests; its last, partly observed bin of {dropped} dropped)"
        series = RateSeries(series.start, series.step_s, series.rates[:-1], source)
    return series


# ---------------------------------------------------------------------------------------------------------------------
# Binning and resampling


def bin_requests(
    times: npt.ArrayLike, step_s: float, *, start: float | None = None, end: float | None = None, source: str = ""
) -> RateSeries:
    """Count arrivals in bins of ``step_s`` from ``start`` (default: the first arrival) and divide by the step.

    Without ``end`` the series stops with the bin holding the last arrival, so the total is conserved exactly:
    ``sum(rates) * step_s == len(times)``. With ``end`` (exclusive), the series covers ``[start, end)``;
    a last bin cut short by ``end`` is divided by the time it covers, so its rate is not diluted.
    """
    t = np.asarray(times, dtype=np.float64)
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s!r}")
    if t.size == 0 and (start is None or end is None):
        raise ValueError("no arrivals to bin: give start and end for an empty series")
    if not np.all(np.isfinite(t)):
        raise ValueError("arrival times must be finite")
    origin = float(t.min()) if start is None else float(start)
    if not math.isfinite(origin) or (end is not None and not math.isfinite(end)):
        raise ValueError(f"start and end must be finite, got {start!r} and {end!r}")
    # Sized (in floats, which cannot overflow) before anything is allocated or cast to int64.
    if end is None:
        span = float(t.max()) - origin
        _check_bin_count(math.floor(span / step_s) + 1.0 if span >= 0 else 0.0, span, step_s, "binning")
        n_bins = max(math.floor(span / step_s) + 1, 0)
        last_len = step_s
    else:
        span = float(end) - origin
        _check_bin_count(_bin_count(span / step_s), span, step_s, "binning")
        n_bins = max(math.ceil(span / step_s - 1e-9), 0)
        last_len = span - (n_bins - 1) * step_s if n_bins else step_s
    position = np.floor((t - origin) / step_s)
    inside = (position >= 0) & (position < n_bins)
    if not inside.all():
        raise ValueError(f"{int((~inside).sum())} arrivals fall outside [start, end)")
    index = position.astype(np.int64)
    counts = np.bincount(index, minlength=n_bins).astype(np.float64)
    rates = counts / step_s
    if n_bins and last_len < step_s:
        rates[-1] = counts[-1] / last_len
    return RateSeries(start=origin, step_s=float(step_s), rates=rates, source=source)


def _bin_count(bins: float) -> float:
    """``ceil(bins)`` (less a round-off allowance) as a float: ``inf`` and huge values stay comparable."""
    if not math.isfinite(bins) or bins > 1e15:
        return bins if bins == bins else math.inf  # nan (0/0 cannot happen, but be safe) counts as too many
    return float(max(math.ceil(bins - 1e-9), 0))


def _check_bin_count(bins: float, span_s: float, step_s: float, doing: str) -> None:
    if not bins <= MAX_BINS:
        raise ValueError(
            f"{doing} {_fmt_seconds(span_s)} to a step of {step_s:g} s makes {_fmt_count(bins)} bins, more than the"
            f" maximum of {MAX_BINS:,}: use a longer step"
        )


def _fmt_count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e15 else f"{n:.3g}"


def resample(series: RateSeries, step_s: float) -> RateSeries:
    """Same demand on another step: piecewise-constant hold to a finer step, time-weighted mean to a coarser one.

    Non-integer ratios are handled by integrating the piecewise-constant rate over each new bin's overlap with the
    old bins. The new series starts at the same time and covers at least the old span; a last bin that runs past the
    old end gets the mean rate of the part it covers (so totals are conserved exactly whenever the old duration is a
    multiple of the new step).
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s!r}")
    old_step = series.step_s
    rates = series.rates
    source = f"{series.source}, resampled {_fmt_seconds(old_step)} -> {_fmt_seconds(step_s)}".lstrip(", ")
    n_old = rates.size
    if step_s == old_step:
        return series
    if n_old == 0:
        return RateSeries(series.start, step_s, rates, source)
    _check_bin_count(max(_bin_count(series.duration_s / step_s), 1.0), series.duration_s, step_s, "resampling")
    with np.errstate(over="ignore", invalid="ignore"):
        new_rates = _resampled_rates(rates, old_step, step_s, series.duration_s)
    if not np.all(np.isfinite(new_rates)):
        raise ValueError(f"rates up to {float(rates.max()):g} req/s are too large to resample (the counts overflow)")
    return RateSeries(series.start, step_s, new_rates, source)


def _resampled_rates(rates: FloatArray, old_step: float, step_s: float, duration: float) -> FloatArray:
    n_old = rates.size
    ratio = old_step / step_s
    if ratio > 1 and _is_whole(ratio):
        # Finer by an integer factor: exact repetition, no floating-point integration error.
        return np.repeat(rates, round(ratio))
    if 0 < ratio < 1 and _is_whole(1 / ratio) and n_old % round(1 / ratio) == 0:
        factor = round(1 / ratio)
        return np.asarray(rates.reshape(-1, factor).mean(axis=1), dtype=np.float64)
    n_new = max(math.ceil(duration / step_s - 1e-9), 1)
    old_edges = np.arange(n_old + 1, dtype=np.float64) * old_step
    cumulative = np.concatenate(([0.0], np.cumsum(rates * old_step)))
    new_edges = np.minimum(np.arange(n_new + 1, dtype=np.float64) * step_s, duration)
    # Requests up to each new edge; the cumulative count is piecewise linear between old edges, so interpolation
    # is exact integration of the piecewise-constant rate.
    counts = np.diff(np.interp(new_edges, old_edges, cumulative))
    widths = np.diff(new_edges)
    return np.maximum(counts / widths, 0.0)  # max() clears -1e-17 round-off


def _is_whole(x: float) -> bool:
    if not math.isfinite(x):
        return False
    return abs(x - round(x)) <= 1e-9 * max(1.0, abs(x))


# ---------------------------------------------------------------------------------------------------------------------
# Writing


def write_rate_series(series: RateSeries, path: str | os.PathLike[str], *, decimals: int | None = None) -> None:
    """Write the canonical ``timestamp,rate`` CSV (Unix seconds); gzip it (deterministically) if ``path`` ends .gz.

    ``decimals`` (0 to :data:`MAX_DECIMALS`) rounds the rates (e.g. 3 for a small packaged file); by default they
    round-trip exactly. Nothing is written when the arguments are refused.
    """
    write_texts([(path, rate_series_text(series, decimals=decimals))])


def rate_series_text(series: RateSeries, *, decimals: int | None = None) -> str:
    """The text :func:`write_rate_series` writes (``ValueError`` when it would refuse the arguments)."""
    if decimals is not None and (
        isinstance(decimals, bool) or not isinstance(decimals, int) or not 0 <= decimals <= MAX_DECIMALS
    ):
        raise ValueError(f"decimals must be a whole number from 0 to {MAX_DECIMALS}, got {decimals!r}")
    if len(series) < 2:
        # The file carries its step only as the time between rows: one row could not be read back.
        raise ValueError(f"a rate series file needs at least 2 rows to carry its step; this one has {len(series)}")
    rates = series.rates if decimals is None else np.round(series.rates, decimals)
    times = series.times
    body = "".join(f"{_fmt_number(t)},{_fmt_number(r)}\n" for t, r in zip(times.tolist(), rates.tolist(), strict=True))
    return "timestamp,rate\n" + body


def write_request_log(log: RequestLog, path: str | os.PathLike[str], *, time_decimals: int = 6) -> None:
    """Write the canonical request log (``timestamp[,input_tokens,output_tokens]``, Unix seconds, µs by default)."""
    write_texts([(path, request_log_text(log, time_decimals=time_decimals))])


def request_log_text(log: RequestLog, *, time_decimals: int = 6) -> str:
    """The text :func:`write_request_log` writes."""
    stamps = [f"{t:.{time_decimals}f}" for t in log.times.tolist()]
    if log.input_tokens is None or log.output_tokens is None:
        return "timestamp\n" + "".join(f"{s}\n" for s in stamps)
    rows = zip(stamps, log.input_tokens.tolist(), log.output_tokens.tolist(), strict=True)
    return "timestamp,input_tokens,output_tokens\n" + "".join(f"{s},{i},{o}\n" for s, i, o in rows)


def _fmt_number(x: float) -> str:
    # repr() is the shortest text that reads back to the same float; drop a trailing ".0" to keep files small.
    text = repr(x)
    return text[:-2] if text.endswith(".0") else text


def write_texts(files: Sequence[tuple[str | os.PathLike[str], str]]) -> None:
    """Write each ``(path, text)`` (UTF-8; gzip-compressed, deterministically, when the path ends in ``.gz``), all or
    none: every file is first written beside its target, then all are renamed into place. When one cannot be
    written (a directory in the way, no space, no permission), none is replaced and the directories made for them
    are removed again (only a rename failing part way, once all were written, could leave the first ones in place);
    a crash never leaves a half-written file behind."""
    made: list[Path] = []
    staged: list[tuple[str, Path]] = []
    renamed = False
    try:
        for path, text in files:
            target = Path(path)
            data = text.encode("utf-8")
            if target.name.endswith(".gz"):
                buffer = io.BytesIO()
                # mtime=0 and no embedded file name: the same series always gives the same bytes (reviewable diffs).
                with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as gz:
                    gz.write(data)
                data = buffer.getvalue()
            if target.is_dir():  # os.replace would fail only once the files before it are in place
                raise OSError(f"cannot write {target}: it is a directory")
            made.extend(d for d in [target.parent, *target.parent.parents] if not d.exists())
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                staged.append((tmp, target))
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                # mkstemp creates the file 0600; give the trace the permissions a plain open() would have.
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
            except OSError as exc:  # name the file asked for, not the temporary one beside it
                raise OSError(f"cannot write {target}: {exc.strerror or exc}") from exc
        while staged:
            tmp, target = staged[0]
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise OSError(f"cannot write {target}: {exc.strerror or exc}") from exc
            renamed = True
            staged.pop(0)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        if not renamed:  # nothing is in place: the directories made for the files are empty again
            for directory in sorted(set(made), key=lambda d: len(d.parts), reverse=True):
                with contextlib.suppress(OSError):  # not empty after all, or gone: leave it
                    directory.rmdir()
        raise


# ---------------------------------------------------------------------------------------------------------------------
# Human-readable summaries (CLI output, logs)

_YEAR_S = 365.25 * 86400


def _fmt_seconds(seconds: float) -> str:
    if seconds >= 2 * _YEAR_S:
        return f"{seconds / _YEAR_S:.4g} years"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.4g} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.4g} h"
    if seconds >= 120:
        return f"{seconds / 60:.4g} min"
    return f"{seconds:.6g} s"


def describe_span(start: float, duration_s: float) -> str:
    """``14 d from 1970-01-01T00:00:00Z``."""
    try:
        begin = datetime.fromtimestamp(start, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):  # beyond what datetime can print (a series built in code)
        begin = f"Unix second {start:g}"
    return f"{_fmt_seconds(duration_s)} from {begin}"


def summarise(series: RateSeries) -> str:
    """One line: bins, step, span, mean and peak rate."""
    rates = series.rates
    # Divided before summing: the sum of rates near the float64 maximum would overflow.
    mean = float(np.sum(rates / rates.size)) if rates.size else 0.0
    peak = float(rates.max()) if rates.size else 0.0
    span = describe_span(series.start, series.duration_s)
    return (
        f"{len(series)} rows, step {_fmt_seconds(series.step_s)}, span {span},"
        f" mean {mean:.4g} req/s, peak {peak:.4g} req/s"
    )


def summarise_request_log(log: RequestLog, step_s: float = DEFAULT_REQUEST_LOG_STEP_S) -> str:
    """One line for a request log: requests, span, and the mean and peak rate over ``step_s`` bins.

    The mean is over the bins the peak is taken from (those :func:`bin_requests` makes: the first starts at the first
    request, the last holds the last one), so it is never above the peak printed beside it; ``n / (last - first)``
    was (two requests 64.3 s apart: mean 0.0311, peak 0.01667 req/s over 60 s bins)."""
    if len(log) == 0:
        return "0 requests"
    span = float(log.times[-1] - log.times[0])
    # every request at one instant has no rate to speak of ("mean nan req/s" said nothing)
    if span > 0:
        bins = math.floor(span / step_s) + 1.0  # as bin_requests counts them, in floats: no allocation, no overflow
        mean = f"mean {len(log) / bins / step_s:.4g} req/s"
    else:
        mean = "all at one instant: no mean rate"
    if span / step_s < MAX_BINS:
        peak = f"peak {float(bin_requests(log.times, step_s).rates.max()):.4g} req/s (over {_fmt_seconds(step_s)} bins)"
    else:  # a valid log, but too long to bin at this step: say so rather than allocate
        peak = f"peak not computed (more than {MAX_BINS:,} bins of {_fmt_seconds(step_s)})"
    return (
        f"{len(log)} rows, no step (a request log has one row per request),"
        f" span {describe_span(float(log.times[0]), span)}, {mean}, {peak}"
    )


__all__: Sequence[str] = (
    "DEFAULT_REQUEST_LOG_STEP_S",
    "MAX_BINS",
    "MAX_DECIMALS",
    "MAX_TOKENS",
    "MAX_UNIX_SECONDS",
    "MIN_UNIX_SECONDS",
    "STEP_JITTER_TOLERANCE",
    "RateSeries",
    "RequestLog",
    "TraceFormatError",
    "bin_requests",
    "load_request_log",
    "load_trace",
    "parse_time",
    "rate_series_text",
    "request_log_text",
    "resample",
    "sniff_format",
    "summarise",
    "summarise_request_log",
    "write_rate_series",
    "write_request_log",
    "write_texts",
)
