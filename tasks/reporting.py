"""What a job shows in the Prefect UI: artifacts for plans, progress, re-plans and cost; events.

Artifact keys are per job (``<kind>-<job id>``), so every version of a job's
plan or cost report lines up under one key across attempts and flow runs.
"""

from __future__ import annotations

import base64
import io
from typing import Any
from uuid import UUID

from prefect import task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from sailor_core.errors import SailorError
from sailor_core.job.state import JobState
from sailor_core.profiles import default_profile_db


def artifact_key(kind: str, job_id: str) -> str:
    # Prefect keys: lowercase letters, digits and dashes only.
    safe = "".join(c if c.isalnum() else "-" for c in job_id.lower())
    return f"{kind}-{safe}"[:120]


def plan_rows(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica, with where its timing comes from (a measured profile or the estimator)."""
    rows = []
    for s, stage in enumerate(plan["stages"]):
        for r, rep in enumerate(stage["replicas"]):
            rows.append({"stage": s, "layers": f"[{stage['layers'][0]}, {stage['layers'][1]})", "replica": r,
                         "gpu": rep["gpu"], "tp": rep["tp"], "zone": rep["zone"],
                         "profile": _profile_source(plan, rep["gpu"], rep["tp"])})
    return rows


def _profile_source(plan: dict[str, Any], gpu: str, tp: int) -> str:
    try:
        p = default_profile_db().get(plan["model"], gpu, tp, plan["micro_batch_size"], plan.get("seq_len"))
    except SailorError as exc:
        return f"none ({exc})"
    return "measured" if all(layer.measured for layer in p.layers) else f"estimated ({p.source})"


@task(name="publish-plan", tags=["report"], cache_policy=NO_CACHE)
def publish_plan(state: JobState, *, nodes: list[dict[str, Any]], sim: dict[str, Any], reason: str,
                 history: list[str] | None = None) -> None:
    """The chosen plan as a table, and the re-plan with its reason as markdown."""
    plan = state.plan or {}
    create_table_artifact(
        key=artifact_key("plan", state.job_id),
        table=plan_rows(plan),
        description=(f"Plan of attempt {state.attempt} ({reason}): global batch {plan.get('global_batch_size')}, "
                     f"micro-batch {plan.get('micro_batch_size')}, "
                     f"{sim.get('throughput_samples_per_s', 0):.2f} samples/s predicted, "
                     f"{sum(n['usd_per_hr'] for n in nodes):.3f} USD/h"),
    )
    lines = [f"# Attempt {state.attempt}: {reason}", "",
             f"Resumes from checkpoint step **{state.last_checkpoint_step or 0}**; "
             f"{state.usd_spent():.4f} of {state.spec.budget_usd:.2f} USD spent so far.", "",
             "| instance type | zone | GPUs | ranks | USD/h |", "|---|---|---|---|---|"]
    for n in nodes:
        lines.append(f"| {n['instance_type']} | {n['zone']} | {n['gpus_per_node']} x {n['gpu']} | "
                     f"{','.join(map(str, n['ranks']))} | {n['usd_per_hr']:.3f} |")
    if history:
        lines += ["", "Provisioning (zone by zone, cheapest first):", ""] + [f"- {h}" for h in history]
    create_markdown_artifact(key=artifact_key("replan", state.job_id), markdown="\n".join(lines),
                             description=f"attempt {state.attempt}: {reason}")


def pareto_png(points: list[tuple[float, float]], chosen: tuple[float, float] | None) -> bytes:
    """Cost (USD/iteration) against throughput (samples/s) of the planner's Pareto front."""
    import matplotlib  # lazy: matplotlib (~0.3 s), only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as matplotlib, and after choosing its backend

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
    if points:
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "o-", label="Pareto front")
    if chosen:
        ax.plot([chosen[0]], [chosen[1]], "r*", markersize=14, label="chosen")
    ax.set_xlabel("throughput (samples/s)")
    ax.set_ylabel("USD per iteration")
    ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


@task(name="publish-pareto", tags=["report"], cache_policy=NO_CACHE)
def publish_pareto(job_id: str, points: list[tuple[float, float]], chosen: tuple[float, float] | None) -> None:
    png = base64.b64encode(pareto_png(points, chosen)).decode()
    rows = "\n".join(f"| {t:.3f} | {c:.6f} |" for t, c in sorted(points))
    create_markdown_artifact(
        key=artifact_key("pareto", job_id),
        markdown=(f"![Pareto front](data:image/png;base64,{png})\n\n| samples/s | USD/iteration |\n|---|---|\n{rows}"),
        description="cost vs throughput of the plans on the Pareto front",
    )


def progress_description(state: JobState) -> str:
    """The progress artifact's line: step, loss, the last validation loss, attempt."""
    val = "" if state.last_val_loss is None else f", val loss {state.last_val_loss:.4f}"
    return f"step {state.steps_done}/{state.spec.steps}, loss {state.last_loss}{val}, attempt {state.attempt}"


class ProgressReporter:
    """One progress artifact per flow run, updated as steps complete (throttled by the caller)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.artifact_id: UUID | None = None
        self.last_pct = -1.0

    def update(self, steps_done: int, steps_target: int, description: str) -> None:
        pct = round(100.0 * min(steps_done, steps_target) / max(1, steps_target), 1)
        if pct == self.last_pct:
            return
        if self.artifact_id is None:
            self.artifact_id = create_progress_artifact(progress=pct, key=artifact_key("progress", self.job_id),
                                                        description=description)
        else:
            update_progress_artifact(self.artifact_id, progress=pct, description=description)
        self.last_pct = pct


@task(name="publish-cost-report", tags=["report"], cache_policy=NO_CACHE)
def publish_cost_report(state: JobState) -> None:
    by_instance = state.ledger().by_instance(state.updated_unix_s)
    rows = [{"instance": i.instance_id, "zone": i.zone, "instance_type": i.instance_type, "attempt": i.attempt,
             "usd_per_hr": round(i.usd_per_hr, 4),
             "hours": round(((i.ended_unix_s or state.updated_unix_s) - i.launched_unix_s) / 3600.0, 6),
             "usd": round(by_instance.get(i.instance_id, 0.0), 6), "ended": i.end_reason or "running"}
            for i in state.instances]
    total = state.usd_spent(state.updated_unix_s)
    create_table_artifact(key=artifact_key("cost", state.job_id), table=rows or [{"instance": "none", "usd": 0.0}],
                          description=(f"{state.status}: {total:.4f} of {state.spec.budget_usd:.2f} USD spent "
                                       f"over {len(state.instances)} instances, {state.num_preemptions} preemptions"))


def emit_job_event(name: str, state: JobState, **payload: Any) -> None:
    """``sailor.job.<name>`` on the job as a resource (automations can trigger on it)."""
    emit_event(
        event=f"sailor.job.{name}",
        resource={"prefect.resource.id": f"sailor.job.{state.job_id}", "prefect.resource.name": state.job_id},
        payload={"attempt": state.attempt, "steps_done": state.steps_done,
                 "usd_spent": round(state.usd_spent(), 6), **payload},
    )
