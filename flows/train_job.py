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
``JobSpec``'s fields (``flows.job_parameters``) plus the run-only ones of ``train_job``.

The job state (``sailor_core.job.state``) is saved after every change, so a new
flow run with the same ``job_id`` continues the job.  Every instance carrying
the job's label is terminated at the end: in ``finally``, and from the
cancellation/crash hooks when the flow process itself is being torn down.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_flow_run

from flows.job_parameters import takes_job_spec
from infra.errors import CapacityError
from sailor_core import settings
from sailor_core.controller import Action, PlanOption
from sailor_core.job import recovery
from sailor_core.job import state as js
from sailor_core.job.attempts import FINISHED, INSTANCE_PREEMPTED, AttemptOutcome
from sailor_core.job.spec import JobSpec
from sailor_core.plan.types import plan_from_dict
from tasks import cloud as cloud_tasks
from tasks import control, reporting, workers
from tasks import jobs as job_tasks


def _job_id_for_run(model: str) -> str:
    """Derived from the flow run's id: the CLI finds a deployment run's job state without asking."""
    from flows.deploy_client import job_id_for

    run_id = current_flow_run.get_id()
    return job_id_for(model, run_id) if run_id else js.new_job_id(model)


def _cleanup_hook(flow_obj, flow_run, state) -> None:
    """on_cancellation / on_crashed: terminate the job's instances even though the body did not finish
    (this may run in another process than the flow body: the job id follows from the run's id)."""
    from flows.deploy_client import job_id_for

    params = flow_run.parameters or {}
    job_id = params.get("job_id") or job_id_for(params.get("model") or "tiny", flow_run.id)
    cloud_tasks.terminate_job_everywhere(job_id, reason=f"flow run {state.name.lower()}")


@flow(name="train-job", log_prints=False, on_cancellation=[_cleanup_hook], on_crashed=[_cleanup_hook],
      description="Train a model on spot GPUs within a budget, re-planning on preemption.")
@takes_job_spec
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
    # The saved spec wins over this run's parameters when the job exists (start_or_resume says so).
    state = job_tasks.start_or_resume(store, spec.for_job(store.job_url(job_id)), job_id)
    if state.finished:
        log.info("job %s already %s; nothing to do", job_id, state.status)
        return job_tasks.summary(state, instances_left_running=0)

    session = cloud_tasks.open_session(cloud, job_id=job_id, jobs_url=store.job_url(job_id), spec=state.spec)
    state = cloud_tasks.job_bucket_spec(state, session)  # checkpoints where the instances keep them
    left_running = 0
    body_failed = False
    try:
        state = _pick_up(session, store, state)
        state = _attempts(session, store, state, max_gpus_per_zone=max_gpus_per_zone)
    except BaseException as exc:
        body_failed = True
        saved = store.load(job_id) if store.exists(job_id) else state
        state = recovery.ended_by_exception(state, saved, exc, cancelled=cloud_tasks.is_cancellation(exc))
        store.save(state)
        raise
    finally:
        # Nothing may stay rented: terminate by label even if the body failed.
        state, left_running = cloud_tasks.release(session, state, store, body_failed=body_failed, log=log,
                                                  what=f"job {job_id}", after=reporting.publish_cost_report)
    return job_tasks.summary(state, instances_left_running=left_running)


def _pick_up(session, store: js.JobStore, state: js.JobState) -> js.JobState:
    """Where an earlier flow run of the job left it: its instances, checkpoints and workers' reports."""
    state = cloud_tasks.reconcile(session, state)
    state = job_tasks.note_checkpoint(state)  # the checkpoints, not a possibly stale state, say where to resume
    state = workers.merge_agent_reports(session, state)  # a killed run's workers may have trained on
    return _save(store, state)


def _attempts(session, store: js.JobStore, state: js.JobState, *, max_gpus_per_zone: int) -> js.JobState:
    """Plan, provision, train and watch, attempt after attempt, until the job ends; its final state."""
    log = get_run_logger()
    spec = state.spec
    data_url = job_tasks.prepare_data(spec.dataset, spec.model, spec.seed,
                                      data_dir=str(settings.sailor_home() / "data"))
    progress = reporting.ProgressReporter(state.job_id)  # one progress artifact per flow run
    rec = recovery.start(state)
    while True:
        offers = cloud_tasks.list_offers(session, spec.gpus, spec.zones, spec.clouds)
        planner = control.job_planner(spec, offers)
        available = control.availability(offers, max_gpus_per_zone=max_gpus_per_zone, max_gpus=spec.max_gpus)
        decision = control.decide_next(planner, state, available=available, event=rec.event, current=rec.current,
                                       shutdown_s=session.shutdown_s, now_unix_s=time.time())
        if decision.action == Action.STOP:
            return _end(store, state, recovery.status_when_stopped(state), decision.reason)
        if decision.action == Action.WAIT or decision.plan is None:
            rec = recovery.waited(rec)
            if rec.out_of_waits:
                return _end(store, state, js.FAILED, decision.reason)
            time.sleep(recovery.WAIT_S)
            continue
        rec, reason = recovery.choose(rec, decision)
        state = _save(store, recovery.start_attempt(state, decision.plan, reason))
        try:
            placed = cloud_tasks.provision(session, state, planner.nodes(decision.plan), offers)
        except CapacityError as exc:  # nowhere to put some node now: a wait, then plan again
            log.warning("provisioning failed: %s", exc)
            state = _save(store, js.with_status(state, js.RECOVERING, f"no capacity: {exc}"))
            rec = recovery.no_capacity(rec)
            if rec.out_of_waits:
                return _end(store, state, js.FAILED, f"no capacity: {exc}")
            time.sleep(recovery.WAIT_S)
            continue
        state, rec = _save(store, placed.state), recovery.launched(rec)
        option, available = _as_placed(planner, decision.plan, state, available)
        _publish(state, placed, planner, option, reason)
        workers.assign(session, state, placed.assignments, data_url=data_url)
        outcome, state = workers.watch_attempt(session, store, state, placed.assignments,
                                               progress=progress, planner=planner, available=available,
                                               current=option)
        state = _save(store, state)
        if outcome.kind == FINISHED:
            state = job_tasks.note_checkpoint(state)
            return _end(store, state, js.SUCCEEDED, f"{state.steps_done} steps done")
        before = state.last_checkpoint_step
        state = _settle_early_end(session, store, state, placed.assignments, outcome)
        if outcome.kind == workers.BUDGET:
            return _end(store, state, js.STOPPED_BUDGET, outcome.reason)
        if outcome.kind == INSTANCE_PREEMPTED:
            reporting.emit_job_event("preempted", state, instances=list(outcome.instance_ids))
        rec = recovery.after_attempt(rec, state, outcome, ran=option, checkpoint_before=before)
        if rec.stalled:
            return _end(store, state, js.FAILED, recovery.stalled_reason(rec, outcome))
        log.info("job %s: %s; re-planning from step %s", state.job_id, outcome.reason, state.last_checkpoint_step)


def _settle_early_end(session, store: js.JobStore, state: js.JobState, assignments,
                      outcome: AttemptOutcome) -> js.JobState:
    """The attempt ended early: stop the survivors (SIGTERM: they checkpoint if they can), then settle
    the instance records and note the checkpoint the next attempt starts from."""
    state = _save(store, workers.stop_attempt(session, state, assignments))
    state = _save(store, cloud_tasks.reconcile(session, state))
    state = recovery.close_preempted(state, outcome)
    return _save(store, job_tasks.note_checkpoint(state))


def _as_placed(planner: control.Planner, option: PlanOption, state: js.JobState,
               available: dict) -> tuple[PlanOption, dict]:
    """The plan as provisioned: a zone failover may have moved nodes, and then that plan is the one watched."""
    if state.plan == option.plan.to_dict():
        return option, available
    placed = planner.option(plan_from_dict(state.plan), option.throughput_samples_per_s)
    return placed, recovery.available_with(available, placed.gpus)


def _publish(state: js.JobState, placed, planner: control.Planner, option: PlanOption, reason: str) -> None:
    """The attempt's plan, the Pareto front it was chosen from, and a re-plan event after the first."""
    reporting.publish_plan(state, nodes=[cloud_tasks.node_dict(n) for n in placed.nodes],
                           sim={"throughput_samples_per_s": option.throughput_samples_per_s}, reason=reason,
                           history=list(placed.history))
    reporting.publish_pareto(state.job_id, control.pareto_points(planner), control.chosen_point(planner, option))
    if state.attempt > 1:
        reporting.emit_job_event("replanned", state, reason=reason, plan=state.plan)


def _save(store: js.JobStore, state: js.JobState) -> js.JobState:
    store.save(state)
    return state


def _end(store: js.JobStore, state: js.JobState, status: str, reason: str) -> js.JobState:
    return _save(store, js.with_status(state, status, reason))
