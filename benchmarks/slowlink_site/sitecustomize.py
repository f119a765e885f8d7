"""Loaded by every engine worker that ``bench_slow_links.py`` starts (it puts this folder first on
PYTHONPATH): per training step, the main thread's time on a CPU and time runnable but waiting
for one (``/proc/thread-self/schedstat``), written at exit.  Their ratio is how much longer the
step's ops took than their CPU time because other threads held the cores: what the simulator's
CPU profile must be stretched by to describe this run, measured rather than guessed from a
probe of the machine's load before it.  Also, per receive, how long after its arrival over the
slow link the real transport delivered it."""

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

    # How late the real transport delivered beyond the slow link's arrival time: the shim can
    # only add to gloo's own delivery, whose threads wait for a core too on a loaded machine.
    from sailor_core.runtime import links as _links

    _late: list[float] = []
    _wait = _links._Received.wait

    def _timed_wait(self) -> None:
        if self.done:
            return
        free_before = _links._link_free.get(self.key, 0.0)
        _wait(self)
        nbytes = self.tensor.numel() * self.tensor.element_size()
        start = max(float(self.stamp), self.posted, free_before)
        arrival = start + self.link.wire_s(nbytes) + self.link.latency_s
        _late.append(max(0.0, time.time() - arrival))

    _links._Received.wait = _timed_wait

    def _write() -> None:
        rank = os.environ.get("RANK", "x")
        with open(os.path.join(_OUT, f"rank{rank}.json"), "w") as fh:
            # steps: [wall s, on-CPU s, runnable-waiting s]; late: s past each receive's arrival
            json.dump({"rank": rank, "steps": _steps, "late": _late}, fh)

    atexit.register(_write)
