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
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from sailor_core.controller import PlanFn, PlanOption, planner_plan_fn
from sailor_core.planner.request import PlanQuery
from sailor_core.traces import GpuZone

_WORKER_FN: PlanFn | None = None


def _worker_start(query: PlanQuery) -> None:
    global _WORKER_FN
    _WORKER_FN = planner_plan_fn(query)


def _worker_plan(available: tuple[tuple[GpuZone, int], ...]) -> tuple[tuple[PlanOption, ...], float]:
    t0 = time.process_time()
    options = tuple(_WORKER_FN(dict(available)))
    return options, time.process_time() - t0


# Past 8 the lookahead guesses more requests than it gets right: on 16 idle CPUs the 3-day
# aws-3d replay took 5.2-5.4 s with 8 workers and 5.0 s with 15, for 33 against 42 CPU s
# and twice the memory (each worker holds its own memos, ~230 MB).
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """Worker processes for a replay: one per CPU this process may use that other work
    leaves idle, at most ``MAX_DEFAULT_WORKERS``; none when fewer than two are, since
    workers taking turns on one CPU are slower than one process.  Idle is measured now
    (``idle_cpus_now``) where the system tells, else read off the 1-minute load average,
    which still counts a run that just ended (a second replay right after a first would
    get no workers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    idle_now = idle_cpus_now()
    if idle_now is not None:
        idle = int(idle_now + 0.5)
    else:
        try:
            busy = os.getloadavg()[0]
        except (AttributeError, OSError):
            busy = 0.0
        idle = int(cpus - busy + 0.5)
    return min(idle, cpus, MAX_DEFAULT_WORKERS) if idle >= 2 else 0


def idle_cpus_now(window_s: float = 0.1, *, read_stat: Callable[[], str] | None = None) -> float | None:
    """How many of the machine's CPUs were idle over the next ``window_s``, from the first
    line of Linux's /proc/stat (``read_stat`` reads it); None where that cannot be read."""

    def snapshot() -> tuple[int, int]:
        line = read_stat() if read_stat is not None else _first_stat_line()
        fields = [int(x) for x in line.split()[1:9]]  # user .. steal (guest is counted in user)
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    try:
        idle0, total0 = snapshot()
        time.sleep(window_s)
        idle1, total1 = snapshot()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (idle1 - idle0) / (total1 - total0) * (os.cpu_count() or 1)


def _first_stat_line() -> str:
    with open("/proc/stat") as f:
        return f.readline()


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefetchStats:
    num_asked: int            # requests that reached this planner
    num_from_workers: int     # of which answered by a worker's search
    num_in_process: int       # of which searched here (nobody had guessed them)
    num_searched_ahead: int   # searches the workers finished
    num_unused: int           # of which nobody asked for (wrong guesses)
    wait_s: float             # time spent waiting for a worker's answer
    worker_cpu_s: float       # CPU seconds of the workers' finished searches


class PrefetchingPlanner:
    """A PlanFn (the planner, built in each process from ``query`` by
    ``planner_plan_fn``) whose answers ``prefetch(requests)`` starts computing in
    up to ``workers`` processes.  ``known(available)`` says which requests need no
    search (answered by a cache above this one).  Call ``close()`` when done."""

    def __init__(self, query: PlanQuery, *, workers: int,
                 known: Callable[[Mapping[GpuZone, int]], bool] = lambda _a: False) -> None:
        self.query, self.workers, self.known = query, workers, known
        self._plan_here = planner_plan_fn(query)
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[frozenset, Future] = {}
        # Every answer a worker gave, for whichever caller asks it next: a policy replayed
        # later, or a shadow replay in a thread (``search_in_worker``).
        self._answers: dict[frozenset, tuple[PlanOption, ...]] = {}
        self._pinned: set[frozenset] = set()  # searches a thread waits for: never cancelled
        self._lock = threading.Lock()  # the dicts above, between the replay and shadow threads
        self._num_asked = self._num_from_workers = self._num_in_process = 0
        self._wait_s = self._worker_cpu_s = 0.0

    def __call__(self, available: Mapping[GpuZone, int]) -> tuple[PlanOption, ...]:
        self._num_asked += 1
        key = frozenset(available.items())
        with self._lock:
            options = self._answers.get(key)
            future = self._futures.get(key) if options is None else None
        if options is not None:
            self._num_from_workers += 1
            return options
        # A search still queued is waited for too: it is the most urgent of the queue
        # (``prefetch`` orders it), and searching it here as well would make one more
        # process than CPUs.  One nobody guessed goes to a worker too, ahead of the
        # guesses still queued: a worker's memos are warm, and this process would have
        # to load the profiles first.
        if future is None and self.workers > 0:
            future = self._submit_first(key, available)
        if future is not None:
            t0 = time.perf_counter()
            options = self._result(key, future)
            if options is not None:
                self._wait_s += time.perf_counter() - t0
                self._num_from_workers += 1
                return options
        self._num_in_process += 1
        return tuple(self._plan_here(available))

    def search_in_worker(self, available: Mapping[GpuZone, int]) -> tuple[PlanOption, ...] | None:
        """The answer to ``available`` from a worker (searched ahead already, or now), for a
        thread other than the replay's: the same search is never made twice.  None if the
        workers stopped (the caller then leaves the search to the replay)."""
        key = frozenset(available.items())
        with self._lock:
            options = self._answers.get(key)
            if options is not None:
                return options
            future = self._futures.get(key)
            if future is None or future.cancelled():
                future = self._submit(key, available) if self.workers > 0 else None
                if future is None:
                    return None
            self._pinned.add(key)
        return self._result(key, future)

    def _submit_first(self, key: frozenset, available: Mapping[GpuZone, int]) -> Future | None:
        """Search ``available`` in a worker before the guesses not started yet (the next
        ``prefetch`` queues those again); None if the pool broke."""
        with self._lock:
            self._cancel_queued()
            future = self._submit(key, available)
        if future is None:
            self.stop_workers()
        return future

    def _submit(self, key: frozenset, available: Mapping[GpuZone, int]) -> Future | None:
        """(Holding the lock.)  A worker's search of ``available``; None if the pool broke."""
        try:
            future = self._executor().submit(_worker_plan, tuple(sorted(available.items())))
        except BrokenProcessPool:
            return None
        self._futures[key] = future
        return future

    def _cancel_queued(self) -> None:
        """(Holding the lock.)  Drop the searches not started yet that no thread waits for."""
        for key, future in list(self._futures.items()):
            if key not in self._pinned and future.cancel():
                del self._futures[key]

    def _result(self, key: frozenset, future: Future) -> tuple[PlanOption, ...] | None:
        """A worker's answer, kept for later callers; None if the pool broke."""
        try:
            options, cpu_s = future.result()
        except (BrokenProcessPool, CancelledError):
            if not future.cancelled():
                self.stop_workers()
            return None
        with self._lock:
            if self._futures.get(key) is future:
                del self._futures[key]
                self._answers[key] = options
                self._worker_cpu_s += cpu_s
            self._pinned.discard(key)
        return options

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
            if key and key not in wanted and key not in self._answers and (
                    key in self._futures or not self.known(available)):
                wanted[key] = available
        broke = False
        with self._lock:
            self._cancel_queued()
            busy = sum(not f.done() for f in self._futures.values())
            for key, available in wanted.items():
                if busy >= 2 * self.workers:
                    break
                if key not in self._futures:
                    if self._submit(key, available) is None:
                        broke = True
                        break
                    busy += 1
        if broke:
            self.stop_workers()

    def start(self) -> None:
        """Start the worker processes now, before the caller starts threads of its own (a
        process forks them only while it has one thread)."""
        if self.workers > 0:
            self._executor()

    def stats(self) -> PrefetchStats:
        """Call after ``close()`` to count every search the workers finished."""
        unused = [f for f in self._futures.values() if f.done() and not f.cancelled() and f.exception() is None]
        return PrefetchStats(
            num_asked=self._num_asked, num_from_workers=self._num_from_workers,
            num_in_process=self._num_in_process, num_searched_ahead=len(self._answers) + len(unused),
            num_unused=len(unused),
            wait_s=self._wait_s, worker_cpu_s=self._worker_cpu_s + sum(f.result()[1] for f in unused),
        )

    def stop_workers(self) -> None:
        """Search everything here from now on: a worker died (killed for memory, say), which
        breaks the pool.  Nothing is lost but time: its searches are done again here."""
        with self._lock:
            self.workers = 0
            self._futures = {k: f for k, f in self._futures.items()
                             if f.done() and not f.cancelled() and f.exception() is None}
        self.close()

    def close(self) -> None:
        """No more worker searches: the queued ones are cancelled, the running ones finish."""
        with self._lock:
            self.workers = 0  # (a shadow thread may not start the pool again)
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # Forking copies the loaded profiles and the planner's warm memos; a process
            # with other threads (a Prefect flow) starts clean ones instead, since a fork
            # may copy a lock another thread holds.
            method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
                else "spawn"
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context(method),
                                             initializer=_worker_start, initargs=(self.query,))
        return self._pool
