"""Spot-availability traces: files of seven formats in, one canonical per-interval table out.

The pipeline, one module per job:

- `forecasting.traces.formats`: a reader per file format, each checking its file line by line, and the bounds on
  what a file may hold; every reader returns
- `forecasting.traces.events`: `AvailabilityEvents`, the changes of the instance count over time, which
- `forecasting.traces.table`: `to_intervals` bins onto the canonical table (`COLUMNS`), exactly as the Parcae
  reference does; `resample`, `slice_hours`, `scale_trace` work on that table;
- `forecasting.traces.catalog`: trace names (bundled and shared) -> files, and `load_trace` (name or path -> table).

This package must never import the planner (liveput, simulator, CLI), so that traces can be loaded, plotted and
forecast without the optimizer. Code outside `forecasting` imports these names from `forecasting` itself.
"""

from __future__ import annotations

from forecasting.traces.catalog import (
    BUNDLED,
    DATA_DIR,
    UnknownTraceError,
    available_traces,
    load_trace,
    shared_traces_dir,
    trace_cloud,
)
from forecasting.traces.events import AvailabilityEvents, TraceFormatError, from_count_series
from forecasting.traces.formats import (
    FORMATS,
    MAX_LINE_CHARS,
    MAX_TIME_VALUE,
    MAX_TRACE_BYTES,
    TIME_RANGE,
    detect_format,
    events_from_log,
    read_aws_step_csv,
    read_count_csv,
    read_event_csv,
    read_events,
    read_gcp_log,
    read_skypilot_json,
    read_skypilot_log,
)
from forecasting.traces.table import (
    COLUMNS,
    MAX_INTERVALS,
    counts_table,
    resample,
    scale_trace,
    slice_hours,
    to_intervals,
)
from liveput import DEFAULT_INTERVAL_S, INTERVAL_S_RANGE, MAX_INSTANCES  # the grid and the count bound are liveput's

__all__ = [
    "BUNDLED",
    "COLUMNS",
    "DATA_DIR",
    "DEFAULT_INTERVAL_S",
    "FORMATS",
    "INTERVAL_S_RANGE",
    "MAX_INSTANCES",
    "MAX_INTERVALS",
    "MAX_LINE_CHARS",
    "MAX_TIME_VALUE",
    "MAX_TRACE_BYTES",
    "TIME_RANGE",
    "AvailabilityEvents",
    "TraceFormatError",
    "UnknownTraceError",
    "available_traces",
    "trace_cloud",
    "counts_table",
    "detect_format",
    "events_from_log",
    "from_count_series",
    "load_trace",
    "read_aws_step_csv",
    "read_count_csv",
    "read_event_csv",
    "read_events",
    "read_gcp_log",
    "read_skypilot_json",
    "read_skypilot_log",
    "resample",
    "scale_trace",
    "shared_traces_dir",
    "slice_hours",
    "to_intervals",
]
