"""``autoscaler trace``: import public traces into the canonical formats, and check canonical files.

autoscaler trace convert FORMAT INPUT... --output OUT [--step SECONDS] [--seed N] [--start TIME]
                         [--function HASH] [--scale FACTOR] [--decimals N]
autoscaler trace info FILE... [--step SECONDS]
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.traces.convert import (
    SERVEGEN_DEFAULT_STEP_S,
    convert_servegen,
    read_azure_functions,
    read_azure_llm,
    read_nab,
    resample_if,
    resolved_path,
)
from autoscaler.traces.formats import (
    MAX_DECIMALS,
    MAX_UNIX_SECONDS,
    RateSeries,
    RequestLog,
    TraceFormatError,
    load_request_log,
    load_trace,
    parse_time,
    rate_series_text,
    request_log_text,
    sniff_format,
    summarise,
    summarise_request_log,
    write_texts,
)

_FORMATS: dict[str, str] = {
    "azure-llm": "Azure LLM inference 2023 (TIMESTAMP,ContextTokens,GeneratedTokens) -> request log; several INPUTs"
    " are merged",
    "servegen": "Alibaba ServeGen per-client chunk-N-trace.csv(.gz) files, or a directory of them -> rate series of"
    " arrivals drawn from each client's fitted inter-arrival distribution, summed over clients",
    "azure-functions": "Azure Functions 2019 per-minute invocation counts (1000_inv.csv(.gz)) -> rate series at 60 s,"
    " all functions summed or one with --function",
    "nab": "Numenta Anomaly Benchmark timestamp,value -> rate series (value x --scale req/s) at the file's own step",
}

# Which options make sense for which format: a silently ignored option is a wrong trace nobody notices.
_OPTION_FORMATS: dict[str, tuple[str, ...]] = {
    "step": ("servegen", "azure-functions", "nab"),
    "seed": ("servegen",),
    "start": ("servegen", "azure-functions"),
    "function": ("azure-functions",),
    "scale": ("nab",),
    "decimals": ("servegen", "azure-functions", "nab"),
}
_SINGLE_INPUT = ("azure-functions", "nab")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keep the hand-wrapped description and epilog; each option's help states its own default (argparse's
    "(default: None)" would be wrong for the options whose default depends on FORMAT)."""


def register(subparsers: Any) -> None:
    """Add ``trace`` (with ``convert`` and ``info``) to the top-level ``autoscaler`` parser."""
    parser = subparsers.add_parser(
        "trace",
        help="import public traces into the canonical CSV formats, check trace files",
        description="Import public traces into the canonical request-log / rate-series CSV formats, and check files.",
        formatter_class=_HelpFormatter,
    )
    commands = parser.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)

    formats = "\n".join(
        textwrap.fill(f"{name}: {text}", width=100, initial_indent="  ", subsequent_indent="      ")
        for name, text in _FORMATS.items()
    )
    convert = commands.add_parser(
        "convert",
        help="convert a public trace format into a canonical CSV",
        description=(
            "Convert public traces into the canonical formats read by load_trace() and the simulator.\n\n"
            f"FORMAT is one of:\n{formats}\n\n"
            "Prints one line per output file: path, rows, step, span, mean and peak rate. Every INPUT is converted"
            " before any output is written, and the outputs are then written all or none (never half-written): on"
            " an error (each INPUT that fails is named), OUT is left as it was."
        ),
        epilog=(
            "examples:\n"
            "  autoscaler trace convert servegen ../shared/traces/alibaba-servegen/language/m-large \\\n"
            "      --output m-large.csv.gz --step 60 --seed 0\n"
            "  autoscaler trace convert azure-llm ../shared/traces/azure-llm-inference-2023/*.csv --output out/\n"
            "  autoscaler trace convert azure-functions 1000_inv.csv.gz --function 1779fd33 --output fn.csv\n"
            "  autoscaler trace convert nab nab/realTweets/Twitter_volume_AAPL.csv --scale 0.1 --output aapl.csv"
        ),
        formatter_class=_HelpFormatter,
    )
    convert.add_argument("format", metavar="FORMAT", choices=sorted(_FORMATS), help="input format (see above)")
    convert.add_argument(
        "inputs",
        metavar="INPUT",
        nargs="+",
        help="input file(s), plain or .gz; for servegen also directories holding chunk-N-trace.csv(.gz) files",
    )
    convert.add_argument(
        "--output",
        "-o",
        metavar="OUT",
        required=True,
        help="output CSV (gzip-compressed when it ends in .gz). If OUT is a directory (existing, or ending in '/'),"
        " each INPUT is converted on its own into OUT/<input name>.csv.gz",
    )
    convert.add_argument(
        "--step",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="bin length of the output rate series, in seconds. servegen: arrivals are counted in bins of this"
        " length; azure-functions and nab: the series is resampled to it. Not for azure-llm, which writes one row"
        f" per request [default: servegen {SERVEGEN_DEFAULT_STEP_S:g} s, azure-functions 60 s, nab the file's own"
        " step]",
    )
    convert.add_argument(
        "--seed",
        metavar="N",
        type=_seed,
        default=None,
        help="servegen: seed of the random arrival times (same seed and inputs give the same output) [default: 0]",
    )
    convert.add_argument(
        "--start",
        metavar="TIME",
        default=None,
        help="servegen, azure-functions: when the trace's relative time 0 happens, as Unix seconds or ISO 8601"
        " (no zone = UTC), e.g. 2024-01-01T00:00:00 [default: 0, i.e. 1970-01-01T00:00:00Z]",
    )
    convert.add_argument(
        "--function",
        metavar="HASH",
        default=None,
        help="azure-functions: keep only the function whose HashFunction starts with HASH (case-insensitive,"
        " must be unambiguous) [default: sum of all functions]",
    )
    convert.add_argument(
        "--scale",
        metavar="FACTOR",
        type=_positive_float,
        default=None,
        help="nab: requests per second per unit of the file's value column (rate = value x FACTOR) [default: 1.0]",
    )
    convert.add_argument(
        "--decimals",
        metavar="N",
        type=_decimals,
        default=None,
        help=f"rate series outputs: round rates (req/s) to N decimal places (0 to {MAX_DECIMALS}) to keep files small"
        " [default: exact]",
    )
    convert.set_defaults(func=run_convert)

    info = commands.add_parser(
        "info",
        help="check canonical trace files and summarise them",
        description="Read canonical trace files (request log or rate series, auto-detected) as load_trace() does,"
        " and print one line each; a malformed file is reported as FILE:LINE:COLUMN: message.",
        formatter_class=_HelpFormatter,
    )
    info.add_argument("files", metavar="FILE", nargs="+", help="canonical trace CSV(s), plain or .gz")
    info.add_argument(
        "--step",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="bin request logs (and resample rate series) to this step, in seconds; at most 20,000,000 bins (the"
        " simulator's limit) [default: 60 s for request logs, the file's own step for rate series]",
    )
    info.set_defaults(func=run_info)


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _decimals(text: str) -> int:
    value = _whole_number(text)
    if not 0 <= value <= MAX_DECIMALS:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from 0 to {MAX_DECIMALS}")
    return value


def _seed(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


@dataclass(frozen=True)
class _Job:
    inputs: tuple[str, ...]
    output: Path


def run_convert(args: argparse.Namespace) -> int:
    fmt: str = args.format
    for option, allowed in _OPTION_FORMATS.items():
        if getattr(args, option) is not None and fmt not in allowed:
            return _usage_error(f"--{option} does not apply to {fmt} (only to {', '.join(allowed)})")
    start = 0.0
    if args.start is not None:
        try:
            start = parse_time(args.start)
        except ValueError as exc:
            return _usage_error(f"--start: {exc}")
    out = str(args.output)
    directory_mode = out.endswith(("/", os.sep)) or Path(out).is_dir()
    if directory_mode:
        jobs = [_Job((item,), Path(out) / f"{_stem(item)}.csv.gz") for item in args.inputs]
    else:
        if fmt in _SINGLE_INPUT and len(args.inputs) > 1:
            return _usage_error(f"{fmt} takes one INPUT per output: give a directory as --output to convert several")
        jobs = [_Job(tuple(args.inputs), Path(out))]
    clash = _output_clash(jobs, args.inputs)
    if clash is not None:
        return _usage_error(clash)

    convert = _converter(fmt, args, start)
    # Every input is converted (and its text made) before any output is touched, and the outputs are then written
    # all or none: on an error OUT is left as it was, whichever input failed (in directory mode, writing each output
    # as its input converted left the earlier ones written and the later ones not converted). Every bad input is
    # named, not only the first.
    outputs: list[tuple[Path, str]] = []
    lines: list[str] = []
    failed = False
    for job in jobs:
        began = time.perf_counter()
        try:
            result, note = convert(job.inputs)
            if isinstance(result, RequestLog):
                line = summarise_request_log(result)
                text = request_log_text(result)
            else:
                if args.decimals is not None:
                    # What is written (rounded); the writer prints each float exactly, so this is what reads back.
                    rounded = np.round(result.rates, args.decimals)
                    result = RateSeries(result.start, result.step_s, rounded, result.source)
                _check_timestamps(result, job.inputs)
                line = summarise(result)
                text = rate_series_text(result)
        except (TraceFormatError, ValueError, OSError, MemoryError) as exc:
            print(f"autoscaler trace convert: error: {_error_text(exc)}", file=sys.stderr)
            failed = True
            outputs.clear()  # nothing will be written: keep no texts in memory
            continue
        if not failed:
            outputs.append((job.output, text))
            lines.append(f"{job.output}: {line}{note} [{time.perf_counter() - began:.1f} s]")
    if failed:
        if len(jobs) > 1:
            print(f"autoscaler trace convert: error: nothing written to {out}", file=sys.stderr)
        return 2
    try:
        write_texts(outputs)  # beside each target, then renamed into place: never half-written
    except (OSError, MemoryError) as exc:
        print(f"autoscaler trace convert: error: {_error_text(exc)}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


def _output_clash(jobs: Sequence[_Job], inputs: Sequence[str]) -> str | None:
    """Why the outputs cannot be written without losing something, or None: two inputs of one name would write one
    output (the second silently wins), and an output that is an input would replace the data it was made from."""
    seen: dict[Path, str] = {}
    sources = {resolved_path(Path(item)): item for item in inputs}
    for job in jobs:
        target = resolved_path(job.output)
        if target in sources:
            return f"the output {job.output} is the input {sources[target]}: give --output another file or directory"
        if target in seen:
            return (
                f"{seen[target]} and {', '.join(job.inputs)} would both be written to {job.output}: convert them into "
                "separate directories"
            )
        seen[target] = ", ".join(job.inputs)
    return None


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "out of memory reading the input (a compressed file that expands beyond this machine's memory?)"
    return str(exc)


def _check_timestamps(series: RateSeries, inputs: Sequence[str]) -> None:
    """The written file must read back: 2 rows or more (its step), timestamps within 1970-01-01..9999-12-31."""
    if len(series) < 2:
        raise ValueError(
            f"{', '.join(inputs)}: the converted series has {len(series)} bin of {series.step_s:g} s, but a rate series"
            " file needs at least 2 rows to carry its step: use a shorter --step"
        )
    last = series.start + (len(series) - 1) * series.step_s
    if not (series.start >= 0 and last < MAX_UNIX_SECONDS):
        raise ValueError(
            f"{', '.join(inputs)}: the converted series runs from Unix second {series.start:.0f} to {last:.0f}, outside"
            " 1970-01-01..9999-12-31 (0 to 253,402,300,799): check --start and the input's times"
        )


def _converter(
    fmt: str, args: argparse.Namespace, start: float
) -> Callable[[Sequence[str]], tuple[RateSeries | RequestLog, str]]:
    def azure_llm(inputs: Sequence[str]) -> tuple[RateSeries | RequestLog, str]:
        return read_azure_llm(inputs), ""

    def servegen(inputs: Sequence[str]) -> tuple[RateSeries | RequestLog, str]:
        step = SERVEGEN_DEFAULT_STEP_S if args.step is None else args.step
        seed = 0 if args.seed is None else args.seed
        return convert_servegen(inputs, step_s=step, seed=seed, start=start), f", seed {seed}"

    def at_step(series: RateSeries, inputs: Sequence[str]) -> RateSeries:
        try:
            return resample_if(series, args.step)
        except ValueError as exc:  # too many bins for --step: no row of the input is at fault
            raise ValueError(f"{inputs[0]}: --step: {exc}") from None

    def azure_functions(inputs: Sequence[str]) -> tuple[RateSeries | RequestLog, str]:
        series = read_azure_functions(inputs[0], function=args.function, start=start)
        return at_step(series, inputs), ""

    def nab(inputs: Sequence[str]) -> tuple[RateSeries | RequestLog, str]:
        series, repair = read_nab(inputs[0], scale=1.0 if args.scale is None else args.scale)
        note = ""
        if repair.merged or repair.filled or repair.moved:
            note = (
                f" (put on a regular grid: {repair.merged} samples sharing a slot averaged, {repair.filled} empty"
                f" slots interpolated, {repair.moved} samples moved to the nearest slot)"
            )
        return at_step(series, inputs), note

    table = {"azure-llm": azure_llm, "servegen": servegen, "azure-functions": azure_functions, "nab": nab}
    return table[fmt]


def run_info(args: argparse.Namespace) -> int:
    status = 0
    for name in args.files:
        try:
            kind = sniff_format(name)
            line = summarise(load_trace(name, step_s=args.step))
            if kind == "request log":
                line = f"{summarise_request_log(load_request_log(name))}; binned: {line}"
            line = f"{kind}, {line}"
        except (TraceFormatError, ValueError, OSError, MemoryError) as exc:
            message = _error_text(exc)
            if not isinstance(exc, OSError) and not message.startswith(name):
                message = f"{name}: {message}"  # every error names its file
            print(f"autoscaler trace info: error: {message}", file=sys.stderr)
            status = 2  # bad input, as every command of the project
            continue
        print(f"{name}: {line}")
    return status


def _stem(item: str) -> str:
    name = Path(item.rstrip("/" + os.sep)).name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name or "trace"


def _usage_error(message: str) -> int:
    print(f"autoscaler trace convert: error: {message}", file=sys.stderr)
    return 2
