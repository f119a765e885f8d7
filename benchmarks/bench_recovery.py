"""Recovery figures of the train-job flow on the embedded local cloud.

Runs `train_job` (tiny model) with injected preemptions against a local Prefect
server and prints, per preemption: detection-to-new-plan, new-plan-to-first-step
(provisioning + agent + worker start-up + checkpoint load), work redone (steps
between the resumed checkpoint and the furthest step reached), plus totals; and per plan, its
workers' start: rank 0's time from its agent's assignment (a handover to a parked or standby
worker, or a new process) to being ready to train, and how many ranks were handed over.

    .venv/bin/python benchmarks/bench_recovery.py [--steps 40] [--preempt-at 10,25] [--gbs 64]

Detection -> training (issue 36's chaos figure): per preemption, from the flow's watch seeing it
(its ``watch-attempt`` returning the preemption) to the first step of the first attempt after it
(the survivors', when they train on), with the flow's steps between on a timeline (each task's
start and end, relative to the detection), over ``--runs`` runs of the job (one Prefect server),
median and max; then each run's final parameters: their digest (equal before and after a change of
the recovery path: bit-identical training) and against an uninterrupted run of its last plan
(``launch_local``): bitwise or the largest difference (the plans before it summed over other DP
degrees, in another order), with that plan's step time here (a first step after a recovery takes one).
The case the issue targets, a job on three instances (DP 3 on T4s, one per zone) of which one is
preempted while the other two hold the state, with a notice long enough for the emergency save:

    .venv/bin/python benchmarks/bench_recovery.py --steps 24 --preempt-at 6,14 --gbs 1024 --max-gpus 3 \
        --zones us-central1-a,us-central1-b,us-central1-c,us-central1-f --notice-s 10 --runs 2

(a plan over several instances steps slowly on two loaded cores: with the 2 s notice its emergency
checkpoint may not finish, and the survivors then exit as for a lost peer instead of parking)

A plan mixing survivors with a new instance (a floor the survivor cannot meet alone: it trains on an
interim while the new instance boots; the line "interim ... -> attempt" times the switch):

    .venv/bin/python benchmarks/bench_recovery.py --steps 24 --preempt-at 6 --gbs 1024 --max-gpus 2 \
        --zones us-central1-a,us-central1-b,us-central1-c --min-throughput 20000 --checkpoint-every 2 --notice-s 10

Every attempt's first step is watched here alike (``_FirstSteps``: the first report of its agents with
a step of its generation, at the heartbeat the agent wrote it with), the interim's too, which the flow
does not watch. Per preemption the bench prints detection -> training (the first step of whatever
trains next: the interim on the survivors when one runs, else the next plan) and detection -> the
next plan's first step (the plan the interim waited for, with the new instance; the same attempt when
no interim runs), each median and max over the runs. ``--no-standby-wait``: the flow assigns the next
plan without waiting for the new instances' standby workers (``tasks.workers.wait_standby`` answers at
once: the flow as it was before the wait), to compare the two in the same conditions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--preempt-at", default="10,25")
    ap.add_argument("--gbs", type=int, default=64)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--max-gpus", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1, help="jobs run one after another (one Prefect server)")
    ap.add_argument("--no-compare", action="store_true", help="skip the uninterrupted reference run")
    ap.add_argument("--zones", default="", help="comma-separated zones the job may use (default: any)")
    ap.add_argument("--min-throughput", type=float, default=0.0,
                    help="the job's floor (samples/s): one the survivors cannot meet alone makes the next plan "
                         "mix them with a new instance, booted while they train on an interim")
    ap.add_argument("--notice-s", type=float, default=2.0,
                    help="the embedded cloud's preemption notice (2 s: its default; a real spot notice is 30-120 s)")
    ap.add_argument("--no-standby-wait", action="store_true",
                    help="the flow assigns the next plan without waiting for new instances' standby workers")
    args = ap.parse_args()
    os.environ.setdefault("SAILOR_HOME", tempfile.mkdtemp(prefix="sailor-bench-"))
    from flows.cli.prefect_server import configure_prefect_env, start_local_server, stop_local_server

    t0 = time.monotonic()
    api = start_local_server(port=0)
    os.environ["PREFECT_API_URL"] = api
    configure_prefect_env()
    print(f"prefect server up in {time.monotonic() - t0:.1f} s ({api}); load average {os.getloadavg()[0]:.1f}")
    figures: dict[str, list[float]] = {"training": [], "next plan": [], "flow wall": []}
    try:
        from infra.config import in_process_cloud
        from tasks import workers

        if args.no_standby_wait:
            workers.wait_standby = lambda *a, **kw: None  # the flow before its wait: assign at once
        print(f"standby wait: {'off' if args.no_standby_wait else 'on'}")

        cloud = in_process_cloud()  # the flow's own; the notice counts from the next preemption on
        cloud.notice_s = cloud.machines.notice_s = args.notice_s
        spans = _Timeline()
        spans.install()
        for run in range(1, args.runs + 1):
            print(f"--- run {run} of {args.runs} (load average {os.getloadavg()[0]:.1f})")
            for key, values in _one_run(args, spans).items():
                figures[key] += values
    finally:
        spans.steps.stop()
        stop_local_server()
    for key, what in (("training", "detection -> training (the first step of what trains next)"),
                      ("next plan", "detection -> the next plan's first step (after any interim)"),
                      ("flow wall", "the job's flow, start to end")):
        values = figures[key]
        if values:
            print(f"{what}, {len(values)} figures: median {statistics.median(values):.1f} s, max {max(values):.1f} s "
                  f"({', '.join(f'{x:.1f}' for x in values)})")


def _one_run(args, spans: _Timeline) -> dict[str, list[float]]:
    """One job with its preemptions; its detection -> training and -> next plan figures, its wall time."""
    from flows.train_job import train_job
    from sailor_core.job.state import JobStore

    spans.clear()
    t1 = time.monotonic()
    summary = train_job(model="tiny", budget_usd=0.05, steps=args.steps, global_batch_size=args.gbs,
                        checkpoint_every_steps=args.checkpoint_every, cloud="embedded", max_gpus=args.max_gpus,
                        max_gpus_per_zone=1, min_throughput_samples_per_s=args.min_throughput or None,
                        preempt_at_steps=[int(x) for x in args.preempt_at.split(",") if x],
                        **({"gpus": ("T4",), "zones": tuple(args.zones.split(",")),  # batches of 1024
                            "validation_fraction": 0.0, "validate_every_steps": 0} if args.zones else {}))
    wall = time.monotonic() - t1
    state = JobStore().load(summary["job_id"])
    print(f"status {summary['status']}, steps {summary['steps']}, final loss {summary['final_loss']:.4f}, "
          f"preemptions {summary['preemptions']}, re-plans {summary['replans']}, "
          f"spent {summary['usd_spent']:.5f} USD, instances left {summary['instances_left_running']}, "
          f"flow wall {wall:.1f} s")
    for rec in state.replans:  # every attempt, interims included: how its workers came back
        plan = rec.plan or {}
        shape = " | ".join(f"{st['layers']}:" + "+".join(f"{r['gpu']}x{r.get('tp', 1)}" for r in st["replicas"])
                           for st in plan.get("stages", []))
        print(f"  attempt {rec.attempt} from step {rec.at_step}: {shape}; {_workers_words(rec)} ({rec.reason[:60]})")
    first = state.replans[0]
    print(f"start: plan -> first step {first.first_step_unix_s - first.at_unix_s:.1f} s "
          f"(provision, agent, worker start-up)")
    figures: dict[str, list[float]] = {"training": [], "next plan": [], "flow wall": [wall]}
    for k, detected in enumerate(spans.detections(), 1):
        after = [r for r in state.replans if r.at_unix_s >= detected]
        resumed = next(((r, t) for r in after if (t := spans.steps.first_step_s(r.attempt)) is not None), None)
        final = next(((r, t) for r in after if not r.reason.startswith("interim: ")
                      and (t := spans.steps.first_step_s(r.attempt)) is not None), None)
        if resumed is None or final is None:
            print(f"preemption {k}: {'nothing' if resumed is None else 'no next plan'} trained after it")
            continue
        (rec, trained), (nxt, nxt_trained) = resumed, final
        figures["training"].append(trained - detected)
        figures["next plan"].append(nxt_trained - detected)
        print(f"preemption {k}: detection -> training {trained - detected:.1f} s (attempt {rec.attempt}"
              f"{', an interim' if rec is not nxt else ''}: -> its plan {rec.at_unix_s - detected:.1f} s, "
              f"-> its first step {trained - rec.at_unix_s:.1f} s{spans.steps.late_words(rec.attempt)}); "
              f"-> the next plan's first step {nxt_trained - detected:.1f} s (attempt {nxt.attempt}"
              f"{spans.steps.late_words(nxt.attempt)}; as the flow's watch saw it "
              f"{(nxt.first_step_unix_s or float('nan')) - detected:.1f} s), resumed from step {rec.at_step}, "
              f"redone {max(0, rec.steps_done_before - rec.at_step)} steps, state from {rec.state_from or '-'}"
              + "".join(spans.steps.inside_stop_words(r.attempt, detected) for r in after if r.attempt < rec.attempt))
        print("    " + spans.words(detected, nxt_trained, nxt))
    for k, rec in enumerate(state.replans[:-1]):  # the switch from an interim to the plan it waited for
        if rec.reason.startswith("interim: "):
            after = state.replans[k + 1]
            stop = min((s for n, s, _ in spans.spans if n == "stop_attempt" and s > rec.at_unix_s), default=None)
            if stop is not None and after.first_step_unix_s:
                print(f"interim (attempt {rec.attempt}) -> attempt {after.attempt}: trained from its plan until "
                      f"{stop - rec.at_unix_s:.1f} s; its stop -> the next plan's first step "
                      f"{after.first_step_unix_s - stop:.1f} s ({after.num_ranks_standby or 0} ranks in standby workers)")
    home = Path(os.environ["SAILOR_HOME"])  # the workers' logs: how many ranks took their state from peers
    said = Counter(m for text in _worker_logs(home) for m in _STATE_SAID if m in text)
    print(f"worker logs under {home}: " + ", ".join(f"{n} x state {m}" for m, n in sorted(said.items())))
    if not args.no_compare and state.status == "succeeded":
        print(_compare_with_uninterrupted(state, args.steps))
    return figures


def _worker_logs(home: Path):
    """The texts of the workers' logs under ``home``, skipping those of instances the embedded cloud
    removes meanwhile (``os.walk`` passes over folders that vanish; ``rglob`` raised)."""
    for folder, _, files in os.walk(home):
        for name in files:
            if name.startswith("rank") and name.endswith(".log"):
                try:
                    yield (Path(folder) / name).read_text(errors="replace")
                except FileNotFoundError:
                    pass


# The flow's steps timed on the timeline: (module, attribute) of the tasks ``flows.train_job`` calls.
_TIMED = (("tasks.workers", "watch_attempt"), ("tasks.workers", "stop_attempt"), ("tasks.workers", "assign"),
          ("tasks.cloud", "reconcile"), ("tasks.cloud", "list_offers"), ("tasks.cloud", "provision"),
          ("tasks.cloud", "launch_ahead"), ("tasks.jobs", "note_checkpoint"), ("tasks.control", "job_planner"),
          ("tasks.control", "decide_next"), ("tasks.control", "interim_plan"), ("tasks.reporting", "JobReporter.event"),
          ("flows.train_job", "_decide"), ("flows.train_job", "_noted"), ("tasks.control", "controller_decision"),
          ("sailor_core.runtime.checkpoint", "latest_valid_checkpoint"))


class _Timeline:
    """Each timed call's (name, start, end) in unix seconds; a preemption is the end of a watch
    whose outcome is one."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self._detected: list[float] = []
        self.steps = _FirstSteps()

    def clear(self) -> None:
        self.spans.clear()
        self._detected.clear()
        self.steps.clear()

    def install(self) -> None:
        import importlib

        for module, name in _TIMED:
            owner = importlib.import_module(module)
            for part in name.split(".")[:-1]:  # a class's method
                owner = getattr(owner, part)
            attr = name.split(".")[-1]
            if hasattr(owner, attr):  # (an older flow, run as "before", lacks some)
                setattr(owner, attr, self._wrap(attr, getattr(owner, attr)))

    def _wrap(self, name: str, fn):
        def timed(*a, **kw):
            t = time.time()
            if name == "assign":  # (session, state, assignments): watch the attempt's first step
                self.steps.watch(*a[:3])
            try:
                result = fn(*a, **kw)
            finally:
                self.spans.append((name, t, time.time()))
            if name == "watch_attempt" and getattr(result[0], "kind", None) == "preempted":
                self._detected.append(self.spans[-1][2])
            return result

        timed.fn = self._wrap(name, fn.fn) if hasattr(fn, "fn") else fn  # a task's body, called in place
        if hasattr(fn, "submit"):  # a task the flow runs beside others (not timed)
            timed.submit = fn.submit
        return timed

    def detections(self) -> list[float]:
        return list(self._detected)

    def words(self, detected: float, trained: float, rec) -> str:
        """The flow's steps between a detection and training, relative to the detection."""
        parts = [f"{n} {s - detected:+.1f}..{e - detected:+.1f}" for n, s, e in sorted(self.spans, key=lambda x: x[1])
                 if detected <= s < trained]
        parts.append(f"next plan recorded {rec.at_unix_s - detected:+.1f}")
        if rec.ready_s is not None:
            parts.append(f"rank 0 ready {rec.ready_s:.2f} s after its assignment")
        parts.append(f"first step {trained - detected:+.1f}")
        return "; ".join(parts)


class _FirstSteps:
    """Each attempt's first step as its agents report it: the heartbeat of the first report of the
    attempt's generation with a step (the agent writes a report as it reads a step, within its 0.2 s
    poll; this polls every 0.1 s).  The flow watches no interim attempt, so its first step, where
    training resumes after a preemption, is in none of its records; here every attempt is watched
    alike, the interim's and the next plan's."""

    POLL_S = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[str, tuple[str, ...], int]] = {}  # attempt -> (jobs URL, instances, generation)
        self._first: dict[int, tuple[float, int]] = {}  # attempt -> (unix s, steps past its first when seen)
        self._inside_stop: dict[int, tuple[float, int]] = {}  # attempt -> (its stop's end, last step): none before
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def clear(self) -> None:
        with self._lock:
            self._watched.clear()
            self._first.clear()
            self._inside_stop.clear()

    def watch(self, session, state, assignments) -> None:
        from sailor_core.job.attempts import run_generation

        with self._lock:
            self._watched[state.attempt] = (session.jobs_url, tuple(a.instance_id for a in assignments),
                                            run_generation(state.attempt))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="bench-first-steps", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def first_step_s(self, attempt: int) -> float | None:
        with self._lock:
            return self._first[attempt][0] if attempt in self._first else None

    def inside_stop_words(self, attempt: int, detected: float) -> str:
        """An attempt (an interim stopped at once) whose only steps finished inside its stop."""
        with self._lock:
            seen = self._inside_stop.get(attempt)
        return "" if seen is None else (f"; attempt {attempt} (interim) trained only inside its stop (the step in "
                                        f"flight, to step {seen[1]}; its stop ended {seen[0] - detected:+.1f} s)")

    def late_words(self, attempt: int) -> str:
        """When the first report seen was past the attempt's first step (the time is then later than it)."""
        with self._lock:
            late = self._first.get(attempt, (0.0, 0))[1]
        return f", seen {late} step{'s' if late > 1 else ''} late" if late else ""

    def _loop(self) -> None:
        from sailor_core.job.protocol import read_status

        while not self._stop.wait(self.POLL_S):
            with self._lock:
                pending = {k: v for k, v in self._watched.items() if k not in self._first and k not in self._inside_stop}
            for attempt, (jobs_url, ids, generation) in pending.items():
                for iid in ids:
                    try:
                        st = read_status(jobs_url, iid)
                    except Exception:  # a report being replaced, a store going away at the job's end
                        continue
                    if st is not None and st.generation > generation and st.previous is not None \
                            and st.previous.generation == generation and st.previous.step is not None:
                        # Its steps came inside its stop (the step in flight finished as it saved): not
                        # training resumed; the time is the stop's end, the first report after them.
                        with self._lock:
                            self._inside_stop.setdefault(attempt, (st.heartbeat_unix_s or time.time(), st.previous.step))
                        continue
                    if st is None or st.generation != generation or st.step is None:
                        continue
                    started = st.started.fields.get("step") if st.started else None
                    late = st.step - started - 1 if isinstance(started, int) else 0
                    with self._lock:
                        self._first.setdefault(attempt, (st.heartbeat_unix_s or time.time(), max(0, late)))
                    break


def _compare_with_uninterrupted(state, steps: int) -> str:
    """The job's final parameters: their digest (the same before and after a change of the recovery
    path means bit-identical training), and against an uninterrupted run of its last plan on local
    processes (the plans before it summed gradients over other DP degrees: equal to fp32 rounding)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sailor_core import settings
    from sailor_core.job.worker_args import worker_argv
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.launch import launch_local
    from tests.reliability.chaos import _final_params_diff

    digest = params_digest(state.spec.checkpoint_url, steps)
    work = Path(tempfile.mkdtemp(prefix="ref-", dir=settings.sailor_home()))
    data = settings.sailor_home() / "data" / f"synthetic-tiny-seed{state.spec.seed}.npy"
    res = launch_local(plan_from_dict(state.plan), steps, data=data, seed=state.spec.seed, workdir=work,
                       ckpt_dir=str(work / "ckpt"), ckpt_every=0, worker_args=tuple(worker_argv(state.spec)))
    if res.status != "ok":
        return f"final parameters' digest {digest}; uninterrupted run failed: {res.message}"
    diff, bitwise, why = _final_params_diff(state.spec.checkpoint_url, work / "ckpt", steps)
    step_s = statistics.median(res.step_times_s[1:] or res.step_times_s)
    return (f"final parameters' digest {digest}; against its last plan uninterrupted "
            f"({step_s:.2f} s a step): " + (why if diff is None else
            f"bitwise equal {bitwise}, max |diff| {diff:.3g}; final loss {state.last_loss!r} vs {res.losses[-1]!r}"))


def params_digest(ckpt_url: str, steps: int) -> str:
    """sha256 of the final checkpoint's parameters, tensor by tensor in name order (its first 16 hex digits)."""
    import hashlib

    from sailor_core.runtime import checkpoint as ckpt
    from sailor_core.storage import open_storage

    info = ckpt.latest_valid_checkpoint(ckpt_url)
    if info is None or info.step != steps:
        return f"- (final checkpoint {info and info.step}, want {steps})"
    storage, h = open_storage(ckpt_url), hashlib.sha256()
    for name in sorted(n for n in info.files if n.startswith("layer_")):
        params = ckpt.read_layer(storage, info, int(name[6:10]))["params"]
        for key in sorted(params):
            h.update(key.encode())
            h.update(params[key].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


_STATE_SAID = ("kept in memory", "handed over by its peers", "state read")


def _workers_words(rec) -> str:
    """A plan's workers' start, from its agents' reports (``ReplanRecord``)."""
    ready = "-" if rec.ready_s is None else f"{rec.ready_s:.2f} s"
    return (f"assignment -> rank 0 ready to train {ready}, {rec.num_ranks_rejoined or 0} of {rec.num_ranks or 0} "
            f"ranks handed over (state from {rec.state_from or '-'}), plan -> first step "
            f"{(rec.first_step_unix_s or float('nan')) - rec.at_unix_s:.1f} s")


if __name__ == "__main__":
    main()
