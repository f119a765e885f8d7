"""The train-job flow: plan, rent, train, survive preemptions, never cross the budget.

A thin loop; every decision is a core function's:

    offers -> plan (planner) -> place nodes (sailor_core.job.nodes) -> budget check (controller)
    -> provision (infra, zone failover) -> assign ranks (agents start the engine's workers)
    -> watch (sailor_core.job.attempts; ledger; injected preemptions on the embedded cloud)
    -> finished: done | preempted / lost / failed: stop survivors, latest valid checkpoint,
       re-plan on what is available now, keep the survivors that still fit, resume
    -> budget would be crossed: stop cleanly (status ``stopped_budget``)

The job state (``sailor_core.job.state``) is saved after every change, so a new
flow run with the same ``job_id`` continues the job.  Every instance carrying
the job's label is terminated at the end: in ``finally``, and from the
cancellation/crash hooks when the flow process itself is being torn down.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_flow_run

from sailor_core.job import state as js

from sailor_core.job.spec import JobSpec
from sailor_core.job.attempts import FINISHED, INSTANCE_PREEMPTED
from infra.errors import CapacityError
from sailor_core.controller import Action, Event, EventKind
from sailor_core.plan.types import plan_from_dict
from tasks import cloud as cloud_tasks
from tasks import jobs as job_tasks
from tasks import control, reporting, workers

# Consecutive attempts that end without a new checkpoint before the job gives up.
MAX_ATTEMPTS_WITHOUT_PROGRESS = 3
# While no plan fits what is offered: how long to wait between looks, and how many looks.
WAIT_S = 10.0
MAX_WAITS = 6


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
def train_job(
    model: str = "tiny",
    budget_usd: float = 0.05,
    steps: int = 30,
    dataset: str = "synthetic",
    min_throughput: float | None = None,
    max_usd_per_hr: float | None = None,
    objective: str = "throughput",
    gpus: list[str] | None = None,
    zones: list[str] | None = None,
    clouds: list[str] | None = None,
    spot: bool = True,
    on_demand_fallback: bool = False,
    checkpoint_url: str | None = None,
    checkpoint_every: int = 5,
    preempt_at: list[int] | None = None,
    job_id: str | None = None,
    jobs_url: str | None = None,
    cloud: str = "auto",
    max_gpus_per_zone: int = 2,
    max_gpus: int | None = 2,
    global_batch_size: int | None = 8,
    seed: int = 0,
) -> dict[str, Any]:
    log = get_run_logger()
    store = js.JobStore(jobs_url)
    job_id = job_id or _job_id_for_run(model)
    spec = JobSpec(
        model=model, budget_usd=budget_usd, steps=steps, dataset=dataset, max_usd_per_hr=max_usd_per_hr,
        min_throughput_samples_per_s=min_throughput, clouds=tuple(clouds or ()), zones=tuple(zones or ()),
        gpus=tuple(gpus or ()), spot=spot, on_demand_fallback=on_demand_fallback, objective=objective,
        checkpoint_url=checkpoint_url or f"{store.job_url(job_id)}/checkpoints",
        checkpoint_every_steps=checkpoint_every, preempt_at_steps=tuple(sorted(set(preempt_at or ()))),
        global_batch_size=global_batch_size, seed=seed,
    )
    state = job_tasks.start_or_resume(store, spec, job_id)
    if state.finished:
        log.info("job %s already %s; nothing to do", job_id, state.status)
        return job_tasks.summary(state, instances_left_running=0)

    session = cloud_tasks.open_session(cloud, job_id=job_id, jobs_url=store.job_url(job_id), spec=spec)
    progress = reporting.ProgressReporter(job_id)
    left_running = 0
    body_failed = False
    try:
        state = cloud_tasks.reconcile(session, state)
        state = job_tasks.note_checkpoint(state)  # the checkpoints, not a possibly stale state, say where to resume
        state = workers.merge_agent_reports(session, state)  # a killed run's workers may have trained on
        store.save(state)
        data_url = job_tasks.prepare_data(spec.dataset, spec.model, spec.seed, data_dir=str(js.sailor_home() / "data"))
        event = control.start_event(state)
        reason_prefix = "" if state.attempt == 0 else "flow run resumed the job; "
        current = None  # the controller's PlanOption running now
        num_waits = no_progress = 0
        while True:
            offers = cloud_tasks.list_offers(session, spec.gpus, spec.zones, spec.clouds)
            planner = control.Planner(spec=spec, offers=tuple(offers))
            available = control.availability(offers, max_gpus_per_zone=max_gpus_per_zone, max_gpus=max_gpus)
            decision = control.decide_next(planner, state, available=available, event=event, current=current,
                                            shutdown_s=session.shutdown_s, now_unix_s=time.time())
            if decision.action == Action.STOP:
                done = state.last_checkpoint_step is not None and state.last_checkpoint_step >= spec.steps
                state = js.with_status(state, js.SUCCEEDED if done else js.STOPPED_BUDGET, decision.reason)
                store.save(state)
                break
            if decision.action == Action.CONTINUE and current is not None:
                decision = dataclasses.replace(decision, reason=f"restart the same plan ({current.label})")
            if decision.action == Action.WAIT or decision.plan is None:
                num_waits += 1
                if num_waits > MAX_WAITS:
                    state = js.with_status(state, js.FAILED, decision.reason)
                    store.save(state)
                    break
                time.sleep(WAIT_S)
                continue
            option = decision.plan
            nodes = planner.nodes(option)
            reason = reason_prefix + decision.reason
            reason_prefix = ""
            state = js.with_plan(state, plan=option.plan.to_dict(), reason=reason, usd_per_hr=option.usd_per_hr,
                                 throughput_samples_per_s=option.throughput_samples_per_s)
            state = js.with_status(state, js.RUNNING if state.attempt == 1 else js.RECOVERING, reason)
            store.save(state)
            try:
                placed = cloud_tasks.provision(session, state, nodes, offers)
            except CapacityError as exc:
                # Nowhere to put some node now: count it as a wait and ask the controller again.
                log.warning("provisioning failed: %s", exc)
                state = js.with_status(state, js.RECOVERING, f"no capacity: {exc}")
                store.save(state)
                event, current, num_waits = Event(kind=EventKind.CAPACITY), None, num_waits + 1
                reason_prefix = "no capacity for the last plan; "
                if num_waits > MAX_WAITS:
                    state = js.with_status(state, js.FAILED, f"no capacity: {exc}")
                    store.save(state)
                    break
                time.sleep(WAIT_S)
                continue
            state = placed.state
            store.save(state)
            # Only a launch that worked ends a streak of waits: a plan that can never be placed
            # (every launch refused) must not restart the count, or the job would retry forever.
            num_waits = 0
            if state.plan != option.plan.to_dict():  # the failover moved nodes: watch the plan as placed
                option = planner.option(plan_from_dict(state.plan), option.throughput_samples_per_s)
                available = {**available, **{k: max(n, available.get(k, 0)) for k, n in option.gpus.items()}}
            reporting.publish_plan(state, nodes=[cloud_tasks.node_dict(n) for n in placed.nodes],
                                   sim={"throughput_samples_per_s": option.throughput_samples_per_s}, reason=reason,
                                   history=list(placed.history))
            reporting.publish_pareto(job_id, control.pareto_points(planner), control.chosen_point(planner, option))
            if state.attempt > 1:
                reporting.emit_job_event("replanned", state, reason=reason, plan=state.plan)

            workers.assign(session, state, placed.assignments, data_url=data_url)
            outcome, state = workers.watch_attempt(session, store, state, placed.assignments, progress=progress,
                                                   planner=planner, available=available, current=option)
            if outcome.kind == FINISHED:
                state = job_tasks.note_checkpoint(state)
                state = js.with_status(state, js.SUCCEEDED, f"{state.steps_done} steps done")
                store.save(state)
                break
            # The attempt ended early: stop the survivors (SIGTERM: they checkpoint if they can).
            before = state.last_checkpoint_step
            state = workers.stop_attempt(session, state, placed.assignments)
            state = cloud_tasks.reconcile(session, state)
            if outcome.kind == INSTANCE_PREEMPTED:
                # The cloud or the agent reported these preempted, but the cloud may still say
                # "stopping" (its notice window), and re-provisioning would then close them as
                # merely terminated: they will not run again, so close them as preemptions now.
                state = js.with_instances_ended(state, set(outcome.instance_ids), "preempted")
            state = job_tasks.note_checkpoint(state)
            store.save(state)
            if outcome.kind == workers.BUDGET:
                state = js.with_status(state, js.STOPPED_BUDGET, outcome.reason)
                store.save(state)
                break
            if outcome.kind == INSTANCE_PREEMPTED:
                reporting.emit_job_event("preempted", state, instances=list(outcome.instance_ids))
                event = control.preemption_event(state, outcome.instance_ids)
            else:
                event = Event(kind=EventKind.CAPACITY)
            current = option  # broken by the preemption's lost GPUs, or still whole after a crash
            no_progress = 0 if state.last_checkpoint_step != before else no_progress + 1
            if no_progress >= MAX_ATTEMPTS_WITHOUT_PROGRESS:
                state = js.with_status(state, js.FAILED,
                                       f"{no_progress} attempts without a new checkpoint; last: {outcome.reason}")
                store.save(state)
                break
            reason_prefix = f"{outcome.reason} at step {state.steps_done}; "
            log.info("job %s: %s; re-planning from step %s", job_id, outcome.reason, state.last_checkpoint_step)
    except BaseException as exc:
        body_failed = True
        cancelled = cloud_tasks.is_cancellation(exc)
        # A task interrupted mid-way (the watch) saved progress this frame never saw: start from that.
        saved = store.load(job_id) if store.exists(job_id) else state
        state = saved if saved.updated_unix_s > state.updated_unix_s else state
        state = js.with_status(state, js.CANCELLED if cancelled else js.FAILED,
                               f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
        store.save(state)
        raise
    finally:
        # Nothing may stay rented: terminate by label even if the body failed.
        state, left_running = cloud_tasks.release(session, state, store, body_failed=body_failed, log=log,
                                                  what=f"job {job_id}", after=reporting.publish_cost_report)
    return job_tasks.summary(state, instances_left_running=left_running)

