"""The train-job flow: plan, rent, train, survive preemptions, never cross the budget.

A thin loop; every decision is a core function's:

    offers -> plan (planner) -> place nodes (sailor_core.job.nodes) -> budget check (controller)
    -> provision (infra, zone failover) -> assign ranks (agents start the engine's workers)
    -> watch (sailor_core.job.attempts; ledger; injected preemptions on the embedded cloud)
    -> finished: done | preempted / lost / failed: stop survivors, latest valid checkpoint,
       re-plan on what is available now, keep the survivors that still fit, resume
    -> budget would be crossed: stop cleanly (status ``stopped_budget``)

What each ending means for the job (its status, the controller's next event, which records
to close, when to give up) is ``sailor_core.job.recovery``'s.  The flow's parameters are
``JobSpec``'s fields (``flows.spec_parameters``) plus the run-only ones of ``train_job``.

The job state (``sailor_core.job.state``) is saved after every change, so a new
flow run with the same ``job_id`` continues the job.  A person's stop (``sailor stop``, Ctrl-C:
a ``StopRequest`` the watch reads; a cancel in the Prefect UI: Prefect's ``TerminationSignal``)
has the workers take a final checkpoint, saves the job cancelled with how to continue it, and
ends the run Cancelled with that reason (the flow returns a ``Cancelled`` state, not its summary).  Every instance carrying
the job's label is terminated at the end: in ``finally``, and from the
cancellation/crash hooks when the flow process itself is being torn down.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Cancelled

from flows.deploy_client import job_id_for
from flows.spec_parameters import takes_spec
from infra.errors import CapacityError
from sailor_core import settings
from sailor_core.controller import Action, PlanOption
from sailor_core.job import prerent, recovery, report
from sailor_core.job import state as js
from sailor_core.job.attempts import FINISHED, INSTANCE_PREEMPTED, AttemptOutcome, run_generation
from sailor_core.job.nodes import NodeRequest, RunningInstance, match_instances
from sailor_core.job.spec import JobSpec, JobSpecError, check_names
from sailor_core.plan.types import plan_from_dict
from tasks import cloud as cloud_tasks
from tasks import control
from tasks import job_lease
from tasks import jobs as job_tasks
from tasks import reporting, workers

# The checkpoint's check, beside the decision, runs in this pool.
_CHECKS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sailor-checkpoint-check")

UI_CANCEL_STOP_S = 20.0  # a final checkpoint after a cancel in the UI: the worker kills the run 30 s after it


def _job_id_for_run(model: str) -> str:
    """Derived from the flow run's id when nobody named the job (a run started from the UI)."""
    run_id = current_flow_run.get_id()
    return job_id_for(model, run_id) if run_id else js.new_job_id(model)


def _run_name() -> str:
    """Flow runs are named after their job, so the UI's run list says which job each one is."""
    params = current_flow_run.get_parameters()
    return params.get("job_id") or _job_id_for_run(params.get("model") or "tiny")


def _cleanup_hook(flow_obj, flow_run, state) -> None:
    """on_cancellation / on_crashed: terminate the job's instances even though the body did not finish
    (this may run in another process than the flow body: the job id follows from the run's id)."""
    params = flow_run.parameters or {}
    job_id = params.get("job_id") or job_id_for(params.get("model") or "tiny", flow_run.id)
    cloud_tasks.terminate_job_everywhere(job_id, reason=f"flow run {state.name.lower()}")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    """What every step of one flow run of the job uses."""

    session: Any  # tasks.cloud.CloudSession
    store: js.JobStore
    reporter: reporting.JobReporter
    max_gpus_per_zone: int

    def save(self, state: js.JobState) -> js.JobState:
        self.store.save(state)
        return state

    def end(self, state: js.JobState, status: str, reason: str) -> js.JobState:
        return self.save(js.with_status(state, status, reason))


@flow(name="train-job", flow_run_name=_run_name, log_prints=False, on_cancellation=[_cleanup_hook],
      on_crashed=[_cleanup_hook], description="Train a model on spot GPUs within a budget, re-planning on preemption.")
@takes_spec(JobSpec, check=check_names)
def train_job(spec: JobSpec, *, job_id: str | None = None, jobs_url: str | None = None, cloud: str = "auto",
              max_gpus_per_zone: int = 2) -> dict[str, Any]:
    """Train the model of ``spec`` within its budget; returns the ``sailor train`` summary.

    Args:
        job_id: continue this job, or name a new one (default: derived from the flow run's id)
        jobs_url: where job states live (default: SAILOR_JOBS_URL, else $SAILOR_HOME/jobs)
        cloud: auto (real clouds when SAILOR_CLOUDS asks for them, else embedded), embedded or real
        max_gpus_per_zone: most GPUs of one type per zone the planner may use
    """
    log = get_run_logger()
    store = js.JobStore(jobs_url)
    job_id = job_id or _job_id_for_run(spec.model)
    # One controller per job: a run whose job another live run controls stops here (JobHeldError);
    # one that finds a dead controller's lease waits it out, then takes the job over.
    keeper = job_lease.hold(store, job_id, current_flow_run.get_id(), log=log,
                            run_parameters={"jobs_url": store.root, "cloud": cloud,
                                            "max_gpus_per_zone": max_gpus_per_zone})
    try:
        return _control(spec, store, job_id, keeper, cloud=cloud, max_gpus_per_zone=max_gpus_per_zone)
    finally:
        keeper.release()


def _control(spec: JobSpec, store: js.JobStore, job_id: str, keeper: job_lease.LeaseKeeper, *, cloud: str,
             max_gpus_per_zone: int) -> dict[str, Any]:
    """The job's controller while this run holds its lease; the ``sailor train`` summary."""
    log = get_run_logger()
    run_id = current_flow_run.get_id()
    url = reporting.flow_run_url(run_id)
    # The saved spec wins over this run's parameters when the job exists (start_or_resume says so).
    state = job_tasks.start_or_resume(store, spec.for_job(store.job_url(job_id)), job_id, run_id=run_id, url=url)
    if state.finished:
        log.info("job %s already %s; nothing to do", job_id, state.status)
        return job_tasks.summary(state, instances_left_running=0)

    reporter = reporting.JobReporter(state, run_id=run_id, url=url)
    workers.add_progress_listener(reporter.on_progress)
    session = cloud_tasks.open_session(cloud, job_id=job_id, jobs_url=store.job_url(job_id), spec=state.spec)
    state = cloud_tasks.job_bucket_spec(state, session)  # checkpoints where the instances keep them
    run = _Run(session=session, store=store, reporter=reporter, max_gpus_per_zone=max_gpus_per_zone)
    if keeper.took_over_from is not None:
        run.reporter.event(state, job_lease.takeover_words(keeper.took_over_from))
    left_running = 0
    body_failed = False
    try:
        _check_before_renting(run, state)
        state = _pick_up(run, state)
        state = _attempts(run, state)
    except BaseException as exc:
        body_failed = True
        saved = store.load(job_id) if store.exists(job_id) else state
        if isinstance(exc, TerminationSignal) and not keeper.lost:  # a UI cancel: the worker waits ~30 s, then kills
            state = recovery.latest(state, saved)
            state = _stopped(run, state, _ids(state.running_instances()), by="a cancel of its flow run: the Prefect UI or SIGTERM",
                             within_s=UI_CANCEL_STOP_S, engine=False)
        else:
            state = recovery.ended_by_exception(state, saved, exc, cancelled=cloud_tasks.is_cancellation(exc))
            if not keeper.lost:  # the job's state is the new controller's now
                store.save(state)
        if not cloud_tasks.is_cancellation(exc):
            raise
    finally:
        workers.remove_progress_listener(reporter.on_progress)
        try:  # nothing may stay rented: terminate by label even if the body failed (unless taken over)
            if not keeper.lost:
                state, left_running = cloud_tasks.release(session, state, store, body_failed=body_failed, log=log,
                                                          what=f"job {job_id}", after=reporter.finish)
        finally:
            reporter.close()
            job_tasks.keep_logs(session.jobs_url, store.job_url(job_id))
    summary = job_tasks.summary(state, instances_left_running=left_running)
    if state.status == js.CANCELLED:  # the run ends Cancelled in Prefect, with the job's reason
        return Cancelled(message=state.status_reason)
    return summary


def _ids(records) -> list[str]:
    """The instance ids of an attempt's assignments or instance records."""
    return [r.instance_id for r in records]


def _stopped(run: _Run, state: js.JobState, instance_ids: list[str], *, by: str, within_s: float = 15.0,
             engine: bool = True) -> js.JobState:
    """Someone asked the job to stop: its workers take a final checkpoint (within ``within_s``), the
    job is saved as cancelled with the way to go on, and the flow's end terminates the instances.
    ``engine=False``: the tasks' bodies only, when Prefect is cancelling the run (no new task runs)."""
    run.reporter.event(state, f"stop asked ({by}) at step {state.steps_done}; the workers take a final checkpoint")
    stop, note = workers.stop_attempt, job_tasks.note_checkpoint
    if not engine:
        stop, note = stop.fn, note.fn
    try:
        state = run.save(stop(run.session, state, instance_ids, timeout_s=within_s))
        state = run.save(note(cloud_tasks.reconcile(run.session, state)))
    finally:  # even when the final checkpoint could not be had, the job says it was stopped
        state = run.end(state, js.CANCELLED, js.stopped_reason(state, by))
        run.reporter.event(state, state.status_reason)
    return state


def _check_before_renting(run: _Run, state: js.JobState) -> None:
    """A job not started yet is checked as ``sailor train`` checks it (``sailor_core.job.prerent``),
    here on the offers of the session's clouds at their prices: a run from a deployment or the UI
    fails at once, with nothing rented, on what its workers would refuse or no plan could do."""
    if state.attempt or state.instances:
        return
    spec = state.spec
    try:
        prerent.check_inputs(spec)
        prerent.check_reach(spec, cloud_tasks.list_offers(run.session, spec.gpus, spec.zones, spec.clouds),
                            max_gpus_per_zone=run.max_gpus_per_zone)
    except JobSpecError as exc:
        run.end(state, js.FAILED, str(exc))
        raise


def _pick_up(run: _Run, state: js.JobState) -> js.JobState:
    """Where an earlier flow run of the job left it: its instances, checkpoints and workers' reports."""
    state = cloud_tasks.reconcile(run.session, state)
    state = job_tasks.note_checkpoint(state)  # the checkpoints, not a possibly stale state, say where to resume
    state = workers.merge_agent_reports(run.session, state)  # a killed run's workers may have trained on
    return run.save(state)


def _attempts(run: _Run, state: js.JobState) -> js.JobState:
    """Plan, provision, train and watch, attempt after attempt, until the job ends; its final state."""
    spec = state.spec
    data_url = job_tasks.prepare_data(spec.dataset, spec.model, spec.seed,
                                      data_dir=str(settings.sailor_home() / "data"))
    rec = recovery.start(state)
    looked = _Offers()
    checked: Future | None = None  # the newest checkpoint's check, running while the controller decides
    while True:
        request = run.store.stop_request(state.job_id)  # asked while waiting or between attempts
        if request is not None:
            return run.end(state, js.CANCELLED, js.stopped_reason(state, request.by))
        offers, planner = looked.now(run, spec)
        available = control.availability(offers, max_gpus_per_zone=run.max_gpus_per_zone, max_gpus=spec.max_gpus)
        state, decision = _decide(run, state, planner, available, rec, checked)
        checked = None
        if decision.action == Action.STOP:
            return run.end(state, recovery.status_when_stopped(state), decision.reason)
        if decision.action == Action.WAIT or decision.plan is None:
            rec = recovery.waited(rec)
            if rec.out_of_waits:
                return run.end(state, js.FAILED, decision.reason)
            run.reporter.event(state, f"{decision.reason}; looking again in {recovery.WAIT_S:.0f} s")
            time.sleep(recovery.WAIT_S)
            continue
        rec, reason = recovery.choose(rec, decision)
        try:
            state, plan, nodes = _train_while_booting(run, state, planner, decision.plan, offers, data_url=data_url)
            if recovery.status_when_stopped(state) == js.SUCCEEDED:  # the interim trained to the end
                return run.end(state, js.SUCCEEDED, f"{state.steps_done} steps done")
            state = run.save(recovery.start_attempt(state, plan, reason))
            run.reporter.event(state, reason)
            state, placed, option = _launch(run, state, planner, plan, offers, reason=reason, data_url=data_url,
                                            nodes=nodes)
        except CapacityError as exc:  # nowhere to put some node now: a wait, then plan again
            # As last saved: an interim may have run first (its attempt, steps and checkpoint).
            state = run.save(js.with_status(run.store.load(state.job_id), js.RECOVERING, f"no capacity: {exc}"))
            rec = recovery.no_capacity(rec, str(exc))
            if rec.out_of_waits:
                return run.end(state, js.FAILED, f"no capacity: {exc}")
            run.reporter.event(state, f"no capacity: {exc}; planning again in {recovery.WAIT_S:.0f} s")
            time.sleep(recovery.WAIT_S)
            continue
        rec = recovery.launched(rec)
        if option is not decision.plan:  # moved by a zone failover: the GPUs it got (either market) count as available
            available = recovery.available_with(available, option.all_gpus())
        before = state.last_checkpoint_step  # the watch records the checkpoints made meanwhile
        outcome, state = workers.watch_attempt(run.session, run.store, state, placed.assignments, planner=planner,
                                               available=available, current=option)
        state = run.save(state)
        if outcome.kind == workers.STOPPED:
            return _stopped(run, state, _ids(placed.assignments), by=outcome.reason)
        if outcome.kind == FINISHED:
            return run.end(job_tasks.note_checkpoint(state), js.SUCCEEDED, f"{state.steps_done} steps done")
        state, checked = _settle_early_end(run, state, placed.assignments, outcome)
        if outcome.kind == workers.BUDGET:
            return run.end(_noted(run, state, checked), js.STOPPED_BUDGET, outcome.reason)
        rec = recovery.after_attempt(rec, state, outcome, ran=option, checkpoint_before=before)
        if rec.stalled:
            return run.end(_noted(run, state, checked), js.FAILED, recovery.stalled_reason(rec, outcome))
        run.reporter.event(state, "re-planning on the GPUs offered now, to resume from step "
                                  f"{state.last_checkpoint_step or 0}")


def _train_while_booting(run: _Run, state: js.JobState, planner: control.Planner, option: PlanOption, offers, *,
                         data_url: str) -> tuple[js.JobState, PlanOption, tuple[NodeRequest, ...] | None]:
    """When ``option`` keeps some running instances and needs new ones, the kept ones train on an
    interim attempt of their own while the new ones boot (``control.interim_plan``); the interim
    then stops (its workers checkpoint and park) and ``option`` starts from that checkpoint.

    Returns the job state, ``option`` with its replicas where the zone failover placed them and
    its nodes as placed (None: no interim ran).  A CapacityError of the launch is raised after
    the interim stopped.
    """
    nodes = planner.nodes(option)
    placement = match_instances(nodes, [RunningInstance(instance_id=r.instance_id, zone=r.zone,
                                                        instance_type=r.instance_type, spot=r.spot)
                                        for r in state.running_instances()])
    kept: dict[tuple[str, str], int] = {}
    for node, _ in placement.keep:
        if node.spot == state.spec.spot:
            kept[(node.gpu, node.zone)] = kept.get((node.gpu, node.zone), 0) + len(node.ranks)
    interim = control.interim_plan(state.spec, offers, option, kept) if placement.launch else None
    if interim is None:
        return state, option, None
    interim_option, interim_nodes = interim
    num_new = len(placement.launch)
    words = (f"interim: the survivors ({report.gpus(interim_option.all_gpus())}) train on while {num_new} new "
             f"instance{'s boot' if num_new > 1 else ' boots'} for the next plan")
    state = run.save(recovery.start_attempt(state, interim_option, words))
    run.reporter.event(state, words)
    placed = cloud_tasks.provision(run.session, state, interim_nodes, offers, end_surplus=False)
    state = run.save(placed.state)
    workers.assign(run.session, state, placed.assignments, data_url=data_url, interim=True)
    run.reporter.attempt(state, reason=words, nodes=[cloud_tasks.node_dict(n) for n in placed.nodes],
                         history=[], pareto="")
    held = {r.instance_id for r in state.running_instances()}
    try:
        state, nodes = cloud_tasks.launch_ahead(run.session, state, nodes, offers)
        # The interim trains on while the new instances' standby workers import: the next plan's
        # assignment then finds every rank ready.
        waited = workers.wait_standby(run.session, [r.instance_id for r in state.running_instances()
                                                    if r.instance_id not in held],
                                      training=_ids(placed.assignments), generation=run_generation(state.attempt))
        if waited:
            run.reporter.event(state, waited)
    finally:  # on the next plan's path: a task run as after a preemption, the check in place
        state = run.save(workers.stop_attempt(run.session, state, _ids(placed.assignments)))
        state = run.save(_checked(cloud_tasks.reconcile(run.session, state)))
        run.reporter.event(state, f"interim stopped at step {state.steps_done}; newest checkpoint: step "
                                  f"{state.last_checkpoint_step or 0}")
    zones = {rep: n.zone for n in nodes for rep in n.replicas}
    if any(option.plan.stages[s].replicas[r].zone != z for (s, r), z in zones.items()):
        plan = plan_from_dict(js.plan_with_zones(option.plan.to_dict(), zones))
        option = planner.option(plan, option.throughput_samples_per_s)
    return state, option, nodes


def _launch(run: _Run, state: js.JobState, planner: control.Planner, option: PlanOption, offers, *,
            reason: str, data_url: str, nodes: Sequence[NodeRequest] | None = None
            ) -> tuple[js.JobState, Any, PlanOption]:
    """Rent the attempt's instances (keeping survivors that fit), publish the attempt, start its workers.
    ``nodes``: the plan's nodes as already placed (an interim rented them), else the planner's.

    Returns the job state, what was placed, and the plan as placed: a zone failover may have moved nodes,
    and then that plan is the one watched.
    """
    requests = tuple(nodes) if nodes is not None else planner.nodes(option)
    run.reporter.event(state, f"provisioning {report.nodes_line([cloud_tasks.node_dict(n) for n in requests])}")
    placed = cloud_tasks.provision(run.session, state, requests, offers)
    state = run.save(placed.state)
    if state.plan != option.plan.to_dict():
        option = planner.option(plan_from_dict(state.plan), option.throughput_samples_per_s)
    nodes = [cloud_tasks.node_dict(n) for n in placed.nodes]
    workers.assign(run.session, state, placed.assignments, data_url=data_url)  # first: the workers wait for it
    run.reporter.attempt(state, reason=reason, nodes=nodes, history=list(placed.history),
                         pareto=reporting.pareto_markdown(control.pareto_points(planner),
                                                          control.chosen_point(planner, option)))
    reporting.mark_attempt(run.session.jobs_url, state, reason)
    at = state.last_checkpoint_step or 0
    run.reporter.event(state, f"rented {report.nodes_line(nodes)}; starting the workers"
                              + (f", to resume from the checkpoint at step {at}" if at else ""))
    return state, placed, option


def _settle_early_end(run: _Run, state: js.JobState, assignments, outcome: AttemptOutcome
                      ) -> tuple[js.JobState, Future]:
    """The attempt ended early: stop the survivors (SIGTERM: they checkpoint if they can), then settle
    the instance records; returns the job state and the check of the checkpoint the next attempt
    starts from (a future of ``note_checkpoint``, which ``_noted`` waits for)."""
    if outcome.kind == INSTANCE_PREEMPTED:
        reporting.emit_job_event("preempted", state, instances=list(outcome.instance_ids))
        what = recovery.preemption_words(state, outcome.instance_ids)
    else:
        what = f"{outcome.reason} at step {state.steps_done}"
    run.reporter.event(state, f"{what}; stopping the attempt (its workers checkpoint first)")
    state = run.save(workers.stop_attempt(run.session, state, _ids(assignments)))
    state = run.save(cloud_tasks.reconcile(run.session, state))
    state = run.save(recovery.close_preempted(state, outcome))
    # The checkpoint storage is checked while the controller decides on the checkpoint the workers
    # reported (``_decide``): they agree unless that one is torn, and then the decision is made again.
    # The task's body in a thread of this process: a task run submitted to Prefect's runner started
    # up to 2 s late on a loaded server, on the recovery's path; its retries come when it fails.
    return state, _CHECKS.submit(contextvars.copy_context().run, job_tasks.note_checkpoint.fn, state)


class _Offers:
    """What the clouds offer and the job's planner on it, looked up again once the offers' cache
    (``OFFERS_TTL``) would have expired: until then ``list_offers`` answers the same offers, and the
    planner kept with them keeps its memo (the searches made, and those the warm-up made before a
    preemption, ``control.DecisionWarmup``)."""

    def __init__(self) -> None:
        self._at = -math.inf
        self._offers: Any = None
        self._planner: control.Planner | None = None

    def now(self, run: _Run, spec: JobSpec) -> tuple[Any, control.Planner]:
        if self._planner is None or time.monotonic() - self._at > cloud_tasks.OFFERS_TTL.total_seconds():
            self._offers = cloud_tasks.list_offers(run.session, spec.gpus, spec.zones, spec.clouds)
            self._planner = control.job_planner(spec, self._offers)
            self._at = time.monotonic()
        return self._offers, self._planner


def _decide(run: _Run, state: js.JobState, planner: control.Planner, available, rec: recovery.Recovery,
            checked: Future | None) -> tuple[js.JobState, Any]:
    """The controller's decision on what runs next, and the job state with its newest checkpoint noted.
    ``checked``: the check of the checkpoint storage that runs meanwhile (None: none)."""
    def decide(on: js.JobState):
        return control.decide_next(planner, on, available=available, event=rec.event, current=rec.current,
                                   shutdown_s=run.session.shutdown_s, now_unix_s=time.time())

    decision = decide(state)
    if checked is None:
        return state, decision
    noted = _noted(run, state, checked)
    if noted.last_checkpoint_step != state.last_checkpoint_step:  # the reported one did not verify
        decision = decide(noted)
    return noted, decision


def _checked(state: js.JobState) -> js.JobState:
    """``state`` with its newest valid checkpoint: ``note_checkpoint``'s body in place (its task's
    ``checkpoint`` tag asks the server for a concurrency slot first, which a loaded server answered
    1.9-2.5 s late: docs/orchestration.md); the task, with its retries, when the storage did not answer."""
    try:
        return job_tasks.note_checkpoint.fn(state)
    except Exception:  # noqa: BLE001  the storage did not answer: the task, with its retries, asks again
        return job_tasks.note_checkpoint(state)


def _noted(run: _Run, state: js.JobState, checked: Future | None) -> js.JobState:
    """``state`` with the checkpoint its check found (``note_checkpoint``'s future; None: no check)."""
    if checked is None:
        return state
    try:
        noted = checked.result()
    except Exception:  # noqa: BLE001  the storage did not answer: the task, with its retries, asks again
        noted = job_tasks.note_checkpoint(state)
    state = run.save(noted)
    run.reporter.event(state, f"newest checkpoint: step {state.last_checkpoint_step or 0}")
    return state
