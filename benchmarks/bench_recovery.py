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
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
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
    args = ap.parse_args()
    os.environ.setdefault("SAILOR_HOME", tempfile.mkdtemp(prefix="sailor-bench-"))
    from flows.cli.prefect_server import configure_prefect_env, start_local_server, stop_local_server

    t0 = time.monotonic()
    api = start_local_server(port=0)
    os.environ["PREFECT_API_URL"] = api
    configure_prefect_env()
    print(f"prefect server up in {time.monotonic() - t0:.1f} s ({api}); load average {os.getloadavg()[0]:.1f}")
    recoveries: list[float] = []
    try:
        from infra.config import in_process_cloud

        cloud = in_process_cloud()  # the flow's own; the notice counts from the next preemption on
        cloud.notice_s = cloud.machines.notice_s = args.notice_s
        spans = _Timeline()
        spans.install()
        for run in range(1, args.runs + 1):
            print(f"--- run {run} of {args.runs} (load average {os.getloadavg()[0]:.1f})")
            recoveries += _one_run(args, spans)
    finally:
        stop_local_server()
    if recoveries:
        print(f"detection -> training over {len(recoveries)} preemptions: median {statistics.median(recoveries):.1f} s, "
              f"max {max(recoveries):.1f} s ({', '.join(f'{x:.1f}' for x in recoveries)})")


def _one_run(args, spans: _Timeline) -> list[float]:
    """One job with its preemptions; its detection -> training figures."""
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
    recoveries = []
    for k, detected in enumerate(spans.detections(), 1):
        # each preemption's first attempt after it (an interim's, when survivors train on)
        rec = next((r for r in state.replans if r.at_unix_s >= detected and r.first_step_unix_s), None)
        if rec is None:
            print(f"preemption {k}: no attempt trained after it")
            continue
        total = rec.first_step_unix_s - detected
        recoveries.append(total)
        print(f"preemption {k}: detection -> training {total:.1f} s (-> new plan {rec.at_unix_s - detected:.1f} s, "
              f"new plan -> first step {rec.first_step_unix_s - rec.at_unix_s:.1f} s), resumed from step "
              f"{rec.at_step}, redone {max(0, rec.steps_done_before - rec.at_step)} steps, "
              f"state from {rec.state_from}")
        print("    " + spans.words(detected, rec.first_step_unix_s, rec))
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
    return recoveries


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

    def clear(self) -> None:
        self.spans.clear()
        self._detected.clear()

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
        parts.append(f"plan recorded {rec.at_unix_s - detected:+.1f}")
        if rec.ready_s is not None:
            parts.append(f"rank 0 ready {rec.ready_s:.2f} s after its assignment")
        parts.append(f"first step {trained - detected:+.1f}")
        return "; ".join(parts)


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
