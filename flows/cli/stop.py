"""Stopping a job gracefully: ``sailor stop J``, and what Ctrl-C does to ``sailor train``.

Either way the job gets a ``StopRequest`` next to its state (``sailor_core.job.state``); its
flow run, wherever it runs (in ``sailor train``'s process or on a deployment's worker), reads
it while it watches the workers: they take a final checkpoint, the instances end, and the run
ends Cancelled in Prefect with the job's reason ("stopped by the user (Ctrl-C) at step 547;
checkpoint 545 saved; continue with `sailor train --job-id J`").

Ctrl-C: the first asks for that stop and gives it ``GRACE_S``; a second Ctrl-C, or the end of
the grace, stops at once (``KeyboardInterrupt``: the flow's ``finally`` still terminates every
instance, and further Ctrl-Cs are ignored until it has).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import _thread

import typer

from flows.cli.common import console

GRACE_S = 60.0  # the first Ctrl-C's stop: the workers' final checkpoint, the instances' end
STOP_WAIT_S = 120.0  # `sailor stop` waits this long for the job to end


def register(app: typer.Typer) -> None:
    app.command(name="stop")(stop)


class GracefulStop:
    """``sailor train``'s SIGINT handler while its job runs (installed by ``install``)."""

    def __init__(self, store, job_id: str, *, say, grace_s: float = GRACE_S) -> None:
        self.store, self.job_id, self.say, self.grace_s = store, job_id, say, grace_s
        self.requested = False  # the first Ctrl-C came
        self.at_once = False  # the second (or the grace ran out): the job was stopped at once
        self._timer: threading.Timer | None = None

    def install(self) -> None:
        """Whatever SIGINT handling this process inherited: Python keeps an ignored SIGINT, and a shell
        without job control (a script, a CI step) starts `cmd &` with SIGINT ignored; a Ctrl-C that did
        nothing would leave the job training and billing until someone kills the process by force."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._on_sigint)

    def uninstall(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_sigint(self, signum, frame) -> None:
        if self.at_once:  # stopping at once already: the instances are being terminated, let it finish
            return
        if self.requested:
            self._now("Ctrl-C again")
            raise KeyboardInterrupt
        self.requested = True
        # Written off the signal handler: it may have interrupted the main thread inside the storage.
        threading.Thread(target=self._request, daemon=True).start()
        self.say(f"stopping job {self.job_id}: its workers take a final checkpoint, then its instances end "
                 f"(at most {self.grace_s:.0f} s; Ctrl-C again to stop at once)")
        self._timer = threading.Timer(self.grace_s, self._grace_over)
        self._timer.daemon = True
        self._timer.start()

    def _request(self) -> None:
        # lazy: the job state module, once the job runs
        from sailor_core.job.state import StopRequest

        try:
            self.store.request_stop(self.job_id, StopRequest(by="Ctrl-C", at_unix_s=time.time()))
        except Exception as exc:  # noqa: BLE001 - the stop must still happen: at once
            self.say(f"could not ask the job to stop ({exc}); stopping at once")
            self._grace_over()

    def _grace_over(self) -> None:
        if not self.at_once:
            self._now(f"the {self.grace_s:.0f} s grace is over")
            _thread.interrupt_main()  # KeyboardInterrupt in the main thread, as a Ctrl-C

    def _now(self, why: str) -> None:
        self.at_once = True
        self.say(f"{why}: stopping job {self.job_id} at once (its instances are terminated)")


def stop(job_id: str = typer.Argument(..., help="job id (see `sailor jobs`)"),
         wait: bool = typer.Option(True, "--wait/--no-wait", help="wait for the job to end and say how it ended"),
         ) -> None:
    """Stop a running job gracefully: its workers take a final checkpoint, then its instances end.
    `sailor train --job-id J` continues it later from that checkpoint."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.errors import InputError
    from sailor_core.job import state as js

    store = js.JobStore()
    job = store.load(job_id)
    if job.status in js.ENDED_STATUSES:
        raise InputError(f"job {job_id} is not running: {job.status} {job.status_reason}".strip())
    asked = time.time()
    store.request_stop(job_id, js.StopRequest(by="`sailor stop`", at_unix_s=asked))
    out = console()
    out.print(f"asked job {job_id} to stop: its workers take a final checkpoint, then its instances end",
              highlight=False)
    if not wait:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        job = store.load(job_id)
        if job.status in js.ENDED_STATUSES and job.updated_unix_s >= asked:
            out.print(f"job {job_id}: {job.status} {job.status_reason}", highlight=False)
            return
        time.sleep(1.0)
    sys.stderr.write(f"error: job {job_id} did not end within {STOP_WAIT_S:.0f} s: is its flow run alive? "
                     "(`sailor status`, the Prefect UI)\n")
    raise typer.Exit(1)
