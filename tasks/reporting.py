"""What a job shows in the Prefect UI and on the terminal: its live status, its attempts, its cost; events.

Per flow run of a job (``JobReporter``), all created by the flow itself, so the UI lists
them under "Flow run":

- ``status-<job>``: one progress artifact, updated in place at every step (at most once a
  second) and every few seconds in between: step/total, loss, validation loss, throughput,
  USD spent against the budget, the plan in one line, the last event, and a chart (loss and
  validation loss over steps, samples/s and spend over time, attempts and preemptions marked:
  ``sailor_core/job/curves.py``) as a PNG data URI, which the UI renders, redrawn at most every
  ``CHART_EVERY_S`` and when the attempt or the status changes;
- ``attempts-<job>``: one markdown artifact, a section per attempt in order (why it was
  planned, what was rented and why, the plan, the Pareto front it was chosen from), updated
  in place as attempts start (the UI lists separate artifacts in no particular order);
- ``cost-<job>``: the instances, what each cost and how it ended, once the job ends.

Events (a preemption, the checkpoint, a re-plan, provisioning, training resumed) are INFO
lines ``job <job-id>: <what happened>`` of the flow run's log, the status artifact's last
event, and calls to this process's event listeners (``sailor train``'s terminal); ``sailor
train --deployment`` reads them back from the run's logs.
"""

from __future__ import annotations

import base64
import contextvars
import io
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.events import emit_event
from prefect.settings import PREFECT_UI_URL

from sailor_core.errors import SailorError
from sailor_core.job import report
from sailor_core.job.curves import curves_png
from sailor_core.job.state import JobState
from sailor_core.profiles import default_profile_db
from sailor_core.runtime.trackers import write_attempt_events

STATUS_EVERY_S = 1.0  # most one status update per this long while steps complete
TICK_S = 3.0  # and at least one per this long (spend grows while nothing else moves)
CHART_EVERY_S = 15.0  # the status's chart is redrawn at most this often (besides attempt and status changes)


def artifact_key(kind: str, job_id: str) -> str:
    # Prefect keys: lowercase letters, digits and dashes only.
    safe = "".join(c if c.isalnum() else "-" for c in job_id.lower())
    return f"{kind}-{safe}"[:120]


def flow_run_url(flow_run_id: Any) -> str | None:
    """The flow run's page in the Prefect UI (None without a server, e.g. Prefect's temporary one)."""
    base = PREFECT_UI_URL.value()
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run_id}" if base and flow_run_id else None


# ---- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent:
    kind: str  # "run" (the flow run started: url), "event" (text), "end" (text)
    job_id: str
    text: str = ""
    url: str | None = None


_listeners: list[Callable[[JobEvent], None]] = []


def add_event_listener(fn: Callable[[JobEvent], None]) -> None:
    _listeners.append(fn)


def remove_event_listener(fn: Callable[[JobEvent], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def _notify(event: JobEvent) -> None:
    for fn in list(_listeners):
        fn(event)


def event_line(job_id: str, text: str) -> str:
    return f"job {job_id}: {text}"


def event_text(job_id: str, log_message: str) -> str | None:
    """The event in a log line of the job's flow run (``event_line``'s), or None for other lines."""
    prefix = event_line(job_id, "")
    return log_message[len(prefix):] if log_message.startswith(prefix) else None


def emit_job_event(name: str, state: JobState, **payload: Any) -> None:
    """``sailor.job.<name>`` on the job as a resource (automations can trigger on it)."""
    emit_event(
        event=f"sailor.job.{name}",
        resource={"prefect.resource.id": f"sailor.job.{state.job_id}", "prefect.resource.name": state.job_id},
        payload={"attempt": state.attempt, "steps_done": state.steps_done,
                 "usd_spent": round(state.usd_spent(), 6), **payload},
    )


# ---- the parts of the artifacts ------------------------------------------------------------------


def mark_attempt(job_url: str, state: JobState, reason: str) -> None:
    """The attempt on the job's TensorBoard (run ``attempts``, at the step it starts from): its number,
    the spend and preemptions so far, the plan's price and throughput, why it runs."""
    if not state.spec.tensorboard or not state.replans:
        return
    record = state.replans[-1]
    scalars = {"number": state.attempt, "spend_usd": state.usd_spent(),
               "preemptions": sum(1 for i in state.instances if i.end_reason == "preempted"),
               "plan_usd_per_hr": record.usd_per_hr or 0.0,
               "plan_samples_per_s": record.throughput_samples_per_s or 0.0}
    plan = report.plan_line(state.plan, usd_per_hr=record.usd_per_hr, samples_per_s=record.throughput_samples_per_s)
    text = f"attempt {state.attempt} from step {record.at_step}: {reason}; {plan}"
    try:
        write_attempt_events(f"{job_url}/tensorboard", step=record.at_step or 0, attempt=state.attempt,
                             scalars=scalars, text=text)
    except Exception as exc:  # the curves never stop a job
        get_run_logger().warning("attempt %d not marked on TensorBoard: %s", state.attempt, exc)


def plan_rows(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica, with where its timing comes from (a measured profile or the estimator)."""
    rows = []
    for s, stage in enumerate(plan["stages"]):
        for r, rep in enumerate(stage["replicas"]):
            rows.append({"stage": s, "layers": f"[{stage['layers'][0]}, {stage['layers'][1]})", "replica": r,
                         "gpu": rep["gpu"], "tp": rep["tp"], "zone": rep["zone"],
                         "timing": _profile_source(plan, rep["gpu"], rep["tp"])})
    return rows


def _profile_source(plan: dict[str, Any], gpu: str, tp: int) -> str:
    try:
        p = default_profile_db().get(plan["model"], gpu, tp, plan["micro_batch_size"], plan.get("seq_len"))
    except SailorError as exc:
        return f"none: {exc}"
    return "measured" if all(layer.measured for layer in p.layers) else "estimated"


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


def pareto_markdown(points: list[tuple[float, float]], chosen: tuple[float, float] | None) -> str:
    if not points:
        return ""
    png = base64.b64encode(pareto_png(points, chosen)).decode()
    return (f"Plans on the Pareto front (cost against throughput):\n\n![Pareto front](data:image/png;base64,{png})"
            f"\n\n{report.markdown_table(report.pareto_rows(points, chosen))}")


def progress_description(state: JobState) -> str:
    """The job's progress in one line: step, loss, the last validation loss, attempt."""
    val = "" if state.last_val_loss is None else f", val loss {state.last_val_loss:.4f}"
    return f"step {state.steps_done}/{state.spec.steps}, loss {state.last_loss}{val}, attempt {state.attempt}"


def publish_cost_report(state: JobState) -> None:
    """The instances the job rented, what each cost and how it ended (a table artifact)."""
    now = state.updated_unix_s
    ledger = state.ledger()
    rows = report.cost_rows(state.instances, ledger.by_instance(now), now)
    # egress rows after the instances', in the same table: one artifact, its columns the union
    # (a checkpoint's to or from its bucket in another region: the row's "from" or "to" is bucket:<cloud>:<region>)
    rows += [{"instance": "egress", **r} for r in report.egress_rows(ledger.egress_by_pair())]
    parts = report.rent_and_egress(ledger.rent_usd(now), ledger.egress_usd(), ledger.checkpoint_egress_usd())
    create_table_artifact(key=artifact_key("cost", state.job_id), table=rows or [{"instance": "none", "USD": "0"}],
                          description=(f"{state.status}: {report.spend(ledger.spent_usd(now), state.spec.budget_usd)} "
                                       f"({parts}) "
                                       f"over {len(state.instances)} instances, {state.num_preemptions} preemptions"))


def _update_artifact(artifact_id: UUID, *, data: Any, description: str) -> None:
    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id=artifact_id, artifact=ArtifactUpdate(data=data, description=description))


# ---- one flow run of a job ------------------------------------------------------------------------


class JobReporter:
    """The status and attempts artifacts of one flow run of a job, and its events.

    ``on_progress`` is a progress listener of the watch (``tasks.workers``); a thread refreshes
    the status every ``TICK_S`` while nothing else does (start-up, re-planning: spend goes on).
    """

    def __init__(self, state: JobState, *, run_id: Any = None, url: str | None = None) -> None:
        self.job_id = state.job_id
        self._lock = threading.Lock()
        self._state = state
        self._last_event: tuple[float, str] | None = None
        self._last_push = 0.0
        self._rates: deque[tuple[float, int]] = deque(maxlen=60)
        self._training_attempt = 0
        self._sections: list[str] = []
        self._chart = ""  # the chart's markdown, and when and for what (attempt, status) it was drawn
        self._chart_drawn: tuple[float, int, str] = (0.0, -1, "")
        self._attempts_id: UUID | None = None
        self._status_id = create_progress_artifact(progress=self._pct(state), key=artifact_key("status", self.job_id),
                                                   description=self._status(state))
        self._stop = threading.Event()
        self._wake = threading.Event()  # an event to show now
        self._ticker = threading.Thread(target=contextvars.copy_context().run, args=(self._tick,), daemon=True,
                                        name=f"status-{self.job_id}")
        self._ticker.start()
        if url:
            get_run_logger().info("%s", event_line(self.job_id, f"flow run {url}"))
        _notify(JobEvent(kind="run", job_id=self.job_id, url=url, text=str(run_id or "")))

    # -- what the flow tells it

    def event(self, state: JobState, text: str) -> None:
        """Something happened that the user should hear of now: log, terminal, status."""
        get_run_logger().info("%s", event_line(self.job_id, text))
        with self._lock:
            self._last_event = (time.time(), text)
        _notify(JobEvent(kind="event", job_id=self.job_id, text=text))
        if self._stop.is_set():  # the ticker has stopped (the job's end): push it here
            self.push(state, force=True)
            return
        with self._lock:  # the ticker pushes it at once, off the flow's path (a recovery's events come in a row)
            self._state = state
        self._wake.set()

    def on_progress(self, state: JobState) -> None:
        now = time.time()
        with self._lock:
            if self._rates and (self._rates[-1][1] > state.steps_done or state.attempt != self._training_attempt):
                self._rates.clear()
            self._rates.append((now, state.steps_done))
            first = state.attempt != self._training_attempt
            self._training_attempt = state.attempt
        if first:
            record = state.replans[-1] if state.replans else None
            at = record.at_step if record else 0
            how = "" if record is None else report.restart_words(
                num_ranks=record.num_ranks, num_ranks_rejoined=record.num_ranks_rejoined,
                num_ranks_standby=record.num_ranks_standby, ready_s=record.ready_s,
                state_from=record.state_from)
            self.event(state, f"training: attempt {state.attempt} " + (f"resumed from step {at}" if at else "started")
                       + (f"; {how}" if how else ""))
        else:
            self.push(state)

    def attempt(self, state: JobState, *, reason: str, nodes: list[dict[str, Any]], history: list[str],
                pareto: str) -> None:
        """A new attempt runs: its section is added to the attempts artifact."""
        record = state.replans[-1]
        self._sections.append(report.attempt_markdown(
            start=report.AttemptStart(attempt=state.attempt, at_unix_s=record.at_unix_s, reason=reason,
                                      resume_step=record.at_step),
            budget=report.BudgetUse(spent_usd=state.usd_spent(), budget_usd=state.spec.budget_usd),
            plan=report.plan_line(state.plan, usd_per_hr=record.usd_per_hr,
                                  samples_per_s=record.throughput_samples_per_s),
            nodes=nodes, plan_rows=plan_rows(state.plan or {"stages": []}), history=history, pareto=pareto))
        markdown = "\n\n---\n\n".join(self._sections)
        description = (f"{state.attempt} attempt{'s' if state.attempt > 1 else ''}; "
                       f"latest: {reason}")
        if self._attempts_id is None:
            self._attempts_id = create_markdown_artifact(key=artifact_key("attempts", self.job_id), markdown=markdown,
                                                         description=description)
        else:
            _update_artifact(self._attempts_id, data=markdown, description=description)
        if state.attempt > 1:
            emit_job_event("replanned", state, reason=reason, plan=state.plan)

    def finish(self, state: JobState) -> None:
        """The job's instances are gone: the cost report, the final status; the ticker stops."""
        self._stop.set()
        self._wake.set()
        publish_cost_report(state)
        text = f"{state.status}: {state.status_reason}" if state.status_reason else state.status
        self.event(state, f"{text}; {report.spend(state.usd_spent(state.updated_unix_s), state.spec.budget_usd)}")
        _notify(JobEvent(kind="end", job_id=self.job_id, text=text))

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._ticker.join(timeout=5)

    # -- the status artifact

    def push(self, state: JobState, *, force: bool = False) -> None:
        with self._lock:
            self._state = state
            now = time.monotonic()
            if not force and now - self._last_push < STATUS_EVERY_S:
                return
            self._last_push = now
            pct, description = self._pct(state), self._status(state) + self._chart_markdown(state, now)
        _update_artifact(self._status_id, data=pct, description=description)

    def _tick(self) -> None:
        while True:
            woken = self._wake.wait(TICK_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                due = woken or time.monotonic() - self._last_push >= TICK_S
                state = self._state
            if due:
                try:
                    self.push(state, force=True)
                except Exception:  # noqa: BLE001  a missed refresh is harmless; the next one comes
                    pass

    def _chart_markdown(self, state: JobState, now: float) -> str:
        """The chart, redrawn when due (called under the lock); '' before the first step."""
        at, attempt, status = self._chart_drawn
        if now - at >= CHART_EVERY_S or attempt != state.attempt or status != state.status:
            if state.step_times or state.losses:
                png = base64.b64encode(curves_png(state, time.time())).decode()
                self._chart = f"\n\n![loss, samples/s and spend](data:image/png;base64,{png})"
            self._chart_drawn = (now, state.attempt, state.status)
        return self._chart

    @staticmethod
    def _pct(state: JobState) -> float:
        return round(100.0 * min(state.steps_done, state.spec.steps) / max(1, state.spec.steps), 1)

    def _samples_per_s(self, state: JobState) -> float | None:
        if len(self._rates) < 2 or time.time() - self._rates[-1][0] > 10:
            return None
        (t0, s0), (t1, s1) = self._rates[0], self._rates[-1]
        gbs = (state.plan or {}).get("global_batch_size") or state.spec.global_batch_size or 1
        return (s1 - s0) * gbs / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def _status(self, state: JobState) -> str:
        now = time.time()
        record = state.replans[-1] if state.replans else None
        ledger = state.ledger()
        progress = report.Progress(steps_done=state.steps_done, steps_target=state.spec.steps, loss=state.last_loss,
                                   val_loss=state.val_losses[-1] if state.val_losses else None,
                                   samples_per_s=self._samples_per_s(state),
                                   checkpoint=None if state.last_checkpoint_step is None else (
                                       state.last_checkpoint_step,
                                       state.last_checkpoint.at_unix_s if state.last_checkpoint else None))
        return report.status_markdown(
            progress=progress, budget=report.BudgetUse(spent_usd=ledger.spent_usd(now), egress_usd=ledger.egress_usd(),
                                                       checkpoint_egress_usd=ledger.checkpoint_egress_usd(),
                                                       budget_usd=state.spec.budget_usd),
            usd_per_hr_now=ledger.usd_per_hr(), attempt=state.attempt, status=state.status,
            plan=report.plan_line(state.plan, usd_per_hr=record.usd_per_hr if record else None),
            last_event=self._last_event)
