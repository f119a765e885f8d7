"""The network-profile flow: measure the network between cloud instances and save it for the planner.

    offers -> worst-case cost check -> rent N instances of one GPU type (one zone, or rank 0 in
    ``zone`` and rank 1 in ``dst_zone``) -> each instance's agent runs the profiler's worker
    (p2p ping-pong between ranks 0 and 1, all-reduce among all) -> rank 0's points -> fit to the
    network model's curve -> save (``default_network()`` then uses the link) -> table artifact

The instances carry the run's job labels and its job state (``sailor jobs`` / ``sailor status``
show them and what they cost); they are terminated in ``finally`` whatever happened, and by
the cancellation/crash hooks when the flow process itself is torn down.

Its parameters are NetworkProfileSpec's fields (``sailor_core/specs/profile.py``, as ``sailor
profile network`` takes them), the cloud and the job's id and store.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run as current_flow_run

from flows.deploy_client import job_id_for
from flows.spec_parameters import takes_spec
from sailor_core.job import recovery
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec
from sailor_core.profiler.network import (NetworkLink, network_link, network_profile_from_points,
                                          save_network_profile, sizes_up_to)
from sailor_core.specs.profile import NetworkProfileSpec
from tasks import cloud as cloud_tasks
from tasks import net_profiling as net

JOB_PREFIX = "network-profile"


def _job_id_for_run() -> str:
    run_id = current_flow_run.get_id()
    return job_id_for(JOB_PREFIX, run_id) if run_id else js.new_job_id(JOB_PREFIX)


def _cleanup_hook(flow_obj, flow_run, state) -> None:
    """on_cancellation / on_crashed: terminate the run's instances although the body did not finish."""
    params = flow_run.parameters or {}
    job_id = params.get("job_id") or job_id_for(JOB_PREFIX, flow_run.id)
    cloud_tasks.terminate_job_everywhere(job_id, reason=f"flow run {state.name.lower()}")


@flow(name="network-profile", log_prints=False, on_cancellation=[_cleanup_hook], on_crashed=[_cleanup_hook],
      description="Measure p2p bandwidth and all-reduce between cloud instances; save the fitted link.")
@takes_spec(NetworkProfileSpec)
def network_profile_flow(spec: NetworkProfileSpec, *, cloud: str = "auto", job_id: str | None = None,
                         jobs_url: str | None = None) -> dict[str, Any]:
    """On the embedded cloud, whose instances are local processes, ``device`` defaults to cpu
    (gloo), ``max_mib`` to 16 and ``save`` to no (it measures this machine's loopback, which
    must not stand in for the named zones' network); on real clouds to cuda (nccl), 256, yes."""
    log = get_run_logger()
    link = network_link(spec.gpu, spec.zone, spec.dst_zone, spec.workers)  # bad input fails before renting
    store = js.JobStore(jobs_url)
    job_id = job_id or _job_id_for_run()
    job = JobSpec(model=JOB_PREFIX, budget_usd=spec.budget_usd, steps=1, clouds=link.clouds,
                  zones=tuple(dict.fromkeys((link.src_zone, link.dst_zone))), gpus=(link.gpu,), spot=spec.spot)
    session = cloud_tasks.open_session(cloud, job_id=job_id, jobs_url=store.job_url(job_id), spec=job)
    device = spec.device or ("cpu" if session.mode == "embedded" else "cuda")
    save = session.mode == "real" if spec.save is None else spec.save
    sizes = sizes_up_to(spec.max_mib if spec.max_mib is not None else (16 if session.mode == "embedded" else 256))
    state = js.with_status(js.new_job(job, job_id), js.RUNNING, f"profiling {link.src_zone} -> {link.dst_zone}")
    left_running = 0
    body_failed = False
    try:
        store.save(state)  # inside: a store that cannot be written still closes the session
        # Offers of the GPU anywhere in the clouds, then the zones': a zone without it gets its own message.
        offers = net.offers_for(link, cloud_tasks.list_offers(session, [link.gpu], (), link.clouds))
        usd_per_hr = net.check_worst_case_cost(link, offers, spot=spec.spot, budget_usd=spec.budget_usd,
                                               timeout_s=spec.timeout_s, shutdown_s=session.shutdown_s)
        net.emit({"event": "launching", "num_workers": link.num_workers, "gpu": link.gpu,
                  "zones": sorted(set(link.zones_by_rank())), "usd_per_hr": usd_per_hr, "total": 2 * len(sizes)})
        infos = net.launch_instances(session, link, offers, spec.spot, net.LAUNCH_WAIT_S)
        ids = [i.instance_id for i in infos]
        # The provisioner's instances are unrecorded yet: reconcile adopts every live one of the job.
        state = cloud_tasks.reconcile(session, state)
        store.save(state)
        net.emit({"event": "launched", "instances": ids})
        addresses = net.addresses_of(session, ids)
        result = net.run_workers(session, ids, addresses, link.zones_by_rank(), sizes=sizes, reps=spec.reps,
                                 device=device, timeout_s=spec.timeout_s)
        types = sorted({i.instance_type for i in infos})
        profile, rows = _fit_and_publish(link, result, types, embedded=session.mode == "embedded", device=device,
                                         job_id=job_id)
        path = save_network_profile(profile) if save else None
        log.info("fit max %.3f GB/s, largest error %.0f%%; %s", profile.fit.max_bw_bytes_per_s / 1e9,
                 profile.max_rel_error * 100, f"saved to {path}" if path else "not saved")
        # The job state's one "step" is the measurement: `sailor jobs` shows 1/1 when it is done.
        state = js.with_status(js.with_progress(state, steps_done=1), js.SUCCEEDED,
                               f"{len(sizes)} message sizes measured")
    except BaseException as exc:
        body_failed = True
        state = recovery.ended_by_exception(state, state, exc, cancelled=cloud_tasks.is_cancellation(exc))
        raise
    finally:
        # Nothing may stay rented, whatever happened above.
        state, left_running = cloud_tasks.release(session, state, store, body_failed=body_failed, log=log,
                                                  what=job_id)
    return {
        "job_id": job_id, "mode": session.mode, "gpu": link.gpu, "src_zone": link.src_zone,
        "dst_zone": link.dst_zone, "num_workers": link.num_workers, "instances": ids,
        "instance_types": types, "device": device, "profile": profile.to_json(), "rows": rows,
        "saved_to": str(path) if path else None, "usd_spent": state.usd_spent(),
        "instances_left_running": left_running,
    }


def _fit_and_publish(link: NetworkLink, result, instance_types: list[str], *, embedded: bool, device: str,
                     job_id: str):
    """The fitted profile of rank 0's points (its source says what measured it) and its table artifact."""
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    where = "embedded cloud: local processes over loopback" if embedded else "cloud instances"
    source = (f"sailor-profiler network: {link.num_workers} x {'/'.join(instance_types)} ({where}), "
              f"{'nccl' if device == 'cuda' else 'gloo'}, job {job_id}; {date}")
    profile = network_profile_from_points(result, src_zone=link.src_zone, src_gpu=link.gpu,
                                          dst_zone=link.dst_zone, dst_gpu=link.gpu, source=source)
    rows = net.table_rows(profile)
    create_table_artifact(key=f"network-{link.src_zone}-{link.dst_zone}-{link.gpu.lower()}".replace(".", "-"),
                          table=rows, description=f"{link.num_workers} x {link.gpu}, {link.src_zone} -> "
                                                  f"{link.dst_zone} ({where}): p2p and all-reduce vs message size")
    return profile, rows
