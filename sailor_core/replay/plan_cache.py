"""Planner answers kept on disk, so replaying again (other policies, other seeds,
other traces over the same pools) does not re-run the same searches."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from sailor_core.controller import PlanFn, PlanOption, plan_option
from sailor_core.plan.types import plan_from_dict
from sailor_core.traces import GpuZone


def _key(prefix: str, available: Mapping[GpuZone, int]) -> str:
    return prefix + "|" + ";".join(f"{g}@{z}={n}" for (g, z), n in sorted(available.items()) if n > 0)


def _to_json(o: PlanOption) -> dict:
    return {
        "gpus": [[g, z, n] for (g, z), n in sorted(o.gpus.items())],
        "throughput_samples_per_s": o.throughput_samples_per_s,
        "usd_per_hr": o.usd_per_hr,
        "egress_usd_per_hr": o.egress_usd_per_hr,
        "label": o.label,
        "plan": o.plan.to_dict() if o.plan is not None and hasattr(o.plan, "to_dict") else None,
    }


def _from_json(d: dict) -> PlanOption:
    """An option as stored; a KeyError for one stored before options carried their egress (the
    caller then plans again: its egress is not known)."""
    x, usd, egress = float(d["throughput_samples_per_s"]), float(d["usd_per_hr"]), float(d["egress_usd_per_hr"])
    if d.get("plan"):  # its GPUs on each market, label and on-demand premiums follow from the plan
        return plan_option(plan_from_dict(d["plan"], validate=False), throughput_samples_per_s=x, usd_per_hr=usd,
                           egress_usd_per_hr=egress)
    return PlanOption(gpus={(g, z): int(n) for g, z, n in d["gpus"]}, throughput_samples_per_s=x, usd_per_hr=usd,
                      label=d.get("label", ""), egress_usd_per_hr=egress)


class PersistentPlanner:
    """``plan_fn`` with its answers stored in the JSON file ``path`` under ``prefix``
    (which must name everything the answers depend on: model, batch, knobs).

    The file is rewritten at most every ``write_interval_s`` while answers come in
    (rewriting a few MB after every one of a cold replay's hundreds of calls took
    longer than many of the calls), and by ``flush()``.
    """

    def __init__(self, plan_fn: PlanFn, path: str | Path, *, prefix: str, write_interval_s: float = 5.0,
                 store: dict | None = None) -> None:
        self.plan_fn, self.path, self.prefix, self.write_interval_s = plan_fn, Path(path), prefix, write_interval_s
        if store is None:
            try:
                store = json.loads(self.path.read_text()) if self.path.exists() else {}
            except (OSError, json.JSONDecodeError):
                store = {}  # a damaged cache only costs time
        self.store: dict = store
        self._dirty = False
        self._written_at = time.monotonic()

    def sibling(self, plan_fn: PlanFn, *, prefix: str) -> PersistentPlanner:
        """Another planner's answers in the same file (the same store: whichever flushes writes all)."""
        return PersistentPlanner(plan_fn, self.path, prefix=prefix, write_interval_s=self.write_interval_s,
                                 store=self.store)

    def __call__(self, available: Mapping[GpuZone, int]):
        key = _key(self.prefix, available)
        if key in self.store:
            try:
                return [_from_json(d) for d in self.store[key]]
            except (KeyError, TypeError, ValueError):
                pass
        options = list(self.plan_fn(available))
        self.store[key] = [_to_json(o) for o in options]
        self._dirty = True
        if time.monotonic() - self._written_at >= self.write_interval_s:
            self.flush()
        return options

    def flush(self, *, force: bool = False) -> None:
        if not (self._dirty or force):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.store))
        os.replace(tmp, self.path)
        self._dirty = False
        self._written_at = time.monotonic()


def persistent(plan_fn: PlanFn, path: str | Path, *, prefix: str) -> PersistentPlanner:
    """``plan_fn`` with its answers kept on disk (see PersistentPlanner); call ``flush()`` when done."""
    return PersistentPlanner(plan_fn, path, prefix=prefix)
