"""Loaded by every engine worker that ``bench_slow_links.py`` starts (it puts this folder first on
PYTHONPATH): per training step, the main thread's time on a CPU and time runnable but waiting
for one (``/proc/thread-self/schedstat``), written at exit.  Their ratio is how much longer the
step's ops took than their CPU time because other threads held the cores: what the simulator's
CPU profile must be stretched by to describe this run, measured rather than guessed from a
probe of the machine's load before it."""

import os

_OUT = os.environ.get("SAILOR_BENCH_SCHEDSTAT_DIR")

if _OUT:
    import atexit
    import json
    import time

    from sailor_core.runtime import trainer as _trainer

    _steps: list[list[float]] = []

    def _schedstat() -> tuple[int, int]:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns), int(wait_ns)

    _train_step = _trainer.StageTrainer.train_step

    def _timed_train_step(self, *args, **kwargs):
        t0, (r0, w0) = time.perf_counter(), _schedstat()
        out = _train_step(self, *args, **kwargs)
        r1, w1 = _schedstat()
        _steps.append([time.perf_counter() - t0, (r1 - r0) / 1e9, (w1 - w0) / 1e9])
        return out

    _trainer.StageTrainer.train_step = _timed_train_step

    def _write() -> None:
        rank = os.environ.get("RANK", "x")
        with open(os.path.join(_OUT, f"rank{rank}.json"), "w") as fh:
            json.dump({"rank": rank, "steps": _steps}, fh)  # [wall s, on-CPU s, runnable-waiting s]

    atexit.register(_write)
