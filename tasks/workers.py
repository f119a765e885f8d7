"""Tasks that run an attempt on its instances: assign ranks, watch, stop.

The flow talks to each instance's agent (``sailor_core.runtime.agent``)
through the assignment/status documents under the job's URL
(``sailor_core.job.protocol``); the agent starts the engine's workers and
forwards rank 0's per-step metrics.

These tasks carry no tags: Prefect asks the server for a concurrency slot of each tag of a task run
before its body runs (a write on the server's SQLite), and while a job writes its status, logs and
events that write was refused as busy (503), to be retried 2 s later, on a recovery's path
(benchmarks/bench_task_start.py; docs/orchestration.md).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from sailor_core.controller import Action, Event, EventKind
from sailor_core.controller.options import with_measured_egress
from sailor_core.job import state as js
from sailor_core.job.attempts import (
    LOST,
    RUNNING,
    WORKER_FAILED,
    AttemptOutcome,
    classify_attempt,
    restart_facts,
    run_generation,
    stop_generation,
)
from sailor_core.job.nodes import NodeRequest
from sailor_core.job.protocol import (
    AgentAction,
    AgentAssignment,
    AgentState,
    AgentStatus,
    CheckpointReport,
    InjectionReport,
    InjectPreemption,
    STOP_MAX_S,
    read_status,
    write_assignment,
)
from sailor_core.job.worker_args import worker_argv
from sailor_core.network.model import default_network
from sailor_core.network.storage_egress import pair_usd_per_byte
from sailor_core.plan.layout import world_size
from sailor_core.plan.types import plan_from_dict
from tasks.agent_watch import CLOUD_POLL_S, POLL_S, AgentPoll, Listeners, Poll, watch_agents
from tasks.control import DecisionWarmup, controller_decision
from tasks.reporting import progress_description

BUDGET = "budget"  # outcome: the controller stops the job before the budget would be crossed
STOPPED = "stopped"  # outcome: someone asked the job to stop (its reason: who, ``StopRequest.by``)
REPLAN = "replan"  # outcome: the controller switches plans (shrink to fit the budget, or new capacity)
DECIDE_EVERY_S = 1.0
SAVE_EVERY_S = 1.0
PROGRESS_EVERY_S = 1.0  # the Prefect progress artifact: one API call each
# The longest the flow waits for new instances' standby workers before their first assignment:
# an import that never ends (a standby worker that died) must not hold the job.
STANDBY_WAIT_S = 30.0

# Listeners in this process (the CLI's progress bar): told of the job state on progress.
_listeners: Listeners[js.JobState] = Listeners()
add_progress_listener = _listeners.add
remove_progress_listener = _listeners.remove


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    """One instance of the attempt and the node of the plan it serves."""

    instance_id: str
    node: NodeRequest
    address: str  # where its processes are reached from the other instances


def assignment_doc(state: js.JobState, a: Assignment, *, master: Assignment, master_port: int,
                   data_url: str, worker_args: Sequence[str], env: dict[str, str], job_url: str) -> AgentAssignment:
    """``job_url``: the job's folder as its instances reach it (its ``tensorboard/`` is there)."""
    plan = state.plan or {}
    return AgentAssignment(
        generation=run_generation(state.attempt), attempt=state.attempt, action=AgentAction.RUN,
        plan=plan, ranks=tuple(a.node.ranks), world_size=world_size(plan_from_dict(plan)),
        master_addr=master.address, master_port=master_port, steps=state.spec.steps,
        data=data_url, ckpt_url=state.spec.checkpoint_url, ckpt_every=state.spec.checkpoint_every_steps,
        resume=True, seed=state.spec.seed,
        extra_worker_args=(*worker_argv(state.spec), *worker_args, "--job-id", state.job_id,
                           *(("--tensorboard-url", f"{job_url}/tensorboard") if state.spec.tensorboard else ())),
        env=env,
    )


@task(name="assign-workers", cache_policy=NO_CACHE)
def assign(session, state: js.JobState, assignments: Sequence[Assignment], *, data_url: str,
           interim: bool = False) -> None:
    """Tell every agent its ranks; the instance holding rank 0 hosts the rendezvous.  An
    ``interim`` attempt (survivors training while the next plan's instances boot) gets no
    injected preemption: ``--preempt-at`` waits for the attempt after it."""
    master = min(assignments, key=lambda a: a.node.ranks[0])
    port = session.rendezvous_port(master)
    data_url = session.data_url(data_url)  # a local file is copied to the job's bucket once
    # and a local --init-from folder likewise: the workers read it where they run
    state = dataclasses.replace(state, spec=dataclasses.replace(state.spec, init_from=session.folder_url(state.spec.init_from)))
    inject = None if interim else injection_doc(session, state, assignments)
    if inject is None and not interim and preemption_for_attempt(state) is not None:
        get_run_logger().warning("--preempt-at is for the embedded cloud only; no preemption is injected here"
                                 if session.control_url is None else
                                 "every node of this attempt is on demand (never preempted): --preempt-at waits "
                                 "for an attempt with spot nodes")
    for a in assignments:
        doc = assignment_doc(state, a, master=master, master_port=port, data_url=data_url,
                             worker_args=session.worker_args(a), env=session.worker_env(a),
                             job_url=session.jobs_url)
        if inject is not None and a is master:
            doc = dataclasses.replace(doc, inject_preemption=inject)
        write_assignment(session.jobs_url, a.instance_id, doc)
    get_run_logger().info("attempt %d: %d instances, world size %d, rendezvous %s:%d", state.attempt,
                          len(assignments), sum(len(a.node.ranks) for a in assignments), master.address, port)


def wait_standby(session, instance_ids: Sequence[str], *, training: Sequence[str] = (), generation: int = -1,
                 timeout_s: float = STANDBY_WAIT_S) -> str | None:
    """Wait, at most ``timeout_s``, until the agents of new instances (before their first
    assignment) report their standby workers ready (imports done, parked), so that the assignment
    finds every rank ready.  Not waited for: an agent without standby workers (``--standby 0``, an
    image older than the report), an instance given work already, one the cloud no longer runs or
    whose boot failed (the attempt finds out).  ``training``: the instances of the attempt that
    trains meanwhile (its ``generation``): the wait ends when it stops training.  Returns what it
    waited for, in words (None: nothing)."""
    if not instance_ids:
        return None
    start = time.monotonic()

    def on_poll(poll: AgentPoll) -> AgentPoll | Poll:
        stopped = any(st is not None and st.generation == generation and st.state != AgentState.RUNNING
                      for st in (poll.statuses[i] for i in training))
        if stopped or time.monotonic() - start >= timeout_s or not _standby_pending(poll, instance_ids):
            return poll
        return Poll.AGAIN

    poll = watch_agents(session, [*instance_ids, *training], on_poll)
    waited_s = time.monotonic() - start
    statuses = [st for i in instance_ids if (st := poll.statuses[i]) is not None and st.generation < 0]
    ready = sum(min(st.num_standby_ready, st.num_standby) for st in statuses)
    without = sum(1 for st in statuses if st.num_standby == 0)
    words = (f"waited {waited_s:.1f} s for the standby workers of {len(instance_ids)} new instance"
             f"{'s' if len(instance_ids) > 1 else ''}: {ready} of {sum(st.num_standby for st in statuses)} ready")
    if without:
        words += f"; {without} without standby workers (not waited for)"
    pending = _standby_pending(poll, instance_ids)
    if pending:
        silent = sum(1 for i in pending if poll.statuses[i] is None)
        words += ("; the interim stopped training" if waited_s < timeout_s else
                  f"; assigning without the rest after {timeout_s:g} s")
        words += f" ({silent} agent{'s' if silent > 1 else ''} not reporting yet)" if silent else ""
    return words


def _standby_pending(poll: AgentPoll, instance_ids: Sequence[str]) -> list[str]:
    """Those of ``instance_ids`` whose agent is not up yet or whose standby workers are still getting ready."""
    return [i for i in instance_ids
            if poll.cloud_states.get(i) == "running" and i not in poll.boot_failures
            and (poll.statuses[i] is None or poll.statuses[i].standby_starting)]


def _merge_progress(state: js.JobState, statuses: dict[str, AgentStatus | None], generation: int) -> js.JobState:
    losses: list[tuple[int, float]] = []
    val_losses: list[tuple[int, float]] = []
    step = state.steps_done
    reports = [st for st in statuses.values() if st] + [st.previous for st in statuses.values()
                                                         if st and st.previous]
    # Earlier generations count too: workers a killed flow run left behind keep training (and
    # checkpointing) until the next run replaces them; their steps are the job's.  Older first,
    # so a redone step's newer loss wins.
    reports = [st for st in sorted(reports, key=lambda r: r.generation) if -1 < st.generation <= generation]
    checkpoint = None
    for st in reports:
        losses += st.losses
        val_losses += st.val_losses
        if st.step is not None:
            step = max(step, st.step)
        if st.checkpoint is not None and (checkpoint is None or st.checkpoint.step >= checkpoint.step):
            checkpoint = st.checkpoint
    state = _note_reported_checkpoint(state, checkpoint)
    # the bytes the engine sent across zones and to and from its checkpoint bucket, priced per pair
    state = js.with_egress(state, reports, usd_per_byte=functools.partial(pair_usd_per_byte, default_network()),
                           now_unix_s=time.time())
    if not losses and step == state.steps_done:
        return state
    return js.with_progress(state, steps_done=step, losses=losses, val_losses=val_losses)


def _note_reported_checkpoint(state: js.JobState, report: CheckpointReport | None) -> js.JobState:
    """The job's record of its newest checkpoint, as its workers committed it (``sailor status`` shows it
    live).  Only a newer one than recorded: an earlier generation's report is older news."""
    if report is None or report.step <= (state.last_checkpoint_step if state.last_checkpoint_step is not None else -1):
        return state
    return js.with_checkpoint(state, js.CheckpointRecord(step=report.step, url=report.url, at_unix_s=report.unix_s))


def preemption_for_attempt(state: js.JobState) -> int | None:
    """The ``--preempt-at`` step this attempt injects: the first one not injected yet.

    One per attempt: the workers train on through the preemption notice (the tiny model runs
    ~30 steps a second), so the job can pass the next step before the first preemption ends
    the attempt; a second injection then would only hit the instance already being preempted.
    A step the job has already passed is injected at the attempt's first own step.
    """
    return next((s for s in state.spec.preempt_at_steps if s not in state.injected_preemption_steps), None)


def injection_doc(session, state: js.JobState, assignments: Sequence[Assignment]) -> InjectPreemption | None:
    """``inject_preemption`` for rank 0's agent (it sees every step as it is made), or None."""
    step = preemption_for_attempt(state)
    spot = [a for a in assignments if a.node.spot]  # on-demand nodes are never preempted
    if step is None or session.control_url is None or not spot:
        return None
    victim = max(spot, key=lambda a: a.node.ranks[0])  # never the rendezvous host when there is a choice
    return InjectPreemption(at_step=step, instance_id=victim.instance_id, control_url=session.control_url)


def note_injection(state: js.JobState, report: InjectionReport | None, log) -> js.JobState:
    """Record what rank 0's agent did with the injected preemption; a failed one is a log line.

    Refused (404: the instance is gone or already being preempted): the next attempt tries again.
    Anything else (the cloud's control surface unreachable): skipped, not retried.
    """
    if report is None or report.at_step in state.injected_preemption_steps:
        return state
    at = f"step {report.step}" + ("" if report.step == report.at_step else f" (--preempt-at {report.at_step})")
    if report.ok:
        log.info("injected a preemption of %s at %s", report.instance_id, at)
        return js.with_injected_preemption(state, report.at_step)
    if report.http_status == 404:
        log.warning("preemption at %s not injected: %s is no longer live; the next attempt gets it",
                    at, report.instance_id)
        return state
    log.warning("could not inject the preemption at %s: %s; continuing without it", at, report.error)
    return js.with_injected_preemption(state, report.at_step)


@task(name="watch-attempt", cache_policy=NO_CACHE)
def watch_attempt(session, store: js.JobStore, state: js.JobState, assignments: Sequence[Assignment],
                  progress=None, planner=None, available=None, current=None) -> tuple[AttemptOutcome, js.JobState]:
    """Poll agents and the cloud until the attempt finishes or breaks; keep the ledger within the budget.

    Returns the outcome and the job state with the progress seen.  An injected preemption
    (``--preempt-at``, embedded cloud) is posted by rank 0's agent; its report is noted here.
    Meanwhile the controller's decision after each preemption that may come next is made once on
    ``planner`` (``control.DecisionWarmup``), so that the decision after a real one finds its searches.
    """
    ids = [a.instance_id for a in assignments]
    # Here, not before the task: Prefect walks the task's arguments (the planner's memo) as it starts it.
    warmup = DecisionWarmup(planner, state, instance_ids=ids, available=available or {}, current=current,
                            shutdown_s=session.shutdown_s)
    watch = _AttemptWatch(session=session, store=store, state=state, ids=ids, progress=progress,
                          planner=planner, available=available, current=current, trains=warmup.start)
    try:
        return watch_agents(session, ids, watch.on_poll)
    finally:  # the decision after this attempt finds what the warm-up searched
        warmup.wait()


class _AttemptWatch:
    """``watch_attempt``'s handling of each poll; ``state`` holds the progress seen so far."""

    __slots__ = ("session", "store", "state", "ids", "progress", "planner", "available", "current", "log",
                 "generation", "injection_noted", "last_save", "last_decide", "last_progress", "samples_per_s",
                 "trains")

    def __init__(self, *, session, store: js.JobStore, state: js.JobState, ids: list[str], progress,
                 planner, available, current, trains=lambda: None) -> None:
        self.session, self.store, self.state, self.ids = session, store, state, ids
        self.trains = trains  # called at each step of the attempt's own workers (the first one counts)
        self.progress, self.planner, self.available, self.current = progress, planner, available, current
        self.log = get_run_logger()
        self.generation = run_generation(state.attempt)
        self.injection_noted = False
        self.last_save = self.last_decide = self.last_progress = 0.0
        self.samples_per_s: float | None = None  # rank 0's last step, as its agent reported it

    def on_poll(self, poll: AgentPoll) -> tuple[AttemptOutcome, js.JobState] | Poll:
        now = poll.now_unix_s
        self._merge(poll)
        if now - self.last_save > SAVE_EVERY_S:
            self.store.save(self.state)
            self.last_save = now
            request = self.store.stop_request(self.state.job_id)  # as often as the saves: one read a second
            if request is not None:
                return AttemptOutcome(kind=STOPPED, instance_ids=tuple(self.ids), reason=request.by), self.state
        if poll.boot_failures:  # failed, not hung: the instance is ended and the attempt re-planned
            reason = "; ".join(poll.boot_failures.values())
            self.log.error("%s", reason)
            self.session.terminate(list(poll.boot_failures))
            self.store.save(self.state)
            return AttemptOutcome(kind=LOST, instance_ids=tuple(poll.boot_failures), reason=reason), self.state
        stop = self._decide(now)
        if stop is not None:
            return stop, self.state
        outcome = classify_attempt(generation=self.generation, statuses=poll.statuses,
                                   cloud_states=poll.cloud_states, now_unix_s=now,
                                   heartbeat_timeout_s=self.session.heartbeat_timeout_s)
        if outcome.kind == WORKER_FAILED and not poll.failure_grace_over:
            return Poll.WORKERS_FAILING
        if outcome.kind != RUNNING:
            self.store.save(self.state)
            return outcome, self.state
        return Poll.AGAIN

    def _merge(self, poll: AgentPoll) -> None:
        """The agents' progress and injection reports into ``state``; listeners hear of new steps."""
        now, statuses, generation = poll.now_unix_s, poll.statuses, self.generation
        new_state = _merge_progress(self.state, statuses, generation)
        moved = new_state is not self.state
        # Progress merged from an earlier generation (its last steps, reported late) is kept, but the
        # attempt trains, and its listeners hear of it, only once its own generation reports a step.
        trains = any(st is not None and st.generation == generation and st.step is not None
                     for st in statuses.values())
        if moved:
            self.state = (js.with_first_step(new_state, now, **restart_facts(statuses, generation))
                          if trains else new_state)
        rates = [st.samples_per_s for st in statuses.values()
                 if st and st.generation == generation and st.samples_per_s]
        self.samples_per_s = rates[0] if rates else self.samples_per_s
        reports = [st.injected_preemption for st in statuses.values()
                   if st and st.generation == generation and st.injected_preemption]
        if reports and not self.injection_noted:
            self.injection_noted = True  # one per attempt, and one log line about it
            self.state = note_injection(self.state, reports[0], self.log)
            self.store.save(self.state)
        if moved and trains:
            self.trains()
            _listeners.emit(self.state)
            if self.progress is not None and (now - self.last_progress > PROGRESS_EVERY_S
                                              or self.state.steps_done >= self.state.spec.steps):
                self.last_progress = now
                self.progress.update(self.state.steps_done, self.state.spec.steps, progress_description(self.state))

    def _decide(self, now: float) -> AttemptOutcome | None:
        """The controller, on a timer: keep going (None), switch to a plan that fits the budget, or
        stop while the spend so far, the next stretch and the shutdown still fit.  Not once the
        checkpoints reach the target: the workers end the attempt themselves (its "done" is no
        budget stop)."""
        state = self.state
        reached = (state.last_checkpoint_step or 0) >= state.spec.steps
        if self.planner is None or now - self.last_decide <= DECIDE_EVERY_S or reached:
            return None
        self.last_decide = now
        current = with_measured_egress(self.current, self.samples_per_s) if self.current is not None else None
        decision = controller_decision(self.planner, state, available=self.available,
                                       event=Event(kind=EventKind.TIMER), current=current,
                                       shutdown_s=self.session.shutdown_s, now_unix_s=now)
        horizon_s = 2 * max(DECIDE_EVERY_S, CLOUD_POLL_S) + self.session.worker_stop_s
        if decision.action == Action.STOP or decision.stop_in_s <= horizon_s:
            ledger = state.ledger()
            reason = (f"budget: {ledger.spent_usd(now):.5f} of {state.spec.budget_usd:.5f} USD spent (egress "
                      f"{ledger.egress_usd():.5f}) at {ledger.usd_per_hr():.3f} USD/h of rent; stopping now leaves "
                      "the shutdown paid within it"
                      if decision.action != Action.STOP or decision.reason.startswith("budget")
                      else decision.reason)
            self.log.warning("%s", reason)
            return AttemptOutcome(kind=BUDGET, instance_ids=tuple(self.ids), reason=reason)
        if decision.changes_plan:
            return AttemptOutcome(kind=REPLAN, reason=decision.reason)
        return None


@task(name="stop-workers", cache_policy=NO_CACHE)
def stop_attempt(session, state: js.JobState, instance_ids: Sequence[str], timeout_s: float = 15.0) -> js.JobState:
    """Stop the attempt's workers on the instances (``instance_ids``) still up (SIGTERM: they checkpoint
    if they can).

    The agents' last reports of the attempt are merged first: the stop replaces them.
    """
    statuses = {iid: read_status(session.jobs_url, iid) for iid in instance_ids}
    state = _merge_progress(state, statuses, run_generation(state.attempt))
    generation = stop_generation(state.attempt)
    cloud_states = session.instance_states(list(instance_ids))  # one call: this wait is on the recovery's path
    live = [iid for iid in instance_ids if cloud_states.get(iid) == "running"]
    for iid in live:
        write_assignment(session.jobs_url, iid, AgentAssignment(generation=generation, attempt=state.attempt,
                                                                action=AgentAction.STOP))
    pending, saving = _await_stop(session.jobs_url, live, generation, timeout_s)
    if saving:
        get_run_logger().info("waited past %.0f s for the stop saves of %s (their agents kept beating)",
                              timeout_s, ", ".join(sorted(saving)))
    if pending:
        get_run_logger().warning("agents did not confirm the stop: %s", sorted(pending))
    # The stopped generation's final report (its ``previous``) has the steps run until the stop.
    statuses = {iid: read_status(session.jobs_url, iid) for iid in instance_ids}
    return _merge_progress(state, statuses, run_generation(state.attempt))


STOP_BEAT_FRESH_S = 5.0  # an agent beats every second while its workers save (runtime/agent.py _beat)


def _await_stop(jobs_url: str, instance_ids: Sequence[str], generation: int, timeout_s: float
                ) -> tuple[set[str], set[str]]:
    """The instances whose agents did not confirm the stop ``generation``, and those waited for past
    ``timeout_s``: an agent still beating then has workers whose stop saves make progress on a slow
    store (the agent waits for them, up to ``STOP_MAX_S``); shutting its instance down would lose them."""
    start = time.monotonic()
    pending, saving = set(instance_ids), set()
    while pending:
        statuses = {iid: read_status(jobs_url, iid) for iid in pending}
        pending = {iid for iid, st in statuses.items() if not (st and st.generation >= generation)}
        elapsed_s = time.monotonic() - start
        if pending and elapsed_s >= timeout_s:
            beating = {iid for iid in pending if _beating(statuses[iid], STOP_BEAT_FRESH_S)}
            if not beating or elapsed_s >= STOP_MAX_S:
                break
            saving |= beating
        if pending:
            time.sleep(POLL_S)
    return pending, saving


def _beating(status: AgentStatus | None, fresh_s: float) -> bool:
    return bool(status and status.heartbeat_unix_s is not None and time.time() - status.heartbeat_unix_s <= fresh_s)


def merge_agent_reports(session, state: js.JobState) -> js.JobState:
    """Steps and losses the job's agents reported, whichever flow run started their workers.

    A flow run started after another was killed finds that run's workers' progress here (they
    kept training, maybe to the end): without it the job would claim fewer steps than it ran.
    """
    statuses = {r.instance_id: read_status(session.jobs_url, r.instance_id) for r in state.instances}
    return _merge_progress(state, statuses, run_generation(state.attempt))
