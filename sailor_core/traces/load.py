"""One entry point for every trace format: sniff the file and call its loader."""

from __future__ import annotations

import re
from pathlib import Path

from sailor_core.errors import InputError
from sailor_core.traces import spot
from sailor_core.traces.derive import derive_preset
from sailor_core.traces.model import AvailabilityTrace
from sailor_core.traces.sailor_csv import _read_text, parse_gpu_trace

_FORMAT_A = re.compile(r"^\s*\d+(\.\d+)?\s*,\s*\d+\s*$")
_FORMAT_B = re.compile(r"^\s*\d+\s*,\s*(add|remove)\s*,")
_FORMAT_C = re.compile(r"^\d{4}-\d{2}-\d{2},\s*\d{2}:\d{2}:\d{2},\s*\d+$")
_FORMAT_D = re.compile(r"^\[\d{4}-\d{2}-\d{2}T")


def detect_format(text: str) -> str:
    """``sailor``, ``A``, ``B``, ``C`` or ``D`` (spot_traces README, section 1)."""
    first = next((ln.strip() for ln in text.replace("\r", "").split("\n") if ln.strip()), "")
    if "Timestamp" in [f.strip() for f in first.split(",")]:
        return "sailor"
    for name, pattern in (("D", _FORMAT_D), ("C", _FORMAT_C), ("B", _FORMAT_B), ("A", _FORMAT_A)):
        if pattern.match(first):
            return name
    raise InputError(
        "unrecognised trace format: expected a Sailor GPU trace CSV (with a Timestamp column) "
        "or one of the spot_traces formats A-D"
    )


def load_trace(
    path: str | Path,
    *,
    gpu: str | None = None,
    zone: str | None = None,
    gpu_map: dict[str, str] | None = None,
) -> AvailabilityTrace:
    """Load any supported trace; ``gpu``/``zone`` override what a file name implies (A-C).

    ``derived:NAME[:SEED]`` generates one of the derived multi-day traces instead.
    """
    if str(path).startswith("derived:"):
        _, name, *rest = str(path).split(":")
        try:
            seed = int(rest[0]) if rest else 0
        except ValueError:
            raise InputError(f"derived trace seed must be an integer, got {rest[0]!r}") from None
        return derive_preset(name, seed=seed)
    text = _read_text(path)
    fmt = detect_format(text)
    try:
        if fmt == "sailor":
            return parse_gpu_trace(text, source=str(path))
        if fmt == "A":
            return spot.load_count_steps(path, gpu=gpu, zone=zone, gpu_map=gpu_map)
        if fmt == "B":
            return spot.load_node_events(path, gpu=gpu, zone=zone, gpu_map=gpu_map)
        if fmt == "C":
            return spot.load_sampled_counts(path, gpu=gpu, zone=zone, gpu_map=gpu_map)
        return spot.load_probe_log(path, gpu_map=gpu_map)
    except InputError:
        raise
    except (ValueError, KeyError) as exc:
        raise InputError(f"{path}: {exc}") from None
