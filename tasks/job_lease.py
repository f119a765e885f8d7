"""Holding a job's lease for one flow run: taking it (waiting out a dead controller's), renewing
it on a thread, noticing when another flow run took the job over, releasing it at the end.
The rules are ``sailor_core.job.lease``'s; this module does the waiting and the writing."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Crashed

from sailor_core import settings
from sailor_core.errors import SailorError
from sailor_core.job import lease as jl
from sailor_core.job import state as js

SETTLE_S = 1.0  # after writing the lease, read it back this much later: of two takers at once, the last writer wins


class LeaseKeeper:
    """The lease of ``job_id`` held by flow run ``owner`` while the flow's body runs."""

    def __init__(self, store: js.JobStore, job_id: str, owner: str, *, deployment: str | None = None,
                 run_parameters: dict[str, Any] | None = None, log=None) -> None:
        self.store, self.job_id, self.owner = store, job_id, owner
        self.deployment, self.run_parameters = deployment, dict(run_parameters or {})
        self.ttl_s = settings.job_lease_s(jl.DEFAULT_LEASE_S)
        self.log = log
        self.lost_to: str | None = None  # the flow run that took the job over from this one
        self.took_over_from: jl.JobLease | None = None  # the expired lease of a controller that died
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        return self.lost_to is not None

    def acquire(self) -> LeaseKeeper:
        """Take the lease (after the holder's expiry when another controller held it; JobHeldError
        when that controller is alive), then renew it every quarter of its length."""
        first_seen: jl.JobLease | None = None
        said_wait = False
        while True:
            held = self.store.load_lease(self.job_id)
            now = time.time()
            verdict = jl.may_take(held, self.owner, now, first_seen=first_seen)
            if verdict == jl.YIELD:
                raise jl.JobHeldError(f"job {self.job_id} is controlled by flow run {held.owner} on {held.host} "
                                      f"(its lease was renewed {now - held.renewed_unix_s:.0f} s ago); "
                                      "not starting a second controller")
            if verdict == jl.TAKE and self._take(held, now):
                break
            first_seen = first_seen or held
            if not said_wait and held is not None and self.log is not None:
                self.log.info("job %s: waiting for the lease of flow run %s on %s to expire (in %.0f s)",
                              self.job_id, held.owner, held.host, max(0.0, held.expires_unix_s - now))
                said_wait = True
            time.sleep(min(2.0, max(0.2, (held.expires_unix_s - now) if held else 0.2)))
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.job_id}", daemon=True)
        self._thread.start()
        return self

    def _take(self, held: jl.JobLease | None, now: float) -> bool:
        mine = jl.take(job_id=self.job_id, owner=self.owner, host=socket.gethostname(), ttl_s=self.ttl_s,
                       now_unix_s=now, deployment=self.deployment, run_parameters=self.run_parameters)
        self.store.save_lease(mine)
        time.sleep(SETTLE_S)
        back = self.store.load_lease(self.job_id)
        if back is None or back.owner != self.owner:
            return False
        if held is not None and held.owner != self.owner and not held.released:
            self.took_over_from = held
        self.store.save_lease(jl.renewed(back, time.time()))  # its length counts from now, not from before the settle
        return True

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                held = self.store.load_lease(self.job_id)
                if held is not None and held.owner != self.owner:
                    self.lost_to = held.owner
                    if self.log is not None:
                        self.log.warning("job %s was taken over by flow run %s; this run leaves its instances "
                                         "to it", self.job_id, held.owner)
                    return
                self.store.save_lease(jl.renewed(held, time.time()) if held is not None else
                                      jl.take(job_id=self.job_id, owner=self.owner, host=socket.gethostname(),
                                              ttl_s=self.ttl_s, now_unix_s=time.time(), deployment=self.deployment,
                                              run_parameters=self.run_parameters))
            except (SailorError, OSError) as exc:  # a storage hiccup: the next tick tries again
                if self.log is not None:
                    self.log.warning("job %s: could not renew its lease: %s", self.job_id, exc)

    def release(self) -> None:
        """Stop renewing; the lease is released unless another flow run holds the job now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lost:
            return
        held = self.store.load_lease(self.job_id)
        if held is not None and held.owner == self.owner:
            self.store.save_lease(jl.released(held, time.time()))


def hold(store: js.JobStore, job_id: str, run_id, *, run_parameters: dict[str, Any], log=None) -> LeaseKeeper:
    """The lease of ``job_id`` for this flow run, held (``LeaseKeeper.acquire``); when a worker runs
    the flow, the lease names the deployment the job watch re-submits the job to if this run dies."""
    name = current_deployment.name if current_deployment.id else None
    deployment = f"{current_flow_run.flow_name}/{name}" if name else None
    owner = str(run_id) if run_id else f"local-{socket.gethostname()}-{time.time_ns()}"
    return LeaseKeeper(store, job_id, owner, deployment=deployment, run_parameters=run_parameters, log=log).acquire()


def takeover_words(dead: jl.JobLease) -> str:
    return (f"took the job over from flow run {dead.owner} on {dead.host}, whose lease expired "
            f"{time.time() - dead.expires_unix_s:.0f} s ago (last renewed "
            f"{time.strftime('%H:%M:%S', time.gmtime(dead.renewed_unix_s))} UTC)")


def leases(store: js.JobStore) -> list[tuple[js.JobState, jl.JobLease | None]]:
    """Every unended job of ``store`` with its lease (None: never held by a controller that knew of leases)."""
    out = []
    for state in store.list():
        if state.status in js.ENDED_STATUSES:
            continue
        try:
            out.append((state, store.load_lease(state.job_id)))
        except SailorError:  # an unreadable lease is left for a person: never a second controller by guess
            continue
    return out


def resubmit(lease: jl.JobLease) -> str:
    """A flow run of the dead controller's deployment for its job; the run's id.  Prefect returns
    the same run for the same idempotency key, so watches running at once submit one.  The dead
    controller's run, which no process will ever end, is marked Crashed with the reason."""
    run = run_deployment(lease.deployment, parameters={**lease.run_parameters, "job_id": lease.job_id},
                         timeout=0, as_subflow=False, idempotency_key=jl.takeover_key(lease),
                         flow_run_name=lease.job_id, tags=["sailor", "takeover"])
    try:
        dead_id = uuid.UUID(lease.owner)
    except ValueError:  # a local run's lease: no flow run to mark
        return str(run.id)
    with get_client(sync_client=True) as client:
        try:
            dead = client.read_flow_run(dead_id)
        except ObjectNotFound:
            return str(run.id)
        if dead.state is None or not dead.state.is_final():
            client.set_flow_run_state(dead_id, Crashed(message=(
                f"its controller stopped renewing job {lease.job_id}'s lease on {lease.host} (machine or process "
                f"died); flow run {run.id} took the job over")), force=True)
    return str(run.id)
