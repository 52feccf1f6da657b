"""Demand traces: the canonical formats, loaders, resampling and the packaged traces.

See :mod:`autoscaler.traces.formats` for the two canonical CSV formats and :mod:`autoscaler.traces.convert` for the
importers of public traces (``autoscaler trace convert``). The packaged traces and their provenance are described in
``autoscaler/data/SOURCES.md``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from autoscaler.traces.formats import (
    DEFAULT_REQUEST_LOG_STEP_S,
    STEP_JITTER_TOLERANCE,
    RateSeries,
    RequestLog,
    TraceFormatError,
    bin_requests,
    load_request_log,
    load_trace,
    parse_time,
    resample,
    summarise,
    summarise_request_log,
    write_rate_series,
    write_request_log,
)

#: File names (in ``autoscaler/data/``) of the traces shipped with the package.
DEFAULT_TRACE = "servegen-m-large-14d-60s.csv.gz"
PACKAGED_TRACES: dict[str, str] = {
    "servegen-m-large": DEFAULT_TRACE,
    "azure-llm-2023-conv": "azure-llm-2023-conv.csv.gz",
    "azure-llm-2023-code": "azure-llm-2023-code.csv.gz",
}


def packaged_trace_path(name: str) -> Path:
    """Path of a packaged trace by its short name (a key of :data:`PACKAGED_TRACES`)."""
    try:
        file_name = PACKAGED_TRACES[name]
    except KeyError:
        raise KeyError(f"no packaged trace {name!r}; known: {', '.join(PACKAGED_TRACES)}") from None
    # The package is installed as plain files (never zipped: setuptools package-data), so the resource is a real path.
    return Path(str(files("autoscaler").joinpath("data", file_name)))


def default_trace_path() -> Path:
    """The packaged default demand trace: ServeGen ``language/m-large``, 14 days at 60 s (a rate series)."""
    return packaged_trace_path("servegen-m-large")


__all__ = [
    "DEFAULT_REQUEST_LOG_STEP_S",
    "DEFAULT_TRACE",
    "PACKAGED_TRACES",
    "STEP_JITTER_TOLERANCE",
    "RateSeries",
    "RequestLog",
    "TraceFormatError",
    "bin_requests",
    "default_trace_path",
    "load_request_log",
    "load_trace",
    "packaged_trace_path",
    "parse_time",
    "resample",
    "summarise",
    "summarise_request_log",
    "write_rate_series",
    "write_request_log",
]
