"""Cloud tasks: opening and closing a flow run's session, offers, provisioning with zone
failover, instance states, terminate-by-label.

A session (``tasks/cloud_session.py``) holds the providers one flow run uses and what the job
rents besides instances (its bucket prefix, network rules and identity: ``tasks/job_resources.py``).
All of it is removed when the session closes (also on failure or Ctrl-C); the bucket prefix is
the job's result and stays.  Each task below wraps one provider call.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra import config
from infra.buckets import bucket_location, ensure_private_bucket
from infra.code import upload_code
from infra.errors import CloudConfigError
from infra.provider import CloudProvider
from infra.provisioner import GpuNeed, Provisioner
from infra.records import InstanceInfo, job_labels
from sailor_core import settings
from sailor_core.catalog.instances import Offer, get_instance_type
from sailor_core.errors import InfeasibleError
from sailor_core.job import state as js
from sailor_core.job.nodes import NodeRequest, RunningInstance, match_instances
from sailor_core.job.spec import JobSpec
from sailor_core.network.storage_egress import LOCAL_REGION
from tasks.cloud_session import CloudSession
from tasks.embedded_bucket import EMBEDDED_BUCKET, embedded_s3_client
from tasks.job_resources import delete_job_resources, open_job_resources
from tasks.workers import Assignment

OFFERS_TTL = timedelta(minutes=10)

_log = logging.getLogger(__name__)


def node_dict(node: NodeRequest) -> dict[str, Any]:
    return asdict(node)


# ---- opening and closing --------------------------------------------------------

# Sessions open in this process, by job id: the cancellation/crash hooks find them here.
_sessions: dict[str, CloudSession] = {}
_lock = threading.Lock()


def providers_for_mode(mode: str, clouds: Sequence[str] = ()) -> tuple[str, dict[str, CloudProvider], str | None]:
    """(mode used, providers, embedded control URL) for ``auto`` / ``embedded`` / ``real``.

    ``auto`` follows ``SAILOR_CLOUDS`` (infra.config): the embedded cloud unless real clouds
    are asked for, so credentials lying around never spend money by surprise.
    """
    if mode not in ("auto", "embedded", "real"):
        raise CloudConfigError(f"cloud mode must be auto, embedded or real, got {mode!r}")
    real = config.real_clouds()
    if mode == "real" and not real:
        raise CloudConfigError(f"real clouds are used only when asked: set {settings.CLOUDS_ENV}=real (or aws, gcp); "
                               "credentials come from the SDKs' usual chains (docs/orchestration.md)")
    if mode == "real" or (mode == "auto" and real):
        return "real", config.get_providers(list(clouds) or None), None
    from infra.local.cloud import providers_for  # lazy: moto's server, only for the embedded cloud

    ends = config.embedded_endpoints()  # `sailor cloud up`'s standalone cloud, else one in this process
    providers = providers_for(ends["aws_endpoint"], ends["gce_endpoint"], aws_keys=tuple(ends["aws_keys"]))
    if clouds:
        providers = {c: p for c, p in providers.items() if c in clouds}
    return "embedded", providers, ends["control_url"]


def offers_session(mode: str, clouds: Sequence[str] = ()) -> CloudSession:
    """A session that only reads offers (plan and refresh-offers flows)."""
    used, providers, control_url = providers_for_mode(mode, clouds)
    return CloudSession(mode=used, job_id="offers", jobs_url="", providers=providers, control_url=control_url)


def open_session(mode: str, *, job_id: str, jobs_url: str, spec: JobSpec) -> CloudSession:
    """The job's session: its providers, its bucket prefix (with Sailor's wheel in it), its network
    rules and instance identity.  ``jobs_url`` is where the flow keeps the job's state; on real
    clouds it must be the bucket the instances reach."""
    used, providers, control_url = providers_for_mode(mode, spec.clouds)
    if used == "real":
        if "://" not in jobs_url or jobs_url.startswith("file://"):
            raise CloudConfigError("on real clouds the job's documents must be where instances reach them: "
                                   f"set jobs_url (or {settings.JOBS_URL_ENV}) to an s3:// or gs:// URL")
        session = CloudSession(mode=used, job_id=job_id, jobs_url=jobs_url, home_url=jobs_url, providers=providers)
        s3_client = None
    else:
        ends = config.embedded_endpoints()
        config.point_at_embedded_storage(ends["aws_endpoint"], ends.get("gcs_endpoint"), tuple(ends["aws_keys"]))
        # Ending a local process group takes about the cloud's halt grace (1 s); bill a margin.
        session = CloudSession(mode=used, job_id=job_id, jobs_url=f"s3://{EMBEDDED_BUCKET}/{job_id}", home_url=jobs_url,
                               providers=providers, control_url=control_url,
                               control_secret=ends.get("control_secret"), network=ends.get("network", "host"),
                               shutdown_s=5.0, worker_stop_s=8.0, heartbeat_timeout_s=60.0)
        s3_client = embedded_s3_client(ends)
    session.checkpoint_url(spec.checkpoint_url)  # a folder the instances cannot reach: refused before anything is rented
    with _lock:
        _sessions[job_id] = session  # from here on, a failure still finds what to clean up
    try:
        for url in sorted({spec.checkpoint_url, session.jobs_url}):
            if url.startswith("s3://"):
                ensure_private_bucket(url, client=s3_client)  # created private and encrypted, refused if public
            elif url.startswith("gs://") and used == "embedded":  # the embedded gs:// and s3:// buckets: one folder
                ensure_private_bucket(f"s3://{url[len('gs://'):].split('/', 1)[0]}", client=s3_client)
        session.code = upload_code(session.jobs_url)
        open_job_resources(session, spec)
    except BaseException:
        close_session(session)
        raise
    return session


def job_bucket_spec(state: js.JobState, session: CloudSession) -> js.JobState:
    """The job's state with its checkpoints where the instances keep them: a local default
    (the job's folder on this machine) becomes the job's prefix in the bucket; and the bucket's
    region, unless the job names it, as the cloud tells it (``checkpoint_bucket_region``)."""
    url = session.checkpoint_url(state.spec.checkpoint_url)
    region = state.spec.checkpoint_region or checkpoint_bucket_region(url, session)
    if (url, region) == (state.spec.checkpoint_url, state.spec.checkpoint_region):
        return state
    return dataclasses.replace(state, spec=dataclasses.replace(state.spec, checkpoint_url=url,
                                                               checkpoint_region=region))


def checkpoint_bucket_region(url: str, session: CloudSession) -> str:
    """The region of the bucket behind ``url`` as S3 tells it: on a real cloud an ``s3://`` bucket's
    (made without a location: us-east-1); on the embedded cloud any bucket's, whose ``s3://`` and
    ``gs://`` fronts serve one folder of this machine: one made in a region is there, one made
    without (its jobs bucket, ``sailor cloud bucket create``) is ``local``, reached by every zone for
    nothing.  '' for a gs:// bucket on a real cloud, or when S3 will not say (no s3:GetBucketLocation):
    its bytes are then priced as the farthest region's, and the job's log says so."""
    scheme, _, rest = url.partition("://")
    embedded = session.mode == "embedded"
    if not rest or scheme not in (("s3", "gs") if embedded else ("s3",)):
        return ""
    client = embedded_s3_client(config.embedded_endpoints()) if embedded else None
    try:
        location = bucket_location(rest.split("/", 1)[0], client=client)
    except CloudConfigError as exc:
        _log.warning("%s; its checkpoints' egress is priced as the farthest region's "
                     "(--checkpoint-region names it)", exc)
        return ""
    return location or (LOCAL_REGION if embedded else "us-east-1")


def close_session(session: CloudSession) -> None:
    """Delete what the job rented besides its instances (rules, identity); every closer runs."""
    with _lock:
        _sessions.pop(session.job_id, None)
    errors = []
    for close in reversed(session._closers):
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the others must still run
            errors.append(exc)
    session._closers.clear()
    if errors:
        raise errors[0]


def terminate_job_everywhere(job_id: str, *, reason: str) -> list[str]:
    """From a hook: terminate by label through this process's session, else through freshly made providers."""
    with _lock:
        session = _sessions.get(job_id)
    if session is not None:
        providers = session.providers
    elif config.real_clouds() or config.standalone_state():
        providers = config.get_providers()
    else:  # an in-process embedded cloud ended with the flow process: no API is left to call
        return []
    ids: list[str] = []
    for cloud, provider in providers.items():
        try:
            ids += provider.terminate_instances(job_labels(job_id))
        except Exception as exc:  # a hook must not raise; say what could not be done
            sys.stderr.write(f"sailor: could not terminate {job_id} on {cloud} ({reason}): {exc}\n")
    if session is not None:  # its closers know everything it opened (an identity outside its clouds too)
        try:
            close_session(session)
        except Exception as exc:  # noqa: BLE001 - the verbs below try again
            sys.stderr.write(f"sailor: could not close {job_id}'s session ({reason}): {exc}\n")
    delete_job_resources(providers, job_id, reason=reason)  # then the rules and identity the instances held
    return ids


# ---- tasks ----------------------------------------------------------------------------


def _offers_key(context, parameters) -> str:
    session: CloudSession = parameters["session"]
    filters = [sorted(parameters.get(k) or ()) for k in ("gpus", "zones", "clouds")]
    return f"offers-{session.cache_key()}-{filters}"


@task(name="list-offers", tags=["cloud"], retries=3, retry_delay_seconds=[1, 2, 4],
      cache_key_fn=_offers_key, cache_expiration=OFFERS_TTL, persist_result=True)
def list_offers(session: CloudSession, gpus: Sequence[str] = (), zones: Sequence[str] = (),
                clouds: Sequence[str] = ()) -> list[Offer]:
    """GPU offers and prices per zone of every cloud in the session (cached for 10 minutes)."""
    offers: list[Offer] = []
    for name, provider in session.providers.items():
        if clouds and name not in clouds:
            continue
        offers += provider.list_offers(gpu_types=list(gpus) or None)
    if zones:
        offers = [o for o in offers if o.zone in zones]
    if not offers:
        raise InfeasibleError("the clouds offer no GPUs matching the job's GPU types, zones and clouds")
    return offers


def reconcile(session: CloudSession, state: js.JobState) -> js.JobState:
    """Line the job's records up with the cloud: close what ended, adopt what is up but unrecorded."""
    now, saved_at = time.time(), state.updated_unix_s
    found = {i.instance_id: i for i in session.query()}
    ended_preempted = {r.instance_id for r in state.running_instances()
                       if r.instance_id in found and found[r.instance_id].state == "preempted"}
    ended_other = {r.instance_id for r in state.running_instances()
                   if r.instance_id in found and not found[r.instance_id].live} - ended_preempted
    unknown = {r.instance_id for r in state.running_instances() if r.instance_id not in found}
    state = js.with_instances_ended(state, ended_preempted, "preempted", now_unix_s=now)
    state = js.with_instances_ended(state, ended_other, "lost", now_unix_s=now)
    # An embedded cloud unknown to this one died with the process that ran it (its instances reaped
    # at this cloud's start): billed until the job's state was last saved, not on to now.
    lost_at = min(now, saved_at) if session.mode == "embedded" else now
    state = js.with_instances_ended(state, unknown, "lost", now_unix_s=lost_at)
    known = {r.instance_id for r in state.instances}
    orphans = [i for i in found.values() if i.live and i.instance_id not in known]
    if orphans:  # launched by a flow run that died before saving: pay for them from now on
        state = js.with_instances_launched(state, tuple(_record(i, None, state.attempt, now) for i in orphans))
    return state


def _record(info: InstanceInfo, node: NodeRequest | None, attempt: int, now: float) -> js.InstanceRecord:
    if node is not None:
        price = node.usd_per_hr
    else:
        row = get_instance_type(info.cloud, info.instance_type)
        price = row.spot_usd_per_hr if info.spot else row.on_demand_usd_per_hr
    return js.InstanceRecord(instance_id=info.instance_id, cloud=info.cloud, zone=info.zone,
                             instance_type=info.instance_type, gpu=info.gpu or "", num_gpus=info.gpus_per_node,
                             usd_per_hr=price, spot=info.spot, attempt=attempt, launched_unix_s=now)


@dataclass(frozen=True, slots=True, kw_only=True)
class Provisioned:
    state: js.JobState
    nodes: tuple[NodeRequest, ...]  # as placed: a node moved to another zone by the failover says so
    assignments: tuple[Assignment, ...]
    history: tuple[str, ...]  # the provisioner's tries, zone by zone


@task(name="provision", tags=["cloud"], retries=1, retry_delay_seconds=[5], cache_policy=NO_CACHE)
def launch_nodes(session: CloudSession, needs: list, attempt: int, offers: list[Offer], spot: bool):
    """Rent the new nodes: each in its own zone first, then the next cheapest zone or cloud (infra's failover)."""
    return Provisioner(session.providers).provision(
        needs, job_id=session.job_id, attempt=attempt, spot=spot, substitute_zones=True, all_or_nothing=True,
        startup_script=session.startup_script(), offers=offers)



@task(name="terminate", tags=["cloud"], retries=3, retry_delay_seconds=[1, 2, 4], cache_policy=NO_CACHE)
def terminate_ids(session: CloudSession, instance_ids: list[str]) -> list[str]:
    """Terminate some of the job's instances (the surplus after a re-plan)."""
    ended: list[str] = []
    for provider in session.providers.values():
        ended += provider.terminate_instances(session.labels, instance_ids=instance_ids)
    return ended


def provision(session: CloudSession, state: js.JobState, nodes: Sequence[NodeRequest],
              offers: Sequence[Offer], *, end_surplus: bool = True) -> Provisioned:
    """Keep running instances the plan can use, end the surplus, rent the rest (with zone failover).

    A node the failover placed in another zone moves its replicas there: the plan in the job
    state is updated to say where they really run.  Raises the provisioner's ProvisionError
    (a CapacityError) when some node could be had nowhere; nothing of this attempt is left running.
    ``end_surplus=False`` (an interim attempt): the instances the plan leaves out stay up, for
    the plan after it.
    """
    state, running = _usable_instances(session, state)
    placement = match_instances(nodes, running)
    if placement.surplus and end_surplus:
        terminate_ids(session, list(placement.surplus))
        state = js.with_instances_ended(state, set(placement.surplus), "terminated")
    state, placed, history = _launch_missing(session, state, placement.launch, offers)
    state = js.with_plan_zones(state, _zones_moved(placed))
    current = {i.instance_id: i for i in session.query()}
    session.meet([current.get(i.instance_id, i) for _, i in placed]
                 + [current[iid] for _, iid in placement.keep if iid in current])
    assignments = [Assignment(instance_id=iid, node=node, address=session.address_of(current[iid]))
                   for node, iid in placement.keep]
    assignments += [Assignment(instance_id=i.instance_id, node=n, address=session.address_of(current.get(i.instance_id, i)))
                    for n, i in placed]
    assignments.sort(key=lambda a: a.node.ranks[0])
    return Provisioned(state=state, nodes=tuple(a.node for a in assignments), assignments=tuple(assignments),
                       history=history)


def launch_ahead(session: CloudSession, state: js.JobState, nodes: Sequence[NodeRequest],
                 offers: Sequence[Offer]) -> tuple[js.JobState, tuple[NodeRequest, ...]]:
    """Rent the nodes of the next plan that no running instance serves, ending nothing: the
    instances held train on meanwhile (an interim attempt).  Returns the job state and ``nodes``
    as placed (a node the zone failover moved says where: ``provision`` of these then finds
    them all running); raises a CapacityError as ``provision`` does."""
    state, running = _usable_instances(session, state)
    launch = match_instances(nodes, running).launch
    state, placed, _ = _launch_missing(session, state, launch, offers)
    moved = {n: m for n, (m, _) in zip(launch, placed, strict=True)}
    return state, tuple(moved.get(n, n) for n in nodes)


def _zones_moved(placed: Sequence[tuple[NodeRequest, InstanceInfo]]) -> dict[tuple[int, int], str]:
    return {rep: n.zone for n, _ in placed for rep in n.replicas}


def _usable_instances(session: CloudSession, state: js.JobState) -> tuple[js.JobState, list[RunningInstance]]:
    """The job's instances the cloud says are running with an address; the others' records closed.
    (The job state can lag the cloud: a preemption may land while the flow re-plans.)"""
    log = get_run_logger()
    seen = {i.instance_id: i for i in session.query()}
    usable = []
    for r in state.running_instances():
        info = seen.get(r.instance_id)
        if info is not None and info.state == "running" and info.private_ip and not session.boot_failures([r.instance_id]):
            usable.append(r)
            continue
        if info is not None and info.live:
            terminate_ids(session, [r.instance_id])
        reason = "preempted" if info is not None and info.state == "preempted" else "terminated"
        log.info("instance %s is %s in the cloud: not reused", r.instance_id, info.state if info else "gone")
        state = js.with_instances_ended(state, {r.instance_id}, reason)
    return state, [RunningInstance(instance_id=r.instance_id, zone=r.zone, instance_type=r.instance_type, spot=r.spot)
                   for r in usable]


def _launch_missing(session: CloudSession, state: js.JobState, launch: Sequence[NodeRequest], offers: Sequence[Offer]
                    ) -> tuple[js.JobState, list[tuple[NodeRequest, InstanceInfo]], tuple[str, ...]]:
    """Rent ``launch`` (zone failover may move a node: it is returned as placed), recorded in the job state."""
    if not launch:
        return state, [], ()
    log = get_run_logger()
    now = time.time()
    needs = [GpuNeed(gpu=n.gpu, zone=n.zone, num_gpus=len(n.ranks), min_gpus_per_node=len(n.ranks), spot=n.spot)
             for n in launch]
    result = launch_nodes(session, needs, state.attempt, list(offers), state.spec.spot)
    history = tuple(result.history_lines())
    for line in history:
        log.info("provision: %s", line)
    placed: list[tuple[NodeRequest, InstanceInfo]] = []
    for node, alloc in zip(launch, result.allocations, strict=True):
        info = alloc.instances[0]
        moved = dataclasses.replace(node, cloud=alloc.offer.cloud, zone=alloc.offer.zone,
                                    instance_type=alloc.offer.instance_type,
                                    gpus_per_node=alloc.offer.gpus_per_node,
                                    usd_per_hr=alloc.usd_per_hr / max(1, len(alloc.instances)))
        placed.append((moved, info))
        state = js.with_instances_launched(state, (_record(info, moved, state.attempt, now),))
    return state, placed, history


@task(name="terminate-job", tags=["cloud"], retries=3, retry_delay_seconds=[1, 2, 4], cache_policy=NO_CACHE)
def terminate_all(session: CloudSession, state: js.JobState, timeout_s: float = 60.0) -> tuple[js.JobState, int]:
    """Terminate every instance carrying the job's label; returns the state and how many are still up."""
    for p in session.providers.values():
        p.terminate_instances(session.labels)
    deadline = time.monotonic() + timeout_s
    live = [i for i in session.query() if i.live and i.state != "stopping"]
    while live and time.monotonic() < deadline:
        time.sleep(0.5)
        live = [i for i in session.query() if i.live and i.state != "stopping"]
    found = {i.instance_id: i for i in session.query()}
    preempted = {r.instance_id for r in state.running_instances()
                 if r.instance_id in found and found[r.instance_id].state == "preempted"}
    state = js.with_instances_ended(state, preempted, "preempted")
    state = js.with_instances_ended(state, {r.instance_id for r in state.running_instances()}, "terminated")
    return state, len([i for i in session.query() if i.live])


def is_cancellation(exc: BaseException) -> bool:
    """Ctrl-C, or Prefect cancelling the run (it signals the flow process): cancelled, not failed."""
    return isinstance(exc, KeyboardInterrupt) or any(
        word in type(exc).__name__ for word in ("Cancel", "Terminat", "Abort"))


def release(session: CloudSession, state: js.JobState, store, *, body_failed: bool, log, what: str,
            after=None) -> tuple[js.JobState, int | None]:
    """Terminate everything the job rented and close the session, whatever the flow's body did:
    a cleanup error is logged, and raised only when it is the run's one error (the body's own
    error says more).  ``after(state)`` runs once the instances are gone (a cost report)."""
    left_running = None
    try:
        state, left_running = terminate_all(session, state)
        store.save(state)
        if after is not None:
            after(state)
    except Exception as cleanup_error:
        log.error("cleanup of %s failed: %s", what, cleanup_error)
        if not body_failed:
            raise
    finally:
        try:
            close_session(session)
        except Exception as cleanup_error:  # the job's rules or identity could not be deleted
            log.error("cleanup of %s's network rules or identity failed: %s", what, cleanup_error)
            if not body_failed:
                raise
    return state, left_running
