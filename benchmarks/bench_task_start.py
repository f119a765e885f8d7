"""A Prefect task run's start overhead in a flow, against the project's own local server (SQLite).

Runs one flow of ``--tasks`` trivial task runs per variant and prints, per variant, the latency from
the call in the flow to the first line of the task's body (median and max):

- ``tagged``: a task with a tag, as the train-job's tasks had (``workers``, ``controller``): before
  the body runs Prefect asks the server for a concurrency slot of every tag (``POST
  /v2/concurrency_limits/increment-with-lease``, a write transaction), even where no limit exists;
- ``untagged``: the same task without tags (no request: the task run is created on the client and
  its states reach the server as events).

Each variant runs quiet, then with ``--traffic`` threads writing what a training job writes
meanwhile (status artifacts, log lines, events), as on a recovery's path. Last, that slot request
alone, sent ``--tasks`` times under the same traffic: its answers' status codes (503: the server's
SQLite was busy; the client then waits ``2 ** try`` s, about 2 s, before its retry).

    .venv/bin/python benchmarks/bench_task_start.py [--tasks 30] [--traffic 2]
"""

from __future__ import annotations

import argparse
import contextvars
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager


def _traffic(stop: threading.Event) -> None:
    """What a training job writes while it runs: its status artifacts, log lines, events."""
    # lazy: prefect, after configure_prefect_env pointed it at the server
    from prefect.artifacts import create_markdown_artifact
    from prefect.events import emit_event
    from prefect.logging import get_run_logger

    logger = get_run_logger()
    i = 0
    while not stop.is_set():
        create_markdown_artifact(f"step {i}", key="bench-status")
        logger.info("step %d", i)
        emit_event("bench.step", resource={"prefect.resource.id": f"bench.{threading.get_ident()}"})
        i += 1
        time.sleep(0.05)


@contextmanager
def _traffic_threads(num: int):
    stop = threading.Event()
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(_traffic, stop), daemon=True)
               for _ in range(num)]
    for t in threads:
        t.start()
    time.sleep(1.0 if threads else 0.0)
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def _task_starts(num_tasks: int, tags: list[str], num_traffic: int) -> list[float]:
    # lazy: prefect, after configure_prefect_env pointed it at the server
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    started: list[float] = []

    @task(name="trivial", tags=tags, cache_policy=NO_CACHE)
    def trivial() -> None:
        started.append(time.monotonic())

    @flow(name="bench-task-start")
    def run() -> list[float]:
        latencies = []
        with _traffic_threads(num_traffic):
            for _ in range(num_tasks):
                t0 = time.monotonic()
                trivial()
                latencies.append(started[-1] - t0)
                time.sleep(0.2)
        return latencies

    return run()


def _slot_requests(api: str, num: int, num_traffic: int) -> tuple[Counter, list[float]]:
    """The request a tagged task run makes before its body, sent alone: status codes, latencies."""
    # lazy: prefect and httpx, after configure_prefect_env pointed it at the server
    import httpx
    from prefect import flow

    @flow(name="bench-slot-requests")
    def run() -> tuple[Counter, list[float]]:
        codes: Counter = Counter()
        latencies = []
        with _traffic_threads(num_traffic), httpx.Client(base_url=api, timeout=120) as client:
            for _ in range(num):
                t0 = time.monotonic()
                resp = client.post("/v2/concurrency_limits/increment-with-lease",
                                   json={"slots": 1, "names": ["tag:workers"], "lease_duration": 60})
                latencies.append(time.monotonic() - t0)
                codes[resp.status_code] += 1
                time.sleep(0.2)
        return codes, latencies

    return run()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--traffic", type=int, default=2, help="threads writing artifacts, logs and events")
    args = ap.parse_args()
    os.environ.setdefault("SAILOR_HOME", tempfile.mkdtemp(prefix="sailor-bench-"))
    from flows.cli.prefect_server import configure_prefect_env, start_local_server, stop_local_server

    api = start_local_server(port=0)
    os.environ["PREFECT_API_URL"] = api
    configure_prefect_env()
    try:
        print(f"load average {os.getloadavg()[0]:.1f}; {args.tasks} task runs per variant")
        for traffic in (0, args.traffic):
            for name, tags in (("tagged", ["workers"]), ("untagged", [])):
                lat = _task_starts(args.tasks, tags, traffic)
                print(f"{name:9s} traffic threads {traffic}: call -> body median {statistics.median(lat) * 1e3:7.1f} ms, "
                      f"max {max(lat) * 1e3:7.1f} ms; over 0.5 s: {sum(x > 0.5 for x in lat)} of {len(lat)}")
        codes, lat = _slot_requests(api, args.tasks, args.traffic)
        print(f"the slot request alone, traffic threads {args.traffic}: status codes {dict(sorted(codes.items()))}, "
              f"answered in median {statistics.median(lat) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms")
    finally:
        stop_local_server()


if __name__ == "__main__":
    main()
