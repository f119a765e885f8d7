"""Replay benchmark: the four policies on one trace with the real planner.

    .venv/bin/python benchmarks/bench_replay.py --trace derived:gcp-4d:1 --model opt-350m --tokens 2e10 \
        --out results.json --plot timeline.png [--plan-cache /tmp/sailor_replay_plans.json]
    .venv/bin/python benchmarks/bench_replay.py --trace derived:aws-3d:1 --tokens 1e9 --cold

Prints time to train, USD, cost and time ratios to ours, re-plans, restarts,
useful-work fraction, and the replay's wall time (cold: with planner calls;
warm: the same replay again with every plan cached, i.e. the replay itself).
``--objective``, ``--deadline-h``, ``--min-throughput`` and ``--on-demand-gpus`` are the job's
terms (``JobTerms``).  ``--compare`` also replays ours cheapest, by deadlines and on each other
policy's time and spend (``replay.compare``), prints the equal-terms comparison and ours' Pareto
front, and with ``--pareto FILE`` draws it.
``--cold`` replays once with no plan cache on disk (what a user's first replay
costs) and prints wall and CPU seconds (this process plus the planner's worker
processes), the planner's share, and its calls by the number of GPU types and
pools they were asked about.  ``--workers N`` sets the worker processes that
search ahead (default: one per idle CPU up to 8, none if fewer than two are idle; 0: none).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import resource
import statistics
import time

from sailor_core.replay import POLICIES, run_policies
from sailor_core.replay.plot import plot_points, plot_timeline
from sailor_core.replay.run import REPLAY_SEARCH
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import load_trace


def _spec(args, policies, **settings) -> ReplaySpec:
    """The replay's settings from the command line (the budget applies to every run)."""
    return ReplaySpec(trace=args.trace, model=args.model, tokens=args.tokens, policy=",".join(policies),
                      budget_usd=args.budget_usd, standby_workers=not args.no_standby_workers,
                      handover=not args.no_handover, **settings)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--model", default="opt-350m")
    ap.add_argument("--tokens", type=float, required=True)
    ap.add_argument("--budget-usd", type=float, default=None)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--plan-cache", default="/tmp/sailor_replay_plans.json")
    ap.add_argument("--max-evaluations", type=int, default=None,
                    help="planner search budget (default: the replay's 200; `sailor plan` uses 4000)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--cold", action="store_true",
                    help="one replay with no plan cache on disk; print where its time goes")
    ap.add_argument("--probe-micro-batches", action="store_true",
                    help="with --cold: search only the micro-batch sizes the trace's GPU types use")
    ap.add_argument("--workers", type=int, default=None,
                    help="planner worker processes that search ahead (default: one per idle CPU up to 8, none if fewer than two; 0: none)")
    ap.add_argument("--virtual-workers", default=None,
                    help="with --cold --workers 0: also estimate the wall time with N free CPUs (comma list), "
                         "replaying with the prefetcher's own guesses on a virtual clock (see virtual_workers)")
    ap.add_argument("--objective", default="throughput", help="the job's objective: throughput or cost")
    ap.add_argument("--deadline-h", type=float, default=None, help="finish within this many hours of the start")
    ap.add_argument("--min-throughput", type=float, default=None, help="throughput floor (samples/s)")
    ap.add_argument("--on-demand-gpus", type=int, default=0, help="on-demand GPUs per pool besides spot")
    ap.add_argument("--no-standby-workers", action="store_true",
                    help="new instances' workers start once the VM runs (the start-up after the provisioning)")
    ap.add_argument("--no-handover", action="store_true",
                    help="every change reloads the checkpoint from storage (no state handed over in memory)")
    ap.add_argument("--compare", action="store_true",
                    help="ours over objectives and deadlines, and at equal terms with the other policies")
    ap.add_argument("--pareto", default=None, help="with --compare: the (time, cost) chart")
    ap.add_argument("--vs-all-micro-batches", action="store_true",
                    help="with --cold --probe-micro-batches: replay again searching every micro-batch size; "
                         "print its time and how far each policy's time to train and USD move")
    args = ap.parse_args()

    trace = load_trace(args.trace)
    policies = args.policies.split(",")
    knobs = dataclasses.replace(REPLAY_SEARCH, max_evaluations=args.max_evaluations) if args.max_evaluations else None
    if args.compare:
        return compare_report(args, trace, policies, knobs)
    if args.cold:
        return cold_report(args, trace, policies, knobs)
    t0 = time.perf_counter()
    job = _spec(args, policies, plan_cache=args.plan_cache, objective=args.objective, deadline_h=args.deadline_h,
                min_throughput_samples_per_s=args.min_throughput, on_demand_gpus=args.on_demand_gpus)
    cold = run_policies(trace, dataclasses.replace(job, workers=args.workers), search=knobs)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = run_policies(trace, job, search=knobs)
    warm_s = time.perf_counter() - t0
    out = cold.to_dict()
    out.update(max_evaluations=args.max_evaluations or 200, trace_arg=args.trace, model=args.model, tokens=args.tokens, trace_rows=trace.num_rows,
               trace_hours=trace.duration_s / 3600, num_trace_preemptions=len(trace.preemptions),
               wall_cold_s=cold_s, wall_warm_s=warm_s, warm_planner_calls=warm.planner_calls)
    for k, v in cold.results.items():  # same decisions from cached plans (sums may differ in the last bits)
        assert abs(warm.results[k].usd_spent - v.usd_spent) <= 1e-6 * max(1.0, v.usd_spent), k
    print(f"{args.trace}: {trace.num_rows} rows, {trace.duration_s / 3600:.1f} h, "
          f"{len(trace.preemptions)} preemption events; model {args.model}, {args.tokens:.3g} tokens; "
          f"single-type GPU {cold.single_gpu_type}")
    print(f"{'policy':12} {'done':>5} {'time h':>8} {'USD':>9} {'cost/ours':>9} {'time/ours':>9} "
          f"{'useful':>7} {'replans':>7} {'restarts':>8} {'wait h':>7}")
    for name, r in out["policies"].items():
        t = r["time_to_train_s"]
        print(f"{name:12} {'yes' if r['finished'] else 'no':>5} {t / 3600 if t else float('nan'):8.2f} "
              f"{r['usd_spent']:9.2f} {r.get('cost_ratio_to_ours') or 1.0:9.2f} "
              f"{(r.get('time_ratio_to_ours') or (1.0 if name == 'ours' else float('nan'))):9.2f} "
              f"{r['useful_work_fraction']:7.2f} {r['num_replans']:7d} {r['num_restarts']:8d} {r['wait_s'] / 3600:7.2f}")
    print(f"wall: cold {cold_s:.1f} s ({cold.planner_calls} planner calls, {cold.planner_time_s:.1f} s in them); "
          f"warm {warm_s:.2f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        plot_timeline(cold.results, args.plot, trace=trace, title=f"{args.model}, {args.tokens:.3g} tokens, {args.trace}")


class _VirtualJob:
    """A search in a virtual worker pool: started in order of submission when a worker is free."""

    def __init__(self, pool, duration_s, result):
        self.pool, self.duration_s, self._result = pool, duration_s, result
        self.submit_s, self.start_s, self.is_cancelled = pool.now(), None, False

    def cancel(self):
        with self.pool.lock:
            self.pool.advance(self.pool.now())
            if self.start_s is None and not self.is_cancelled:
                self.is_cancelled = True
                self.pool.pending.remove(self)
            return self.is_cancelled

    def cancelled(self):
        return self.is_cancelled

    def done(self):
        with self.pool.lock:
            self.pool.advance(self.pool.now())
            return self.is_cancelled or (self.start_s is not None and self.start_s + self.duration_s <= self.pool.now())

    def exception(self):
        return None

    def result(self):
        with self.pool.lock:
            self.pool.advance(self.pool.now(), until=self)
            self.pool.set_now(max(self.pool.now(), self.start_s + self.duration_s))
            return self._result


class _VirtualPool:
    """Worker processes on a virtual clock.  The replay's thread keeps ``clock[0]``; a policy
    replayed ahead in a thread of its own (a shadow) keeps its own clock, which starts where
    the replay's was.  The threads run for real, so the order in which they submit (and the
    estimate) can vary a little from run to run."""

    def __init__(self, workers, clock, run):
        import threading

        self.free_at, self.clock, self.run, self.pending = [0.0] * workers, clock, run, []
        self.lock, self.main, self.clocks = threading.RLock(), threading.get_ident(), {}
        self._ident = threading.get_ident

    def now(self):
        tid = self._ident()
        return self.clock[0] if tid == self.main else self.clocks.setdefault(tid, self.clock[0])

    def set_now(self, t):
        if self._ident() == self.main:
            self.clock[0] = t
        else:
            self.clocks[self._ident()] = t

    def submit(self, fn, *args):
        with self.lock:
            job = _VirtualJob(self, *self.run(fn, args))
            self.pending.append(job)
            self.pending.sort(key=lambda j: j.submit_s)
            return job

    def advance(self, now_s, until=None):
        """Start queued jobs in order while a worker is free by ``now_s`` (or until ``until`` started)."""
        while self.pending:
            w = min(range(len(self.free_at)), key=self.free_at.__getitem__)
            job = self.pending[0]
            start = max(job.submit_s, self.free_at[w])
            if until is None and start > now_s or until is not None and until.start_s is not None:
                return
            job.start_s = start
            self.free_at[w] = start + job.duration_s
            self.pending.pop(0)

    def shutdown(self, **_kw):
        pass


@contextlib.contextmanager
def _recording_searches():
    """Within: every search of run_policies(workers=0) is recorded, answer and seconds."""
    import sailor_core.replay.run as rr

    answers, seconds = {}, {}
    real_factory = rr.planner_plan_fn

    def recording(*args, **kw):
        fn = real_factory(*args, **kw)

        def plan(avail):
            t0 = time.perf_counter()
            out = tuple(fn(avail))
            seconds[frozenset(avail.items())] = time.perf_counter() - t0
            answers[frozenset(avail.items())] = out
            return out
        return plan

    rr.planner_plan_fn = recording
    try:
        yield answers, seconds
    finally:
        rr.planner_plan_fn = real_factory


def virtual_workers(args, trace, policies, knobs, counts, base, base_wall_s, answers, seconds) -> dict[int, dict]:
    """Estimated wall time of a cold replay with N worker processes on N free CPUs.

    The cold replay ``base`` (one process, ``workers=0``) recorded every planner answer and
    how long its search took.  The replay runs again with ``workers=N`` and the real
    prefetcher (its own guesses, queue and cancellations), but each search, in a worker or
    here, takes the recorded seconds on a virtual clock instead of running.  The estimate
    leaves out what more processes cost (each worker warms its own planner memos; shared
    caches) and adds the rest of the replay as measured.
    """
    import sailor_core.replay.prefetch as pf

    rest_s = base_wall_s - base.planner_time_s
    fallback_s = statistics.median(seconds.values())
    out = {}
    for n in counts:
        clock = [0.0]

        def lookup(avail, clock=clock, charge=True):
            key = frozenset(avail.items())
            if charge:
                clock[0] += seconds.get(key, fallback_s)
            return answers.get(key, ())

        def run(fn, fn_args):
            assert fn is pf._worker_plan
            key = frozenset(fn_args[0])
            return seconds.get(key, fallback_s), (answers.get(key, ()), 0.0)

        pool = _VirtualPool(n, clock, run)
        saved = pf.planner_plan_fn, pf.PrefetchingPlanner._executor
        pf.planner_plan_fn = lambda *_a, **_kw: lookup
        pf.PrefetchingPlanner._executor = lambda self: pool
        try:
            suite = run_policies(trace, _spec(args, policies, workers=n), search=knobs)
        finally:
            pf.planner_plan_fn, pf.PrefetchingPlanner._executor = saved
        same = all((suite.results[p].usd_spent, suite.results[p].time_to_train_s)
                   == (r.usd_spent, r.time_to_train_s) for p, r in base.results.items())
        st = suite.prefetch
        out[n] = {"wall_s": clock[0] + rest_s, "planning_s": clock[0], "searched_ahead": st.num_searched_ahead, "unused": st.num_unused,
                  "from_workers": st.num_from_workers, "in_process": st.num_in_process, "same_results": same}
        print(f"  {n} workers (virtual): wall ~{clock[0] + rest_s:.2f} s ({clock[0]:.2f} s waiting for or running "
              f"searches + {rest_s:.2f} s the rest); {st.num_from_workers} of {st.num_asked} searches from workers, "
              f"{st.num_unused} wasted; results {'same' if same else 'DIFFERENT'}")
    return out


def compare_report(args, trace, policies, knobs) -> None:
    """``--compare``: every policy fastest, ours cheapest and by deadlines, and at equal terms."""
    from sailor_core.replay.compare import compare_policies, summary_lines

    t0 = time.perf_counter()
    c = compare_policies(trace, _spec(args, policies, on_demand_gpus=args.on_demand_gpus, plan_cache=args.plan_cache,
                                      workers=args.workers), search=knobs,
                         progress=lambda text: print(f"  replaying {text} ({time.perf_counter() - t0:.0f} s)",
                                                     flush=True))
    wall_s = time.perf_counter() - t0
    print(f"{args.trace}: {trace.num_rows} rows, {trace.duration_s / 3600:.1f} h, {len(trace.preemptions)} "
          f"preemption events; model {args.model}, {args.tokens:.3g} tokens; on-demand GPUs per pool "
          f"{args.on_demand_gpus}; single-type GPU {c.suite.single_gpu_type}")
    print(f"{'policy':12} {'terms':44} {'done':>5} {'time h':>8} {'USD':>9} {'useful':>7} {'replans':>7}")
    for p in c.points:
        print(f"{p.policy:12} {p.terms:44} {'yes' if p.finished else 'no':>5} "
              f"{p.time_h if p.time_h is not None else float('nan'):8.2f} {p.usd:9.2f} "
              f"{p.useful_work_fraction:7.2f} {p.num_replans:7d}")
    print("ours' Pareto front: " + "; ".join(f"{p.terms}: {p.time_h:.2f} h, {p.usd:.2f} USD" for p in c.front))
    for line in summary_lines(c):
        print("  " + line)
    print(f"wall {wall_s:.1f} s")
    out = c.suite.to_dict()
    out.update(comparison=c.to_dict(), summary=summary_lines(c), trace_arg=args.trace, model=args.model,
               tokens=args.tokens, on_demand_gpus=args.on_demand_gpus, wall_s=wall_s, trace_rows=trace.num_rows,
               trace_hours=trace.duration_s / 3600, num_trace_preemptions=len(trace.preemptions),
               max_evaluations=args.max_evaluations or 200)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    if args.pareto:
        plot_points(c, args.pareto, title=f"{args.model}, {args.tokens:.3g} tokens, {args.trace.split('/')[-1]}"
                    + (f", on demand {args.on_demand_gpus}/pool" if args.on_demand_gpus else ""))


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the planner's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cold_report(args, trace, policies, knobs) -> None:
    if args.virtual_workers and (args.workers != 0 or args.probe_micro_batches):
        raise SystemExit("--virtual-workers needs --workers 0 (it records one process's searches) and no probe")
    with _recording_searches() if args.virtual_workers else contextlib.nullcontext(({}, {})) as (answers, seconds):
        t0, c0, own0 = time.perf_counter(), _cpu_s(), time.process_time()
        suite = run_policies(trace, _spec(args, policies, workers=args.workers), search=knobs,
                             probe_micro_batches=args.probe_micro_batches)
        wall_s, cpu_s, own_cpu_s = time.perf_counter() - t0, _cpu_s() - c0, time.process_time() - own0
    calls = suite.planner_call_log
    print(f"{args.trace}: {trace.num_rows} rows, {trace.duration_s / 3600:.1f} h, "
          f"{len(trace.preemptions)} preemption events; model {args.model}, {args.tokens:.3g} tokens; cold, no plan cache")
    for name, r in suite.results.items():
        t = r.time_to_train_s
        print(f"  {name:12} {'done' if r.finished else 'not done':8} {t / 3600 if t else float('nan'):7.3f} h "
              f"{r.usd_spent:9.2f} USD  {r.num_replans:4d} re-plans  {r.planner_calls:4d} planner calls")
    print(f"wall {wall_s:.2f} s, CPU {cpu_s:.2f} s (this process {own_cpu_s:.2f} s); {len(calls)} planner calls, "
          f"waited {suite.planner_time_s:.2f} s for them, the rest {wall_s - suite.planner_time_s:.2f} s; "
          f"micro-batch sizes searched {suite.micro_batch_sizes or 'all'}")
    pf = suite.prefetch
    if pf is not None:
        print(f"  workers {args.workers if args.workers is not None else 'one per idle CPU'}: {pf.num_from_workers} of "
              f"{pf.num_asked} searches answered by a worker, {pf.num_in_process} here; {pf.num_searched_ahead} searched "
              f"ahead ({pf.num_unused} wasted, {pf.worker_cpu_s:.2f} s worker CPU); "
              f"waited {pf.wait_s:.2f} s for workers")
    groups: dict[tuple[int, int], list[float]] = {}
    for c in calls:
        groups.setdefault((c.num_gpu_types, len(c.available)), []).append(c.seconds)
    print(f"  {'GPU types':>9} {'pools':>5} {'calls':>5} {'total s':>8} {'median s':>8} {'max s':>7}")
    for (types, pools), secs in sorted(groups.items()):
        print(f"  {types:9d} {pools:5d} {len(secs):5d} {sum(secs):8.2f} {statistics.median(secs):8.3f} {max(secs):7.3f}")
    out = suite.to_dict()
    if args.virtual_workers:
        out["virtual_workers"] = virtual_workers(args, trace, policies, knobs,
                                                 [int(n) for n in args.virtual_workers.split(",")],
                                                 suite, wall_s, answers, seconds)
    if args.vs_all_micro_batches:
        t0, c0 = time.perf_counter(), _cpu_s()
        full = run_policies(trace, _spec(args, policies, workers=args.workers), search=knobs)
        full_wall_s, full_cpu_s = time.perf_counter() - t0, _cpu_s() - c0
        print(f"every micro-batch size: wall {full_wall_s:.2f} s, CPU {full_cpu_s:.2f} s, "
              f"{full.planner_calls} planner calls {full.planner_time_s:.2f} s")
        drift = {}
        for name, r in suite.results.items():
            f = full.results[name]
            d_time = (r.time_to_train_s / f.time_to_train_s - 1) if r.time_to_train_s and f.time_to_train_s else None
            d_usd = r.usd_spent / f.usd_spent - 1 if f.usd_spent else None
            drift[name] = {"time_to_train": d_time, "usd": d_usd, "same_finish": r.finished == f.finished}
            print(f"  {name:12} time to train {'-' if d_time is None else f'{d_time * 100:+.2f} %':>9}  "
                  f"USD {'-' if d_usd is None else f'{d_usd * 100:+.2f} %':>9}  "
                  f"{'same' if r.finished == f.finished else 'DIFFERENT'} finish")
        out.update(all_micro_batches={"wall_s": full_wall_s, "cpu_s": full_cpu_s, "planner_calls": full.planner_calls,
                                      "drift": drift})
    out.update(trace_arg=args.trace, model=args.model, tokens=args.tokens, cold=True, wall_cold_s=wall_s,
               cpu_cold_s=cpu_s, cpu_cold_this_process_s=own_cpu_s, workers=args.workers, max_evaluations=(knobs or REPLAY_SEARCH).max_evaluations,
               calls_by_shape=[{"gpu_types": t, "pools": p, "calls": len(v), "total_s": sum(v)}
                               for (t, p), v in sorted(groups.items())])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
