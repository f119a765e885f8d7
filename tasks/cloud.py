"""Cloud tasks: offers, provisioning with zone failover, instance states, terminate-by-label.

``CloudSession`` holds the providers one flow run uses -- the real clouds when
``SAILOR_CLOUDS`` asks for them (infra.config), else the embedded local cloud
(moto's EC2 server and the local GCE fake, whose instances are local process
groups) -- and what differs between them (where instances reach each other,
how long a shutdown takes).  Each task below wraps one provider call.
"""

from __future__ import annotations

import dataclasses
import shlex
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra import config
from infra.buckets import ensure_private_bucket
from infra.errors import CloudConfigError
from infra.provisioner import GpuNeed, Provisioner
from infra.records import LOCAL_ADDRESS_LABEL, InstanceInfo, job_labels
from sailor_core import settings
from sailor_core.catalog.instances import Offer, get_instance_type
from sailor_core.errors import InfeasibleError
from sailor_core.job import state as js
from sailor_core.job.nodes import NodeRequest, RunningInstance, match_instances
from sailor_core.job.spec import JobSpec
from sailor_core.runtime.agent import post_preemption
from tasks.workers import Assignment

OFFERS_TTL = timedelta(minutes=10)


def node_dict(node: NodeRequest) -> dict[str, Any]:
    return asdict(node)


@dataclass(slots=True, kw_only=True)
class CloudSession:
    """The providers of one flow run and what the flow needs to know about them."""

    mode: str  # "embedded" or "real"
    job_id: str
    jobs_url: str  # the job's directory/URL: agents' assignment and status documents
    providers: dict[str, Any]  # cloud name -> infra CloudProvider
    control_url: str | None = None  # the embedded cloud's control surface (preemption injection)
    shutdown_s: float = 120.0  # terminate -> billing stops (real clouds bill the shutdown)
    worker_stop_s: float = 10.0  # SIGTERM -> workers checkpointed and exited
    heartbeat_timeout_s: float = 120.0
    _closers: list = field(default_factory=list)

    @property
    def labels(self) -> dict[str, str]:
        return job_labels(self.job_id)

    def cache_key(self) -> str:
        return f"{self.mode}:{','.join(sorted(self.providers))}"

    def provider(self, cloud: str):
        try:
            return self.providers[cloud]
        except KeyError:
            raise CloudConfigError(f"no {cloud} provider configured in this session", cloud=cloud) from None

    def address_of(self, info: InstanceInfo) -> str:
        addr = info.labels.get(LOCAL_ADDRESS_LABEL) or info.private_ip
        if not addr:
            raise CloudConfigError(f"{info.instance_id} has no private address yet", cloud=info.cloud)
        return addr

    def rendezvous_port(self, master: Assignment) -> int:
        if self.mode == "embedded":  # every "instance" shares this machine's ports
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        return 29500

    def worker_args(self, a: Assignment) -> list[str]:
        # On the embedded cloud all ranks share this machine's cores: one thread each.
        return ["--threads", "1", "--timeout-s", "30"] if self.mode == "embedded" else []

    def worker_env(self, a: Assignment) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"} if self.mode == "embedded" else {}

    def startup_script(self) -> str:
        """What every instance runs at boot: the agent, pointed at this job's documents."""
        root = Path(__file__).resolve().parent.parent
        lines = ["#!/bin/bash", "set -e"]
        if self.mode == "embedded":
            lines.append(f"export PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}")
        lines.append(f'exec "${{{settings.PYTHON_ENV}:-python3}}" -m sailor_core.runtime.agent '
                     f"--job-url {shlex.quote(self.jobs_url)}")
        return "\n".join(lines) + "\n"

    def query(self) -> list[InstanceInfo]:
        out: list[InstanceInfo] = []
        for p in self.providers.values():
            out += p.query_instances(self.labels)
        return out

    def instance_states(self, ids: Sequence[str]) -> dict[str, str | None]:
        seen = {i.instance_id: i.state for i in self.query()}
        return {i: seen.get(i) for i in ids}

    def preempt(self, instance_id: str) -> bool:
        """Inject a spot preemption (notice, SIGTERM, notice period, SIGKILL) on the embedded cloud.

        False when the cloud has no such live instance (gone, or already being preempted);
        CloudConfigError when no embedded cloud is there to ask.
        """
        if self.control_url is None:
            raise CloudConfigError("preemptions can only be injected on the embedded cloud")
        answer = post_preemption(self.control_url, instance_id)
        if answer.ok:
            return True
        if answer.http_status == 404:
            return False
        raise CloudConfigError(f"the embedded cloud could not preempt {instance_id}: {answer.error}")


# ---- opening and closing --------------------------------------------------------

# Sessions open in this process, by job id: the cancellation/crash hooks find them here.
_sessions: dict[str, CloudSession] = {}
_lock = threading.Lock()


def providers_for_mode(mode: str, clouds: Sequence[str] = ()) -> tuple[str, dict[str, Any], str | None]:
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
    providers = providers_for(ends["aws_endpoint"], ends["gce_endpoint"])
    if clouds:
        providers = {c: p for c, p in providers.items() if c in clouds}
    return "embedded", providers, ends["control_url"]


def offers_session(mode: str, clouds: Sequence[str] = ()) -> CloudSession:
    """A session that only reads offers (plan and refresh-offers flows)."""
    used, providers, control_url = providers_for_mode(mode, clouds)
    return CloudSession(mode=used, job_id="offers", jobs_url="", providers=providers, control_url=control_url)


def open_session(mode: str, *, job_id: str, jobs_url: str, spec: JobSpec) -> CloudSession:
    used, providers, control_url = providers_for_mode(mode, spec.clouds)
    if used == "real":
        if "://" not in jobs_url or jobs_url.startswith("file://"):
            raise CloudConfigError("on real clouds the job's documents must be where instances reach them: "
                                   f"set jobs_url (or {settings.JOBS_URL_ENV}) to an s3:// or gs:// URL")
        session = CloudSession(mode=used, job_id=job_id, jobs_url=jobs_url, providers=providers)
    else:
        # Ending a local process group takes about the cloud's halt grace (1 s); bill a margin.
        session = CloudSession(mode=used, job_id=job_id, jobs_url=jobs_url, providers=providers,
                               control_url=control_url, shutdown_s=5.0, worker_stop_s=8.0,
                               heartbeat_timeout_s=60.0)
    for url in sorted({spec.checkpoint_url, jobs_url}):
        ensure_private_bucket(url)  # s3:// only: created private and encrypted, refused if public
    with _lock:
        _sessions[job_id] = session
    return session


def close_session(session: CloudSession) -> None:
    with _lock:
        _sessions.pop(session.job_id, None)
    for close in reversed(session._closers):
        close()


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
    now = time.time()
    found = {i.instance_id: i for i in session.query()}
    ended_preempted = {r.instance_id for r in state.running_instances()
                       if r.instance_id in found and found[r.instance_id].state == "preempted"}
    ended_other = {r.instance_id for r in state.running_instances()
                   if r.instance_id not in found or not found[r.instance_id].live} - ended_preempted
    state = js.with_instances_ended(state, ended_preempted, "preempted", now_unix_s=now)
    state = js.with_instances_ended(state, ended_other, "lost", now_unix_s=now)
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
              offers: Sequence[Offer]) -> Provisioned:
    """Keep running instances the plan can use, end the surplus, rent the rest (with zone failover).

    A node the failover placed in another zone moves its replicas there: the plan in the job
    state is updated to say where they really run.  Raises the provisioner's ProvisionError
    (a CapacityError) when some node could be had nowhere; nothing of this attempt is left running.
    """
    log = get_run_logger()
    now = time.time()
    # The job state can lag the cloud (a preemption may land while the flow re-plans): keep only
    # instances the cloud says are running with an address, and close the others' records.
    seen = {i.instance_id: i for i in session.query()}
    usable = []
    for r in state.running_instances():
        info = seen.get(r.instance_id)
        if info is not None and info.state == "running" and (info.labels.get(LOCAL_ADDRESS_LABEL) or info.private_ip):
            usable.append(r)
            continue
        if info is not None and info.live:
            terminate_ids(session, [r.instance_id])
        reason = "preempted" if info is not None and info.state == "preempted" else "terminated"
        log.info("instance %s is %s in the cloud: not reused", r.instance_id, info.state if info else "gone")
        state = js.with_instances_ended(state, {r.instance_id}, reason)
    running = [RunningInstance(instance_id=r.instance_id, zone=r.zone, instance_type=r.instance_type)
               for r in usable]
    placement = match_instances(nodes, running)
    if placement.surplus:
        terminate_ids(session, list(placement.surplus))
        state = js.with_instances_ended(state, set(placement.surplus), "terminated")
    history: tuple[str, ...] = ()
    placed: list[tuple[NodeRequest, InstanceInfo]] = []
    if placement.launch:
        needs = [GpuNeed(gpu=n.gpu, zone=n.zone, num_gpus=len(n.ranks), min_gpus_per_node=len(n.ranks))
                 for n in placement.launch]
        result = launch_nodes(session, needs, state.attempt, list(offers), state.spec.spot)
        history = tuple(result.history_lines())
        for line in history:
            log.info("provision: %s", line)
        for node, alloc in zip(placement.launch, result.allocations, strict=True):
            info = alloc.instances[0]
            moved = dataclasses.replace(node, cloud=alloc.offer.cloud, zone=alloc.offer.zone,
                                        instance_type=alloc.offer.instance_type,
                                        gpus_per_node=alloc.offer.gpus_per_node,
                                        usd_per_hr=alloc.usd_per_hr / max(1, len(alloc.instances)))
            placed.append((moved, info))
            state = js.with_instances_launched(state, (_record(info, moved, state.attempt, now),))
        state = js.with_plan_zones(state, {rep: n.zone for n, _ in placed for rep in n.replicas})
    current = {i.instance_id: i for i in session.query()}
    assignments = [Assignment(instance_id=iid, node=node, address=session.address_of(current[iid]))
                   for node, iid in placement.keep]
    assignments += [Assignment(instance_id=i.instance_id, node=n, address=session.address_of(current.get(i.instance_id, i)))
                    for n, i in placed]
    assignments.sort(key=lambda a: a.node.ranks[0])
    return Provisioned(state=state, nodes=tuple(a.node for a in assignments), assignments=tuple(assignments),
                       history=history)


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
        close_session(session)
    return state, left_running
