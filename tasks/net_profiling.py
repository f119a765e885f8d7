"""Network-profiling tasks: rent instances for one link, run the profiler's workers there, collect the points.

The instances are rented like a training job's (infra's provisioner, the job's labels, each
instance's startup script runs the agent), and the workers are started the same way too: the
flow writes each agent an assignment document, here naming the profiler's worker module
(``sailor_core.profiler.net_worker``) instead of the engine's.  Rank 0 appends its progress and
its result to the agent's metrics file; the agent forwards the last line in its status
document, which is where this module reads the points from -- on a real cloud as on the
embedded one, without reaching the instances over the network.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.provisioner import GpuNeed, Provisioner
from infra.records import LOCAL_ADDRESS_LABEL, InstanceInfo
from sailor_core.catalog.instances import Offer
from sailor_core.errors import BudgetExceededError, InputError, SailorError
from sailor_core.job.protocol import (
    AgentAction,
    AgentAssignment,
    AgentState,
    AgentStatus,
    WorkerEvent,
    write_assignment,
)
from sailor_core.profiler.network import NET_WORKER_MODULE, NetworkLink, network_worker_args
from tasks.agent_watch import POLL_S, AgentPoll, Listeners, Poll, watch_agents

LAUNCH_WAIT_S = 600.0  # launch -> running, per zone tried
ADDRESS_WAIT_S = 30.0  # a running instance gets its private address within seconds
SETTLE_S = 10.0  # a stopping instance: how long to wait for its end state (preempted, terminated)
GENERATION = 1  # one assignment per instance: the profile is a single run

# Listeners in this process (the CLI's progress bar): told {"event": ..., ...} dicts.
_listeners: Listeners[dict] = Listeners()
add_progress_listener = _listeners.add
remove_progress_listener = _listeners.remove
emit = _listeners.emit


class NetworkProfilingError(SailorError):
    """The profile's workers failed, an instance went away, or the run passed its deadline."""

    exit_code = 6


def offers_for(link: NetworkLink, offers: Sequence[Offer]) -> list[Offer]:
    """The offers of the link's GPU in its zones; InputError naming a zone that has none."""
    mine = [o for o in offers if o.gpu == link.gpu and o.zone in (link.src_zone, link.dst_zone)]
    for zone in dict.fromkeys((link.src_zone, link.dst_zone)):
        if not any(o.zone == zone for o in mine):
            raise InputError(f"no {link.gpu} instances are offered in {zone} "
                             f"(see `sailor offers --gpu {link.gpu}`)")
    return mine


def check_worst_case_cost(link: NetworkLink, offers: Sequence[Offer], *, spot: bool, budget_usd: float,
                          timeout_s: float, shutdown_s: float) -> float:
    """USD/h of the cheapest instances the link needs; refuses before renting when running them to
    the deadlines (the launch wait, the measurement's ``timeout_s``, the shutdown) could cross the budget."""
    def price(o: Offer) -> float:
        return o.spot_usd_per_hr if spot else o.on_demand_usd_per_hr

    usd_per_hr = sum(min(price(o) for o in offers if o.zone == zone) for zone in link.zones_by_rank())
    worst_usd = usd_per_hr * (LAUNCH_WAIT_S + timeout_s + shutdown_s) / 3600.0
    if worst_usd > budget_usd:
        raise BudgetExceededError(
            f"{link.num_workers} x {link.gpu} at {usd_per_hr:.2f} USD/h could cost up to {worst_usd:.2f} USD "
            f"if the profile ran to its deadlines ({LAUNCH_WAIT_S:.0f} s launch, {timeout_s:.0f} s run); "
            "raise --budget-usd or lower --timeout-s")
    return usd_per_hr


@task(name="launch-profile-instances", tags=["cloud", "profiler"], cache_policy=NO_CACHE)
def launch_instances(session, link: NetworkLink, offers: list[Offer], spot: bool,
                     wait_timeout_s: float) -> list[InstanceInfo]:
    """One instance per rank in its zone (no failover to other zones: that would measure another
    link); all or nothing.  Raises the provisioner's ProvisionError (a CapacityError) or QuotaError."""
    log = get_run_logger()
    needs = [GpuNeed(gpu=link.gpu, zone=z, num_gpus=1) for z in link.zones_by_rank()]
    result = Provisioner(session.providers, wait_timeout_s=wait_timeout_s).provision(
        needs, job_id=session.job_id, attempt=1, spot=spot, substitute_zones=False, all_or_nothing=True,
        startup_script=session.startup_script(), offers=offers)
    for line in result.history_lines():
        log.info("provision: %s", line)
    return [alloc.instances[0] for alloc in result.allocations]  # in the needs' order: by rank


def addresses_of(session, instance_ids: Sequence[str], timeout_s: float = ADDRESS_WAIT_S) -> list[str]:
    """Each instance's address for the rendezvous, waiting briefly for the cloud to report it."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {i.instance_id: i for i in session.query()}
        missing = [iid for iid in instance_ids if iid not in seen or not (
            seen[iid].labels.get(LOCAL_ADDRESS_LABEL) or seen[iid].private_ip)]
        if not missing:
            return [session.address_of(seen[iid]) for iid in instance_ids]
        if time.monotonic() > deadline:
            raise NetworkProfilingError(f"instance {missing[0]} has no private address after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def assignment_doc(*, rank: int, world_size: int, master_addr: str, master_port: int,
                   worker_args: Sequence[str], env: dict[str, str]) -> AgentAssignment:
    return AgentAssignment(generation=GENERATION, attempt=1, action=AgentAction.RUN, module=NET_WORKER_MODULE,
                           plan={}, ranks=(rank,), world_size=world_size, master_addr=master_addr,
                           master_port=master_port, extra_worker_args=tuple(worker_args), env=env)


def _log_tail(status: AgentStatus, rank: int) -> str:
    """The last line a failed rank logged, when its log is on this machine (the embedded cloud)."""
    log_dir = status.log_dir
    try:
        text = (Path(log_dir) / f"rank{rank}.log").read_text(errors="replace")
    except (OSError, TypeError):
        return f"see rank{rank}.log under {log_dir or 'the agent work dir'} on the instance"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _progress_step(event: WorkerEvent | None, sizes: Sequence[int]) -> int | None:
    """How many of the 2 x len(sizes) measurements are done after this event of rank 0."""
    if event is None or event.num_bytes not in sizes:
        return None
    return 2 * list(sizes).index(event.num_bytes) + (1 if event.kind == "p2p" else 2)


def _worker_failure(statuses: Mapping[str, AgentStatus], instance_ids: Sequence[str],
                    zones: Sequence[str]) -> str | None:
    """Why the run cannot finish, from the agents' reports of this generation; None while it can."""
    for rank, iid in enumerate(instance_ids):
        st = statuses.get(iid)
        if not st or st.state not in (AgentState.FAILED, AgentState.EXITED):
            continue
        if st.state == AgentState.EXITED:
            if rank == 0:  # its result is forwarded before the agent reports the exit
                return f"rank 0 on {iid} exited without a result"
            continue  # a peer may finish before rank 0's report arrives
        code = st.exit_codes.get(rank)
        return f"rank {rank} on {iid} ({zones[rank]}) failed with exit code {code}: {_log_tail(st, rank)}"
    return None


def _settled_state(session, instance_id: str, state: str | None) -> str:
    """What became of an instance that left "running": a stopping one (the preemption notice) is
    given a few seconds to say whether it was preempted."""
    deadline = time.monotonic() + SETTLE_S
    while state == "stopping" and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = session.instance_states([instance_id]).get(instance_id)
    return {"stopping": "stopping (preempted or stopped)", None: "gone"}.get(state, state)


@task(name="run-network-workers", tags=["profiler", "workers"], cache_policy=NO_CACHE)
def run_workers(session, instance_ids: list[str], addresses: list[str], zones: list[str], *, sizes: list[int],
                reps: int, device: str, timeout_s: float) -> dict:
    """Have every instance's agent start its rank of the profiler; rank 0's points when it is done.

    Fails (NetworkProfilingError) when a rank fails, an instance stops running (preempted), or
    the deadline passes; the flow terminates the instances in every case.
    """
    log = get_run_logger()
    world = len(instance_ids)
    port = session.rendezvous_port(None)  # the embedded cloud picks a free port; real clouds use 29500
    args = network_worker_args(sizes=sizes, reps=reps, device=device) + session.worker_args(None)
    for rank, iid in enumerate(instance_ids):
        write_assignment(session.jobs_url, iid, assignment_doc(
            rank=rank, world_size=world, master_addr=addresses[0], master_port=port, worker_args=args,
            env=session.worker_env(None)))
    log.info("%d workers, rendezvous %s:%d", world, addresses[0], port)
    emit({"event": "workers", "num_workers": world})
    watch = _ProfileWatch(session=session, instance_ids=instance_ids, zones=zones, sizes=sizes,
                          timeout_s=timeout_s)
    return watch_agents(session, instance_ids, watch.on_poll)


class _ProfileWatch:
    """``run_workers``' handling of each poll: rank 0's progress and result, or why the run cannot finish."""

    __slots__ = ("session", "instance_ids", "zones", "sizes", "timeout_s", "deadline", "done")

    def __init__(self, *, session, instance_ids: list[str], zones: list[str], sizes: list[int],
                 timeout_s: float) -> None:
        self.session, self.instance_ids, self.zones, self.sizes = session, instance_ids, zones, sizes
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.done = 0  # measurements rank 0 reported done

    def on_poll(self, poll: AgentPoll) -> dict | Poll:
        mine = {iid: st for iid, st in poll.statuses.items() if st and st.generation == GENERATION}
        first = mine.get(self.instance_ids[0])
        event = first.event if first else None
        total = 2 * len(self.sizes)
        if event is not None and event.kind == "result":
            emit({"event": "measured", "done": total, "total": total})
            return event.result
        step = _progress_step(event, self.sizes)
        if step is not None and step > self.done:
            self.done = step
            emit({**event.to_dict(), "done": step, "total": total})
        if poll.boot_failures:  # failed, not hung: the startup script said why
            raise NetworkProfilingError(next(iter(poll.boot_failures.values())))
        gone = [(iid, st) for iid, st in poll.cloud_states.items() if st != "running"]
        if gone:
            iid, state = gone[0]
            raise NetworkProfilingError(f"instance {iid} ({self.zones[self.instance_ids.index(iid)]}) is "
                                        f"{_settled_state(self.session, iid, state)} before the profile finished")
        failure = _worker_failure(mine, self.instance_ids, self.zones)
        if failure is not None and poll.failure_grace_over:
            raise NetworkProfilingError(failure)
        if time.monotonic() > self.deadline:
            raise NetworkProfilingError(
                f"network profiling did not finish within {self.timeout_s:.0f} s (last: "
                f"{event.kind if event else 'no report from rank 0'}); raise --timeout-s or lower --max-mib")
        return Poll.AGAIN if failure is None else Poll.WORKERS_FAILING


def table_rows(profile) -> list[dict]:
    """One row per measured message size: p2p time, bandwidth and the fit, all-reduce time."""
    ar = dict(next(iter(profile.allreduce_points.values()), ()))
    return [{"bytes": b, "p2p_ms": round(t * 1e3, 4), "p2p_GBps": round(b / t / 1e9, 4),
             "fit_GBps": round(profile.fit.bandwidth_bytes_per_s(b) / 1e9, 4),
             "allreduce_ms": round(ar[b] * 1e3, 4) if b in ar else None}
            for b, t in profile.p2p_points]
