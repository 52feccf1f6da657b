"""Importers for the public traces in ``../shared/traces`` (``autoscaler trace convert FORMAT ...``).

Each importer reads an upstream format and returns a canonical :class:`~autoscaler.traces.formats.RequestLog` or
:class:`~autoscaler.traces.formats.RateSeries`; malformed input raises
:class:`~autoscaler.traces.formats.TraceFormatError` with the file, line and column.

- ``azure-llm`` — Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``, one row per request,
  timestamps like ``2023-11-16 18:15:46.6805900``, taken as UTC) -> request log. Several files are merged (a
  file given twice is refused: its requests would be counted twice).
- ``servegen`` — Alibaba ServeGen per-client chunk files -> rate series; see :func:`servegen_rate_series`.
- ``azure-functions`` — Azure Functions 2019 per-minute invocation counts (``1000_inv.csv``) -> rate series at 60 s.
- ``nab`` — Numenta Anomaly Benchmark ``timestamp,value`` -> rate series at the file's own step.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from autoscaler.traces.formats import (
    MAX_BINS,
    CsvTable,
    FloatArray,
    RateSeries,
    RequestLog,
    TraceFormatError,
    check_columns,
    parse_floats,
    parse_time,
    parse_timestamps,
    parse_whole_numbers,
    read_csv,
    resample,
)

PathLike = str | os.PathLike[str]

#: ServeGen's aggregation window when a file has a single row (so that its own step cannot be measured).
SERVEGEN_DEFAULT_WINDOW_S = 600.0
#: Default bin length of the rate series made from ServeGen arrivals.
SERVEGEN_DEFAULT_STEP_S = 60.0
AZURE_FUNCTIONS_STEP_S = 60.0
#: ServeGen: most arrivals expected in one window (all clients together), and over the whole trace. They are drawn one
#: by one (several float64 arrays of that size per window); the 14-day ``language/m-large`` has at most 350,000 in a
#: window and 237 million in all (15 s to draw). Larger inputs are refused before anything is drawn.
SERVEGEN_MAX_WINDOW_ARRIVALS = 10_000_000
SERVEGEN_MAX_ARRIVALS = 1_000_000_000
#: Smallest fitted shape (dist_arg1) of a window with requests. A Gamma shape k has a coefficient of variation
#: 1/sqrt(k) (0.001: cv 32; ServeGen's fits go down to 0.011, cv 9.6); below 0.01 a Weibull's mean,
#: scale x Γ(1 + 1/k), is beyond float64. Smaller shapes draw (almost) only zero intervals.
SERVEGEN_MIN_SHAPE = {"gamma": 0.001, "weibull": 0.01}

_NO_DIST, _GAMMA, _WEIBULL = 0, 1, 2
_DIST_CODES = {"": _NO_DIST, "gamma": _GAMMA, "weibull": _WEIBULL}
_CHUNK_RE = re.compile(r"^chunk-(\d+)-trace\.csv(\.gz)?$")

# Γ over an array without scipy (not a declared dependency); it only sees a few hundred values per window.
_gamma_ufunc = np.frompyfunc(math.gamma, 1, 1)


def gamma_function(x: FloatArray) -> FloatArray:
    """Euler's Γ, element-wise."""
    return np.asarray(_gamma_ufunc(x), dtype=np.float64)


# ---------------------------------------------------------------------------------------------------------------------
# Azure LLM inference 2023


def read_azure_llm(paths: PathLike | Sequence[PathLike]) -> RequestLog:
    """Requests of one or more Azure LLM inference 2023 files, merged and sorted by time.

    ``ContextTokens`` becomes ``input_tokens`` and ``GeneratedTokens`` ``output_tokens``. The upstream timestamps
    have 7 fractional digits, all of them multiples of 1 µs in the 2023 files; they are read to the microsecond.
    """
    files = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not files:
        raise ValueError("azure-llm needs at least one input file")
    # One file merged twice doubles the demand silently (a repeated glob, a file named by two paths): refused, as
    # servegen_files refuses a client given twice.
    seen: dict[Path, PathLike] = {}
    for path in files:
        real = resolved_path(Path(path))
        if real in seen:
            raise ValueError(f"{path}: given twice (also as {seen[real]}): each of its requests would be counted twice")
        seen[real] = path
    times: list[FloatArray] = []
    inputs: list[npt.NDArray[np.int64]] = []
    outputs: list[npt.NDArray[np.int64]] = []
    for path in files:
        table = read_csv(path)
        _expect_header(table, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
        check_columns(table, 3, "TIMESTAMP,ContextTokens,GeneratedTokens", row_offset=1)
        times.append(parse_timestamps(table, 0, row_offset=1))
        inputs.append(parse_whole_numbers(table, 1, "ContextTokens", row_offset=1))
        outputs.append(parse_whole_numbers(table, 2, "GeneratedTokens", row_offset=1))
    names = ", ".join(Path(p).name for p in files)
    return RequestLog(
        np.concatenate(times),
        np.concatenate(inputs),
        np.concatenate(outputs),
        source=f"Azure LLM inference 2023: {names}",
    )


def resolved_path(path: Path) -> Path:
    """``path`` resolved, to compare two names of one file; as given (absolute) when it cannot be resolved."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare as given (reading it fails with its own error)
        return path.absolute()


# ---------------------------------------------------------------------------------------------------------------------
# Alibaba ServeGen


@dataclass(frozen=True, eq=False)
class ServeGenPool:
    """ServeGen clients on one grid of windows: ``rates[c, w]`` etc. for client ``c`` in window ``w``.

    ``origin`` is the (relative) second at which window 0 starts; ``kind`` is 0 (no arrivals), 1 (Gamma) or 2
    (Weibull); ``shape`` and ``scale`` are the upstream ``dist_arg1`` and ``dist_arg2``.
    """

    names: tuple[str, ...]
    origin: float
    window_s: float
    rates: FloatArray
    kind: npt.NDArray[np.int8]
    shape: FloatArray
    scale: FloatArray

    @property
    def n_windows(self) -> int:
        return int(self.rates.shape[1])


def servegen_files(inputs: Iterable[PathLike]) -> list[Path]:
    """Chunk files named by ``inputs``: a directory stands for all its ``chunk-N-trace.csv(.gz)``, in N order."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = [(int(m.group(1)), p) for p in path.iterdir() if (m := _CHUNK_RE.match(p.name))]
            if not found:
                raise ValueError(f"{path}: no ServeGen chunk-N-trace.csv(.gz) files in this directory")
            files.extend(p for _, p in sorted(found))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    if not files:
        raise ValueError("servegen needs at least one chunk file or directory")
    # One client counted twice doubles the demand silently: the same file named twice (or by its directory too),
    # or a chunk next to its gunzipped copy.
    seen: dict[Path, Path] = {}
    chunks: dict[tuple[Path, int], Path] = {}
    for path in files:
        real = path.resolve()
        if real in seen:
            raise ValueError(f"{path}: given twice (also as {seen[real]}): each client would be counted twice")
        seen[real] = path
        match = _CHUNK_RE.match(path.name)
        if match:
            key = (real.parent, int(match.group(1)))
            if key in chunks:
                raise ValueError(
                    f"{path}: chunk {key[1]} is also {chunks[key]} (a compressed and an uncompressed copy?): its "
                    "clients would be counted twice"
                )
            chunks[key] = path
    return files


def read_servegen(inputs: Iterable[PathLike]) -> ServeGenPool:
    """Parse ServeGen chunk files (no header; ``window_start_seconds,rate,cv,dist_name,dist_arg1,dist_arg2``)."""
    files = servegen_files(inputs)
    parsed: list[tuple[str, FloatArray, FloatArray, npt.NDArray[np.int8], FloatArray, FloatArray, CsvTable]] = []
    window_s: float | None = None
    for path in files:
        table = read_csv(path)
        if not table.rows:
            raise TraceFormatError(path, 1, 1, "empty file: expected ServeGen rows (no header)")
        names = "window_start_seconds,rate,cv,dist_name,dist_arg1,dist_arg2"
        check_columns(table, 6, names)
        starts = parse_floats(table, 0, "window_start_seconds")
        rates = parse_floats(table, 1, "rate", minimum=0.0)
        parse_floats(table, 2, "cv", minimum=0.0)  # validated for the error message; the fitted shape sets the cv
        shape = parse_floats(table, 4, "dist_arg1")
        scale = parse_floats(table, 5, "dist_arg2")
        kind = np.empty(len(table.rows), dtype=np.int8)
        for i, row in enumerate(table.rows):
            code = _DIST_CODES.get(row[3].lower())
            if code is None:
                raise TraceFormatError(path, table.lines[i], 4, f"dist_name: {row[3]!r} is not Gamma, Weibull or empty")
            kind[i] = code
        busy = rates > 0
        for column, values, what in ((4, shape, "shape"), (5, scale, "scale")):
            bad = busy & (kind != _NO_DIST) & ~(values > 0)
            if bad.any():
                i = int(np.argmax(bad))
                raise TraceFormatError(
                    path,
                    table.lines[i],
                    column + 1,
                    f"dist_arg{column - 3} ({what}): {table.rows[i][column]!r} must be > 0 for a {table.rows[i][3]}"
                    " window with rate > 0",
                )
        for dist, code in (("gamma", _GAMMA), ("weibull", _WEIBULL)):
            least = SERVEGEN_MIN_SHAPE[dist]
            bad = busy & (kind == code) & (shape < least)
            if bad.any():
                i = int(np.argmax(bad))
                raise TraceFormatError(
                    path,
                    table.lines[i],
                    5,
                    f"dist_arg1 (shape): {table.rows[i][4]!r} is below {least:g}, the smallest {table.rows[i][3]}"
                    " shape that can be drawn from (a window with rate > 0)",
                )
        diffs = np.diff(starts)
        if diffs.size:
            if not (diffs > 0).all():
                i = int(np.argmax(diffs <= 0)) + 1
                raise TraceFormatError(
                    path,
                    table.lines[i],
                    1,
                    f"window_start_seconds: {table.rows[i][0]!r} is not after the previous row's"
                    f" {table.rows[i - 1][0]!r}",
                )
            step = float(diffs[0])
            uneven = np.abs(diffs - step) > 1e-6 * step
            if window_s is not None and abs(step - window_s) > 1e-6 * window_s:
                uneven[0] = True
                step = window_s
            if uneven.any():
                i = int(np.argmax(uneven)) + 1
                raise TraceFormatError(
                    path,
                    table.lines[i],
                    1,
                    f"window_start_seconds: {table.rows[i][0]!r} breaks the {step:g} s window grid"
                    " (every client must use the same regular windows)",
                )
            window_s = step
        parsed.append((path.name, starts, rates, kind, shape, scale, table))
    window = SERVEGEN_DEFAULT_WINDOW_S if window_s is None else window_s
    origin = min(float(p[1][0]) for p in parsed)
    # Sized in floats (no overflow) before the (clients x windows) matrices are allocated.
    last_window = [(float(p[1][-1]) - origin) / window for p in parsed]
    latest = int(np.argmax(last_window))
    n_clients = len(parsed)
    if not last_window[latest] + 1 <= MAX_BINS // n_clients:
        table = parsed[latest][6]
        raise TraceFormatError(
            table.path,
            table.lines[-1],
            1,
            f"window_start_seconds: {_cell(table.rows[-1][0])} is {last_window[latest]:,.0f} windows of {window:g} s"
            f" after the first window (at {origin:g} s); with {n_clients} client file(s) that is more than the"
            f" maximum of {MAX_BINS:,} client-windows",
        )
    n_windows = max(round(w) for w in last_window) + 1
    rates_m = np.zeros((n_clients, n_windows))
    kind_m = np.zeros((n_clients, n_windows), dtype=np.int8)
    shape_m = np.ones((n_clients, n_windows))
    scale_m = np.ones((n_clients, n_windows))
    for c, (_, starts, rates, kind, shape, scale, table) in enumerate(parsed):
        position = (starts - origin) / window
        index = np.round(position).astype(np.int64)
        off_grid = np.abs(position - index) > 1e-6
        if off_grid.any():
            i = int(np.argmax(off_grid))
            raise TraceFormatError(
                table.path,
                table.lines[i],
                1,
                f"window_start_seconds: {table.rows[i][0]!r} is not on the {window:g} s grid that starts at"
                f" {origin:g} s (set by another client)",
            )
        rates_m[c, index] = rates
        kind_m[c, index] = kind
        shape_m[c, index] = np.where(shape > 0, shape, 1.0)
        scale_m[c, index] = np.where(scale > 0, scale, 1.0)
    # A window with requests but no fitted distribution has no burstiness information: treat it as Poisson
    # (Gamma with shape 1 is the exponential). The 2025 ServeGen data has no such window.
    poisson = (rates_m > 0) & (kind_m == _NO_DIST)
    kind_m[poisson] = _GAMMA
    shape_m[poisson] = 1.0
    kind_m[rates_m <= 0] = _NO_DIST
    _check_arrivals(parsed, rates_m, window, origin)
    return ServeGenPool(
        names=tuple(p[0] for p in parsed),
        origin=origin,
        window_s=window,
        rates=rates_m,
        kind=kind_m,
        shape=shape_m,
        scale=scale_m,
    )


def _check_arrivals(
    parsed: Sequence[tuple[str, FloatArray, FloatArray, npt.NDArray[np.int8], FloatArray, FloatArray, CsvTable]],
    rates_m: FloatArray,
    window: float,
    origin: float,
) -> None:
    """Refuse, before drawing, windows or a trace with more arrivals than can be drawn (see the limits above)."""
    with np.errstate(over="ignore"):
        per_window = rates_m.sum(axis=0) * window
        total = float(per_window.sum())
    busiest = int(np.argmax(per_window))
    if not per_window[busiest] <= SERVEGEN_MAX_WINDOW_ARRIVALS:
        # Name the row of the client with the highest rate in that window.
        client = int(np.argmax(rates_m[:, busiest]))
        _, starts, _, _, _, _, table = parsed[client]
        row = int(np.argmin(np.abs(starts - (origin + busiest * window))))
        raise TraceFormatError(
            table.path,
            table.lines[row],
            2,
            f"rate: {_cell(table.rows[row][1])} req/s: the {window:g} s window at {origin + busiest * window:g} s"
            f" expects {float(per_window[busiest]):.3g} arrivals (all clients), more than the maximum of"
            f" {SERVEGEN_MAX_WINDOW_ARRIVALS:,} per window",
        )
    if not total <= SERVEGEN_MAX_ARRIVALS:
        raise ValueError(
            f"ServeGen: the {len(parsed)} clients' rates add up to {total:.3g} arrivals to draw, more than the maximum"
            f" of {SERVEGEN_MAX_ARRIVALS:,}: convert fewer clients or a shorter part at a time"
        )


def _cell(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def servegen_rate_series(
    pool: ServeGenPool,
    *,
    step_s: float = SERVEGEN_DEFAULT_STEP_S,
    seed: int = 0,
    start: float = 0.0,
    source: str = "",
) -> RateSeries:
    """Draw every client's arrivals from its fitted inter-arrival distribution and bin their sum to ``step_s``.

    Upstream conventions (alibaba/ServeGen ``servegen/clientpool.py`` and ``examples/generate_custom.py``): a row's
    pattern is ``(dist_name, (dist_arg1, dist_arg2))``, a distribution of *inter-arrival times* in seconds, Gamma and
    Weibull both as (shape, scale) — e.g. ``rate 4.0, cv 2.0, ("Gamma", (0.25, 1.0))``: mean ``shape * scale``
    = 0.25 s = 1 / rate, cv ``1 / sqrt(shape)`` = 2. In ``language/m-large`` the Gamma fits match that (median
    ``mean * rate`` = 0.998), but the Weibull fits do not (``mean * rate`` spans 0.1 to 3, median 1.17: they are
    likelihood fits, not moment fits). So the shape (burstiness) is kept and the **scale is rescaled so that the mean
    inter-arrival time is exactly 1 / rate** of the window — a no-op for the matching Gamma fits. Upstream's own
    generator likewise rescales to a target rate.

    Each (client, window) with rate > 0 is an independent *stationary* renewal process over the window: the first
    arrival comes after ``U * L`` (``U`` uniform, ``L`` a length-biased interval: Gamma(shape + 1, scale) for Gamma,
    ``scale * Gamma(1 + 1/shape, 1) ** (1/shape)`` for Weibull), then intervals follow. Starting in equilibrium makes
    the expected count exactly ``rate * window`` even for very bursty clients (cv up to 10 here), where restarting
    with an arrival at every window edge would add ``(cv**2 - 1) / 2`` arrivals per window.

    ``start`` (Unix seconds) is where the relative time 0 of the ServeGen files lands. The series runs from the first
    window's start to the last window's end; a last bin cut short by that end is divided by the time it covers.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s!r}")
    rng = np.random.default_rng(seed)
    window = pool.window_s
    span = pool.n_windows * window
    bins = span / step_s
    if not bins <= MAX_BINS:  # also inf: sized before anything is allocated
        shown = f"{bins:,.0f}" if bins < 1e15 else f"{bins:.3g}"
        raise ValueError(
            f"{pool.n_windows} windows of {window:g} s at a step of {step_s:g} s make {shown} bins, more than the"
            f" maximum of {MAX_BINS:,}: use a longer step"
        )
    n_bins = max(math.ceil(bins - 1e-9), 1)
    bins_per_window = math.ceil(window / step_s) + 2
    counts = np.zeros(n_bins + bins_per_window, dtype=np.int64)
    # Column-major copies: the loop below reads one window (a column) at a time.
    rates_t = np.ascontiguousarray(pool.rates.T)
    kind_t = np.ascontiguousarray(pool.kind.T)
    shape_t = np.ascontiguousarray(pool.shape.T)
    for w in range(pool.n_windows):
        busy = rates_t[w] > 0
        if not busy.any():
            continue
        try:
            offsets = _renewal_arrivals(rng, rates_t[w][busy], kind_t[w][busy], shape_t[w][busy], window)
        except _TooManyArrivals:
            raise ValueError(
                f"ServeGen window {w} (at {pool.origin + w * window:g} s): more than"
                f" {2 * SERVEGEN_MAX_WINDOW_ARRIVALS:,} arrivals drawn, the clients' fitted distributions are too"
                " bursty to sample"
            ) from None
        if offsets.size == 0:
            continue
        window_start = w * window
        first_bin = math.floor(window_start / step_s)
        local = np.floor((window_start + offsets) / step_s).astype(np.int64) - first_bin
        np.clip(local, 0, bins_per_window - 1, out=local)  # float round-off at the window's end
        counts[first_bin : first_bin + bins_per_window] += np.bincount(local, minlength=bins_per_window)
    counts_f = counts[:n_bins].astype(np.float64)
    rates = counts_f / step_s
    last = span - (n_bins - 1) * step_s
    if last < step_s:
        rates[-1] = counts_f[-1] / last
    return RateSeries(start=start + pool.origin, step_s=step_s, rates=rates, source=source)


class _TooManyArrivals(Exception):
    """A window drew far more arrivals than its rates expect (degenerate, extremely bursty fits)."""


def _renewal_arrivals(
    rng: np.random.Generator,
    rate: FloatArray,
    kind: npt.NDArray[np.int8],
    shape: FloatArray,
    window_s: float,
) -> FloatArray:
    """Arrival offsets in ``[0, window_s)`` of independent stationary renewal processes, all clients concatenated."""
    weibull = kind == _WEIBULL
    with np.errstate(over="ignore", divide="ignore"):  # a subnormal rate: an infinite interval, no arrival
        mean = 1.0 / rate
        # Scale that gives the mean inter-arrival time 1/rate (Gamma mean = shape x scale, Weibull scale x Γ(1 + 1/k)).
        # Γ only for the Weibull fits: Γ(1 + 1/k) of a small Gamma shape would overflow, and is not needed.
        scale = mean / shape
        scale[weibull] = mean[weibull] / gamma_function(1.0 + 1.0 / shape[weibull])
    length_biased = np.empty_like(rate)
    g = ~weibull
    length_biased[g] = rng.gamma(shape[g] + 1.0, scale[g])
    k = shape[weibull]
    length_biased[weibull] = scale[weibull] * rng.gamma(1.0 + 1.0 / k) ** (1.0 / k)
    t = rng.random(rate.size) * length_biased
    pieces = [t[t < window_s]]
    drawn = int(pieces[0].size)
    active = np.flatnonzero(t < window_s)
    while active.size:
        # Draw a batch per still-open process: enough for the expected remainder plus slack; a bursty process that
        # falls short just loops again (rare, and each round only touches the open ones).
        remaining = window_s - t[active]
        sizes = np.ceil(rate[active] * remaining * 1.25 + 16.0).astype(np.int64)
        owner = np.repeat(np.arange(active.size), sizes)
        draws = np.empty(owner.size)
        is_w = weibull[active][owner]
        is_g = ~is_w
        draws[is_g] = rng.gamma(shape[active][owner[is_g]], scale[active][owner[is_g]])
        draws[is_w] = rng.weibull(shape[active][owner[is_w]]) * scale[active][owner[is_w]]
        ends = np.cumsum(sizes)
        total = np.cumsum(draws)
        before = np.concatenate(([0.0], total[ends[:-1] - 1]))
        times = total - np.repeat(before - t[active], sizes)
        pieces.append(times[times < window_s])
        drawn += int(pieces[-1].size)
        if drawn > 2 * SERVEGEN_MAX_WINDOW_ARRIVALS:
            raise _TooManyArrivals
        t[active] = times[ends - 1]
        active = active[t[active] < window_s]
    return np.concatenate(pieces)


def convert_servegen(
    inputs: Iterable[PathLike], *, step_s: float = SERVEGEN_DEFAULT_STEP_S, seed: int = 0, start: float = 0.0
) -> RateSeries:
    """Read ServeGen chunk files or directories and sample their summed arrivals into a rate series."""
    items = list(inputs)
    pool = read_servegen(items)
    where = ", ".join(str(Path(p)) for p in items)
    source = (
        f"ServeGen {where}: {len(pool.names)} clients, {pool.n_windows} x {pool.window_s:g} s windows, arrivals"
        f" drawn from the fitted inter-arrival distributions (seed {seed}), binned to {step_s:g} s"
    )
    return servegen_rate_series(pool, step_s=step_s, seed=seed, start=start, source=source)


# ---------------------------------------------------------------------------------------------------------------------
# Azure Functions 2019 (invitro sample)


def read_azure_functions(path: PathLike, *, function: str | None = None, start: float = 0.0) -> RateSeries:
    """Per-minute invocations summed over all functions, or over the one whose ``HashFunction`` starts with
    ``function`` (case-insensitive), as requests per second (count / 60) at a 60 s step from ``start``."""
    table = read_csv(path)
    if not table.rows:
        raise TraceFormatError(path, 1, 1, "empty file: expected 'HashFunction,HashOwner,HashApp,1_minute,...'")
    header = table.rows[0]
    _expect_header(table, ("HashFunction", "HashOwner", "HashApp"), prefix_only=True)
    if len(header) < 4:
        raise TraceFormatError(path, table.lines[0], len(header) + 1, "expected minute columns '1_minute', ...")
    for column in range(3, len(header)):
        if header[column].lower() != f"{column - 2}_minute":
            raise TraceFormatError(
                path, table.lines[0], column + 1, f"header {header[column]!r}: expected '{column - 2}_minute'"
            )
    n_minutes = len(header) - 3
    check_columns(table, len(header), f"3 hashes and {n_minutes} minute counts", row_offset=1)
    rows = list(range(1, len(table.rows)))
    label = "all functions"
    if function is not None:
        wanted = function.lower()
        rows = [i for i in rows if table.rows[i][0].lower().startswith(wanted)]
        distinct = sorted({table.rows[i][0] for i in rows})
        if not distinct:
            raise ValueError(f"{path}: no HashFunction starts with {function!r}")
        if len(distinct) > 1:
            shown = ", ".join(d[:16] for d in distinct[:5])
            raise ValueError(f"{path}: {len(distinct)} functions start with {function!r} ({shown}, ...): give more")
        label = f"function {distinct[0][:16]}… ({len(rows)} row{'s' if len(rows) > 1 else ''})"
    counts = np.zeros(n_minutes)
    with np.errstate(over="ignore"):
        for i in rows:
            counts += _row_counts(table, i)
    if not np.all(np.isfinite(counts)):
        raise ValueError(f"{path}: the invocation counts are too large: their sum overflows")
    return RateSeries(
        start=start,
        step_s=AZURE_FUNCTIONS_STEP_S,
        rates=counts / AZURE_FUNCTIONS_STEP_S,
        source=f"Azure Functions 2019 {Path(path).name}: {label}",
    )


def _row_counts(table: CsvTable, i: int) -> FloatArray:
    row = table.rows[i]
    try:
        values = np.array([float(cell) for cell in row[3:]], dtype=np.float64)
    except ValueError:
        values = np.full(len(row) - 3, np.nan)  # fall through to the cell-by-cell check below
    bad = ~(np.isfinite(values) & (values >= 0) & (values == np.floor(values)))
    if bad.any():
        column = 3 + int(np.argmax(bad))
        cell = row[column]
        try:
            value = float(cell)
            what = "is negative" if value < 0 else "is not a whole number"
            if not math.isfinite(value):
                what = "is not a finite number"
        except ValueError:
            what = "is not a number"
        name = table.rows[0][column]
        raise TraceFormatError(table.path, table.lines[i], column + 1, f"{name}: {cell!r} {what}")
    return values


# ---------------------------------------------------------------------------------------------------------------------
# Numenta Anomaly Benchmark


@dataclass(frozen=True)
class NabRepair:
    """What :func:`read_nab` had to fix to put a NAB file on a regular grid."""

    merged: int  # samples that shared a grid slot with another (averaged)
    filled: int  # empty grid slots (linearly interpolated)
    moved: int  # samples off the grid by more than 1 % of the step (put on the nearest slot)


def read_nab(path: PathLike, *, scale: float = 1.0) -> tuple[RateSeries, NabRepair]:
    """A NAB ``timestamp,value`` file as a rate series: ``value * scale`` requests per second, at the file's step.

    NAB timestamps are local wall-clock times and a few files have gaps and daylight-saving artefacts (an hour of
    samples all stamped ``03:00:00``). The step is the median interval; each sample goes to the nearest slot of the
    regular grid from the first timestamp, samples sharing a slot are averaged and empty slots are interpolated
    linearly between their neighbours. The repairs are counted in the returned :class:`NabRepair`.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    table = read_csv(path)
    if not table.rows:
        raise TraceFormatError(path, 1, 1, "empty file: expected the header 'timestamp,value'")
    _expect_header(table, ("timestamp", "value"))
    check_columns(table, 2, "timestamp,value", row_offset=1)
    times = parse_timestamps(table, 0, row_offset=1)
    values = parse_floats(table, 1, "value", row_offset=1, minimum=0.0)
    if times.size < 2:
        raise TraceFormatError(path, table.lines[-1] + 1, 1, "need at least 2 rows to know the step")
    diffs = np.diff(times)
    backwards = diffs < 0
    if backwards.any():
        i = int(np.argmax(backwards)) + 2
        raise TraceFormatError(
            path,
            table.lines[i],
            1,
            f"timestamp: {table.rows[i][0]!r} is before the previous row's {table.rows[i - 1][0]!r}",
        )
    positive = diffs[diffs > 0]
    if positive.size == 0:
        raise TraceFormatError(path, table.lines[2], 1, "all timestamps are equal: no step")
    step = float(np.median(positive))
    position = (times - times[0]) / step
    if not position[-1] < MAX_BINS:  # the grid is sized before it is allocated (or cast to int64)
        raise TraceFormatError(
            path,
            table.lines[-1],
            1,
            f"timestamp: {_cell(table.rows[-1][0])} is {position[-1]:,.0f} steps of {step:g} s (the file's median"
            f" step) after the first row: filling the gaps would make more than the maximum of {MAX_BINS:,} rows",
        )
    slot = np.round(position).astype(np.int64)
    n_slots = int(slot[-1]) + 1
    sums = np.bincount(slot, weights=values, minlength=n_slots)
    hits = np.bincount(slot, minlength=n_slots)
    present = hits > 0
    grid = np.arange(n_slots)
    level = np.interp(grid, grid[present], sums[present] / hits[present])
    repair = NabRepair(
        merged=int((hits[present] - 1).sum()),
        filled=int((~present).sum()),
        moved=int((np.abs(position - slot) > 0.01).sum()),
    )
    with np.errstate(over="ignore"):
        rates = level * scale
    if not np.all(np.isfinite(rates)):
        i = int(np.argmax(values)) + 1
        raise TraceFormatError(
            path, table.lines[i], 2, f"value: {_cell(table.rows[i][1])} x scale {scale:g} is not a finite rate"
        )
    notes = f", {repair.merged} merged, {repair.filled} filled" if repair.merged or repair.filled else ""
    series = RateSeries(
        start=float(times[0]),
        step_s=step,
        rates=rates,
        source=f"NAB {Path(path).name} x {scale:g}{notes}",
    )
    return series, repair


# ---------------------------------------------------------------------------------------------------------------------
# Shared helpers


def _expect_header(table: CsvTable, names: Sequence[str], *, prefix_only: bool = False) -> None:
    expected = ",".join(names)
    if not table.rows:
        raise TraceFormatError(table.path, 1, 1, f"empty file: expected the header {expected!r}")
    header = table.rows[0]
    for column, name in enumerate(names):
        if column >= len(header):
            raise TraceFormatError(
                table.path, table.lines[0], column + 1, f"header: missing column {name!r} (expected {expected!r})"
            )
        if header[column].lower() != name.lower():
            problem = "missing header" if _looks_numeric_or_time(header[column]) else f"header {header[column]!r}"
            raise TraceFormatError(table.path, table.lines[0], column + 1, f"{problem}: expected {expected!r}")
    if not prefix_only and len(header) > len(names):
        raise TraceFormatError(
            table.path, table.lines[0], len(names) + 1, f"header: unexpected column {header[len(names)]!r}"
        )
    if len(table.rows) == 1:
        raise TraceFormatError(table.path, table.lines[0] + 1, 1, "no data rows after the header")


def _looks_numeric_or_time(text: str) -> bool:
    try:
        parse_time(text)
    except ValueError:
        return False
    return True


def resample_if(series: RateSeries, step_s: float | None) -> RateSeries:
    """``series`` at ``step_s`` (unchanged when ``step_s`` is None or already the step)."""
    if step_s is None or math.isclose(step_s, series.step_s, rel_tol=1e-12):
        return series
    return resample(series, step_s)
