"""GPU availability traces: Sailor's CSV, the measured spot traces (formats A-D), derived traces."""

from sailor_core.traces.derive import (
    DERIVED_PRESETS,
    MEASURED_BEHAVIOURS,
    PoolBehaviour,
    PoolSpec,
    derive_preset,
    derive_trace,
)
from sailor_core.traces.load import detect_format, load_trace
from sailor_core.traces.model import AvailabilityTrace, Counts, GpuZone, PreemptionEvent, build_trace
from sailor_core.traces.sailor_csv import load_gpu_trace, parse_gpu_trace, write_gpu_trace
from sailor_core.traces.spot import (
    SPOT_GPU_MAP,
    load_count_steps,
    load_node_events,
    load_probe_log,
    load_sampled_counts,
    parse_probe_log,
)
from sailor_core.traces.stats import PoolStatistics, pool_statistics

__all__ = [
    "DERIVED_PRESETS",
    "MEASURED_BEHAVIOURS",
    "PoolBehaviour",
    "PoolSpec",
    "derive_preset",
    "derive_trace",
    "SPOT_GPU_MAP",
    "AvailabilityTrace",
    "Counts",
    "GpuZone",
    "PoolStatistics",
    "PreemptionEvent",
    "build_trace",
    "detect_format",
    "load_count_steps",
    "load_gpu_trace",
    "load_node_events",
    "load_probe_log",
    "load_sampled_counts",
    "load_trace",
    "parse_gpu_trace",
    "parse_probe_log",
    "pool_statistics",
    "write_gpu_trace",
]
