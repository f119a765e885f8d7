"""Planner answers computed ahead in worker processes.

A cold replay's time is its planner calls, made one after the other because each
decision waits for its answer.  But the availabilities most of them are about
are known ahead (``lookahead.upcoming_requests``), so worker processes can
search them while the replay gets there.  Each worker runs the same planner
function on the same request, so an answer is the same whichever process gives
it (``tests/replay/test_prefetch.py``); a wrong guess only wastes a worker's
search.  Requests nobody guessed are answered in the calling process.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from sailor_core.controller import PlanFn, PlanOption, planner_plan_fn
from sailor_core.traces import GpuZone

_WORKER_FN: PlanFn | None = None


def _worker_start(planner_args: dict[str, Any]) -> None:
    global _WORKER_FN
    _WORKER_FN = planner_plan_fn(**planner_args)


def _worker_plan(available: tuple[tuple[GpuZone, int], ...]) -> tuple[tuple[PlanOption, ...], float]:
    t0 = time.process_time()
    options = tuple(_WORKER_FN(dict(available)))
    return options, time.process_time() - t0


def _worker_call(fn: Callable[..., Any], args: tuple) -> tuple[Any, float]:
    t0 = time.process_time()
    out = fn(_WORKER_FN, *args)
    return out, time.process_time() - t0


def default_workers() -> int:
    """Worker processes for a replay: one per CPU this process may use that other work
    leaves idle (by the 1-minute load average); none when fewer than two are, since
    workers taking turns on one CPU are slower than one process."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    idle = int(cpus - busy + 0.5)
    return min(idle, cpus) if idle >= 2 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefetchStats:
    num_asked: int            # requests that reached this planner
    num_from_workers: int     # of which answered by a worker's search
    num_in_process: int       # of which searched here (nobody had guessed them)
    num_searched_ahead: int   # searches started in workers (the rest of them were wasted)
    wait_s: float             # time spent waiting for a worker's answer
    worker_cpu_s: float       # CPU seconds of the workers' finished searches


class PrefetchingPlanner:
    """A PlanFn (the planner, built in each process from ``planner_args`` for
    ``planner_plan_fn``) whose answers ``prefetch(requests)`` starts computing in
    up to ``workers`` processes.  ``known(available)`` says which requests need no
    search (answered by a cache above this one).  Call ``close()`` when done."""

    def __init__(self, planner_args: dict[str, Any], *, workers: int,
                 known: Callable[[Mapping[GpuZone, int]], bool] = lambda _a: False) -> None:
        self.planner_args, self.workers, self.known = dict(planner_args), workers, known
        self._plan_here = planner_plan_fn(**self.planner_args)
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[frozenset, Future] = {}
        self._num_asked = self._num_from_workers = self._num_in_process = 0
        self._wait_s = self._worker_cpu_s = 0.0

    def __call__(self, available: Mapping[GpuZone, int]) -> tuple[PlanOption, ...]:
        self._num_asked += 1
        key = frozenset(available.items())
        future = self._futures.pop(key, None)
        # A search still queued is waited for too: it is the most urgent of the queue
        # (``prefetch`` orders it), and searching it here as well would make one more
        # process than CPUs.
        if future is not None:
            t0 = time.perf_counter()
            try:
                options, cpu_s = future.result()
            except BrokenProcessPool:
                self.stop_workers()
            else:
                self._wait_s += time.perf_counter() - t0
                self._worker_cpu_s += cpu_s
                self._num_from_workers += 1
                return options
        self._num_in_process += 1
        return tuple(self._plan_here(available))

    @property
    def lookahead_decisions(self) -> int:
        """Re-plans to guess ahead: enough requests (about 3 a re-plan) to keep the workers
        busy; later guesses are less often right (they assume the plans in between)."""
        return max(2, -(-2 * self.workers // 3))

    def prefetch(self, requests: Iterable[Mapping[GpuZone, int]]) -> None:
        """Search ``requests`` (most urgent first) ahead, those neither known nor started,
        keeping at most ``2 * workers`` searches running or queued.  The searches not
        started yet are queued again in the order of ``requests`` (earlier guesses no
        longer among them are dropped)."""
        if self.workers <= 0:
            return
        wanted: dict[frozenset, Mapping[GpuZone, int]] = {}
        for available in requests:
            key = frozenset(available.items())
            if key and key not in wanted and (key in self._futures or not self.known(available)):
                wanted[key] = available
        for key, future in list(self._futures.items()):
            if future.cancel():
                del self._futures[key]
        busy = sum(not f.done() for f in self._futures.values())
        for key, available in wanted.items():
            if busy >= 2 * self.workers:
                return
            if key not in self._futures:
                try:
                    self._futures[key] = self._executor().submit(_worker_plan, tuple(sorted(available.items())))
                except BrokenProcessPool:
                    self.stop_workers()
                    return
                busy += 1

    def run_in_worker(self, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn(plan_fn, *args)`` in a worker, with that worker's planner as ``plan_fn``
        (``fn`` and ``args`` must pickle).  The future gives ``(fn's result, its CPU seconds)``."""
        return self._executor().submit(_worker_call, fn, args)

    def adopt(self, answers: Mapping[frozenset, tuple[PlanOption, ...]], *, cpu_s: float = 0.0) -> None:
        """Planner answers a worker found some other way (keyed by ``frozenset(available.items())``)."""
        for key, options in answers.items():
            if key not in self._futures:
                future: Future = Future()
                future.set_result((tuple(options), 0.0))
                self._futures[key] = future
        self._worker_cpu_s += cpu_s

    def stats(self) -> PrefetchStats:
        """Call after ``close()`` to count every search the workers finished."""
        unused = [f for f in self._futures.values() if f.done() and not f.cancelled() and f.exception() is None]
        return PrefetchStats(
            num_asked=self._num_asked, num_from_workers=self._num_from_workers,
            num_in_process=self._num_in_process, num_searched_ahead=self._num_from_workers + len(unused),
            wait_s=self._wait_s, worker_cpu_s=self._worker_cpu_s + sum(f.result()[1] for f in unused),
        )

    def stop_workers(self) -> None:
        """Search everything here from now on: a worker died (killed for memory, say), which
        breaks the pool.  Nothing is lost but time: its searches are done again here."""
        self.workers = 0
        self._futures = {k: f for k, f in self._futures.items() if f.done() and f.exception() is None}
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # Forking copies the loaded profiles and the planner's warm memos; a process
            # with other threads (a Prefect flow) starts clean ones instead, since a fork
            # may copy a lock another thread holds.
            method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
                else "spawn"
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context(method),
                                             initializer=_worker_start, initargs=(self.planner_args,))
        return self._pool
