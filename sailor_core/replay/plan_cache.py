"""Planner answers kept on disk, so replaying again (other policies, other seeds,
other traces over the same pools) does not re-run the same searches."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from sailor_core.controller import PlanFn, PlanOption
from sailor_core.traces import GpuZone


def _key(prefix: str, available: Mapping[GpuZone, int]) -> str:
    return prefix + "|" + ";".join(f"{g}@{z}={n}" for (g, z), n in sorted(available.items()) if n > 0)


def _to_json(o: PlanOption) -> dict:
    return {
        "gpus": [[g, z, n] for (g, z), n in sorted(o.gpus.items())],
        "throughput_samples_per_s": o.throughput_samples_per_s,
        "usd_per_hr": o.usd_per_hr,
        "label": o.label,
        "plan": o.plan.to_dict() if o.plan is not None and hasattr(o.plan, "to_dict") else None,
    }


def _from_json(d: dict) -> PlanOption:
    from sailor_core.plan import plan_from_dict

    return PlanOption(
        gpus={(g, z): int(n) for g, z, n in d["gpus"]},
        throughput_samples_per_s=float(d["throughput_samples_per_s"]),
        usd_per_hr=float(d["usd_per_hr"]),
        label=d.get("label", ""),
        plan=plan_from_dict(d["plan"], validate=False) if d.get("plan") else None,
    )


def persistent(plan_fn: PlanFn, path: str | Path, *, prefix: str) -> PlanFn:
    """``plan_fn`` with its answers stored in the JSON file ``path`` under ``prefix``
    (which must name everything the answers depend on: model, batch, knobs)."""
    path = Path(path)
    try:
        store: dict = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        store = {}  # a damaged cache only costs time

    def fn(available: Mapping[GpuZone, int]):
        key = _key(prefix, available)
        if key in store:
            try:
                return [_from_json(d) for d in store[key]]
            except (KeyError, TypeError, ValueError):
                pass
        options = list(plan_fn(available))
        store[key] = [_to_json(o) for o in options]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(store))
        os.replace(tmp, path)
        return options

    return fn
