"""Demand traces: the canonical formats, loaders, resampling and the packaged default trace.

See :mod:`autoscaler.traces.formats` for the two canonical CSV formats and :mod:`autoscaler.traces.convert` for the
importers of public traces (``autoscaler trace convert``).
"""

from __future__ import annotations

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
