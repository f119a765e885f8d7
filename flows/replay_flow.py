"""``replay`` flow: a thin Prefect wrapper around ``sailor_core.replay.run_policies``.

Its parameters are ReplaySpec's fields (``sailor_core/specs/replay.py``), as ``sailor replay`` takes them.

Publishes the comparison as a table artifact and the timeline PNG (embedded in
a markdown artifact) so the UI shows what each policy would cost and take.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.spec_parameters import takes_spec
from sailor_core.specs.replay import ReplaySpec


@task(name="replay-policies", tags=["replay"])
def replay_task(spec: ReplaySpec) -> tuple[dict[str, Any], bytes]:
    # lazy: the replay and its plotting (matplotlib) load in the task that runs them
    from sailor_core.replay import run_policies
    from sailor_core.replay.plot import plot_timeline
    from sailor_core.traces import load_trace

    availability = load_trace(spec.trace, gpu=spec.trace_gpu, zone=spec.trace_zone)
    suite = run_policies(availability, spec)
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "timeline.png"
        plot_timeline(suite.results, png, trace=availability,
                      title=f"{spec.model}, {spec.tokens:.3g} tokens, {spec.trace}")
        return suite.to_dict(), png.read_bytes()


def summary_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    # lazy: as below: the flow module stays light for `prefect deploy`
    from sailor_core.replay import activity_words

    rows = []
    for name, r in summary["policies"].items():
        t = r["time_to_train_s"]
        rows.append({
            "policy": name,
            "finished": r["finished"],
            "time_to_train_h": round(t / 3600, 3) if t is not None else None,
            "usd_spent": round(r["usd_spent"], 2),
            "cost_ratio_to_ours": None if r.get("cost_ratio_to_ours") is None else round(r["cost_ratio_to_ours"], 3),
            "time_ratio_to_ours": None if r.get("time_ratio_to_ours") is None else round(r["time_ratio_to_ours"], 3),
            "useful_work_fraction": round(r["useful_work_fraction"], 3),
            "replans": r["num_replans"],
            "restarts": r["num_restarts"],
            "paid_gpu_time": activity_words(r.get("gpu_s_by_activity") or {}),
            "stop_reason": r["stop_reason"],
        })
    return rows


@flow(name="replay", log_prints=True)
@takes_spec(ReplaySpec)
def replay_flow(spec: ReplaySpec) -> dict[str, Any]:
    """Replay a trace under each policy (``sailor replay``'s settings) and publish the comparison."""
    trace, model, tokens = spec.trace, spec.model, spec.tokens
    summary, png = replay_task(spec)
    create_table_artifact(key="replay-summary", table=summary_rows(summary),
                          description=f"Replay of {trace}: {model}, {tokens:.3g} tokens")
    data = base64.b64encode(png).decode()
    create_markdown_artifact(key="replay-timeline",
                             markdown=f"### Replay timeline: {trace}\n\n![timeline](data:image/png;base64,{data})\n",
                             description="GPUs in use per type and throughput over time, per policy")
    for row in summary_rows(summary):
        print(row)
    return summary
