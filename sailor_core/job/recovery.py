"""Between the attempts of a training job: the rules the train-job flow follows, as pure functions.

An attempt is one plan running on one set of instances.  The flow (``flows/train_job.py``)
asks the controller what to run, provisions it and watches it; these functions say what
each ending means: the job's status, what the controller hears next, which instance
records to close and how, and when waiting or retrying has gone on long enough.
``Recovery`` is what the flow's loop carries from one attempt (or wait) to the next.
Reasons are plain words, as ``sailor status`` and the Prefect UI show them: "spot
preemption took 2 of 2 T4s in us-central1-a at step 12; re-planned on 2 T4 in us-central1-b".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sailor_core.controller import Action, Decision, Event, EventKind, PlanOption
from sailor_core.job import report
from sailor_core.job import state as js
from sailor_core.job.attempts import INSTANCE_PREEMPTED, AttemptOutcome

# Consecutive attempts that end without a new checkpoint before the job gives up.
MAX_ATTEMPTS_WITHOUT_PROGRESS = 3
# While no plan fits what is offered (or can be placed): how long to wait between looks, and how many looks.
WAIT_S = 10.0
MAX_WAITS = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What the job's loop remembers between attempts."""

    event: Event  # what the controller hears next
    current: PlanOption | None = None  # the plan of the attempt that ran last
    num_waits: int = 0  # looks in a row that placed nothing
    num_without_progress: int = 0  # attempts in a row that ended without a new checkpoint
    cause: str = ""  # why the next plan is needed, in words ("" for a new job)
    bad_input: bool = False  # the last attempt's workers refused their inputs before a new checkpoint

    @property
    def out_of_waits(self) -> bool:
        return self.num_waits > MAX_WAITS

    @property
    def stalled(self) -> bool:
        """Give up: a refusal of the inputs would meet every plan alike, or attempts keep ending early."""
        return self.bad_input or self.num_without_progress >= MAX_ATTEMPTS_WITHOUT_PROGRESS


def start(state: js.JobState) -> Recovery:
    """A flow run's first look: a new job starts; a job with attempts behind it is resumed."""
    cause = "" if state.attempt == 0 else f"a new flow run picked the job up at step {state.last_checkpoint_step or 0}"
    return Recovery(event=Event(kind=EventKind.START), cause=cause)


def status_when_stopped(state: js.JobState) -> str:
    """The controller stopped the job: done if the checkpoints reach the step target, else the budget stopped it."""
    done = state.last_checkpoint_step is not None and state.last_checkpoint_step >= state.spec.steps
    return js.SUCCEEDED if done else js.STOPPED_BUDGET


def waited(rec: Recovery) -> Recovery:
    """The controller found nothing to run on what is offered now."""
    return dataclasses.replace(rec, num_waits=rec.num_waits + 1)


def choose(rec: Recovery, decision: Decision) -> tuple[Recovery, str]:
    """A plan is chosen: the reason the job records for it (what happened, what runs now, and the
    controller's economics in words: ``Decision.why``), and the loop with that reason used up."""
    on = report.gpus(decision.plan.all_gpus())  # spot and on demand
    if decision.action == Action.CONTINUE and rec.current is not None:
        what = f"restarted the same plan on {on}"
    elif rec.cause:
        what = f"re-planned on {on}"
    else:
        what = f"planned on {on}"
    reason = f"{rec.cause}; {what}" if rec.cause else what
    if decision.why:  # the controller's economics: the stormy pools it left, on demand, ...
        reason += f"; {decision.why}"
    return dataclasses.replace(rec, cause=""), reason


def start_attempt(state: js.JobState, option: PlanOption, reason: str) -> js.JobState:
    """The job as it starts an attempt on ``option``: the first attempt runs, later ones recover."""
    state = js.with_plan(state, plan=option.plan.to_dict(), reason=reason, usd_per_hr=option.usd_per_hr,
                         throughput_samples_per_s=option.throughput_samples_per_s)
    return js.with_status(state, js.RUNNING if state.attempt == 1 else js.RECOVERING, reason)


def no_capacity(rec: Recovery, why: str = "") -> Recovery:
    """Provisioning found no room for some node: a wait, after which the controller plans afresh."""
    return dataclasses.replace(rec, event=Event(kind=EventKind.CAPACITY), current=None, num_waits=rec.num_waits + 1,
                               cause="no capacity for the last plan" + (f" ({why})" if why else ""))


def launched(rec: Recovery) -> Recovery:
    """Only a launch that worked ends a streak of waits: a plan that can never be placed (every
    launch refused) must not restart the count, or the job would retry forever."""
    return dataclasses.replace(rec, num_waits=0)


def available_with(available: Mapping[tuple[str, str], int], gpus: Mapping[tuple[str, str], int]
                   ) -> dict[tuple[str, str], int]:
    """What the controller may plan on once a failover placed ``gpus`` elsewhere: the placed GPUs count as available."""
    return {**available, **{k: max(n, available.get(k, 0)) for k, n in gpus.items()}}


def close_preempted(state: js.JobState, outcome: AttemptOutcome) -> js.JobState:
    """After an attempt the cloud or its agents ended with a preemption, close those instances' records as
    preemptions now.  The cloud may still call them "stopping" (their notice window), and re-provisioning
    would then close them as merely terminated; they will not run again."""
    if outcome.kind != INSTANCE_PREEMPTED:
        return state
    return js.with_instances_ended(state, set(outcome.instance_ids), "preempted")


def preemption_event(state: js.JobState, instance_ids: Sequence[str]) -> Event:
    """The controller's event for a preemption: the GPUs lost per (type, zone), and the zone it struck."""
    lost: dict[tuple[str, str], int] = {}
    for r in state.instances:
        if r.instance_id in instance_ids:
            lost[(r.gpu, r.zone)] = lost.get((r.gpu, r.zone), 0) + r.num_gpus
    return Event(kind=EventKind.PREEMPTION, lost=lost, zone_hint=next(iter(lost))[1] if lost else None)


def preemption_words(state: js.JobState, instance_ids: Sequence[str]) -> str:
    """``spot preemption took 2 of 2 T4s in us-central1-a at step 12``: the GPUs lost per pool, out
    of those the job held there in this attempt."""
    started = state.replans[-1].at_unix_s if state.replans else 0.0
    lost: dict[tuple[str, str], int] = {}
    held: dict[tuple[str, str], int] = {}
    for r in state.instances:
        key = (r.gpu, r.zone)
        if r.instance_id in instance_ids:
            lost[key] = lost.get(key, 0) + r.num_gpus
        if r.ended_unix_s is None or r.ended_unix_s >= started:
            held[key] = held.get(key, 0) + r.num_gpus
    pools = " and ".join(f"{n} of {max(n, held.get((gpu, zone), 0))} {gpu}s in {zone}"
                         for (gpu, zone), n in sorted(lost.items()))
    return f"spot preemption took {pools or 'instances ' + ', '.join(instance_ids)} at step {state.steps_done}"


def after_attempt(rec: Recovery, state: js.JobState, outcome: AttemptOutcome, *, ran: PlanOption,
                  checkpoint_before: int | None) -> Recovery:
    """An attempt of ``ran`` ended early (preempted, lost, failed, or replaced by the controller);
    ``state`` has its survivors stopped and its newest checkpoint noted.

    Workers that refused their inputs (``AttemptOutcome.bad_input``) stall the job at once, unless the
    attempt saved a new checkpoint first: then it trained on those inputs, and what failed later (a
    read of remote data, say) may pass on the next attempt."""
    if outcome.kind == INSTANCE_PREEMPTED:
        event, cause = preemption_event(state, outcome.instance_ids), preemption_words(state, outcome.instance_ids)
    else:
        event, cause = Event(kind=EventKind.CAPACITY), f"{outcome.reason} at step {state.steps_done}"
    progressed = state.last_checkpoint_step != checkpoint_before
    return dataclasses.replace(
        rec, event=event, current=ran,  # broken by the preemption's lost GPUs, or still whole after a crash
        num_without_progress=0 if progressed else rec.num_without_progress + 1, cause=cause,
        bad_input=outcome.bad_input and not progressed)


def stalled_reason(rec: Recovery, outcome: AttemptOutcome) -> str:
    """Why the job gives up: the workers' refusal in their words, or the streak of attempts."""
    if rec.bad_input:
        return outcome.reason
    return f"{rec.num_without_progress} attempts without a new checkpoint; last: {outcome.reason}"


def latest(state: js.JobState, saved: js.JobState) -> js.JobState:
    """The newer of the flow body's own state and the saved one (a task interrupted mid-way, e.g.
    the watch, saved progress the body never saw)."""
    return saved if saved.updated_unix_s > state.updated_unix_s else state


def ended_by_exception(state: js.JobState, saved: js.JobState, exc: BaseException, *,
                       cancelled: bool) -> js.JobState:
    """The flow body raised: the latest state, cancelled (stopped at once: a second Ctrl-C, the end
    of the stop's grace period, the flow's process terminated) or failed."""
    state = latest(state, saved)
    if not cancelled:
        return js.with_status(state, js.FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
    how = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "its flow run's process was ended"
    saved_words = (f"checkpoint {state.last_checkpoint_step} is the newest" if state.last_checkpoint_step is not None
                   else "no checkpoint yet")
    return js.with_status(state, js.CANCELLED, f"stopped at once ({how}) at step {state.steps_done}; {saved_words}; "
                                               f"continue with `sailor train --job-id {state.job_id}`")
