"""Golden outputs of the planner, the simulator, the memory model and the replay, recorded from
the code before the redesign and compared bit for bit afterwards.

    .venv/bin/python benchmarks/golden.py record           # (re)write tests/golden/data/*.json.gz
    .venv/bin/python benchmarks/golden.py record --group replay   # only that group's file
    .venv/bin/python benchmarks/golden.py check            # recompute everything, compare exactly
    .venv/bin/python benchmarks/golden.py check --quick    # the subset tests/golden runs by default
    .venv/bin/python benchmarks/golden.py check --group planner --group simulate

Groups (one gzip JSON file each under ``tests/golden/data``):

* ``planner``: ``plan_job`` on every scenario of ``bench_planner.scenarios()`` for opt-350m and
  gpt-neo-2.7b, requested as ``bench_planner.speed()`` does: every ranked plan (plan-file dict,
  the candidate's figures and its full ``SimResult``), the Pareto front, ``num_evaluated``,
  ``exhausted``, ``num_disagreements``, or the InfeasibleError's message.
* ``optimality``: ``bench_planner.optimality_cases()`` (the 20 cases of ``optimality``): the
  planner's answer as above, and ``enumerate_best``'s best plan, its figures and ``num_plans``.
* ``simulate``: ``simulate()`` on the example plans, hand-written plans (uneven stages, mixed GPU
  types and TP degrees in a stage, several zones, on-demand prices, replica counts that differ
  per stage, a plan that does not fit) and every best plan of ``planner`` and ``optimality``:
  the whole ``SimResult.to_dict()``.  ``check`` simulates the plans stored in the golden file,
  so a planner difference shows in ``planner``/``optimality`` only.
* ``memory``: ``stage_memory_for`` (what ``sailor memory`` prints) on a few stages.
* ``replay``: ``run_policies`` (``workers=0``: one process) on ``derived:gcp-4d:1`` with opt-350m
  and 5e9 tokens (the README's example, all four policies) and on a small synthetic trace made
  with ``build_trace`` (without and with a budget): every ``ReplayResult`` field (timeline and
  decisions included) and the suite's fields, the planner call log without its seconds.

``check --quick`` (about 50 s on the loaded 2-core VM; the full check about 4 min, most of it
the replays, which plan cold) recomputes 6 of the planner scenarios, 2 of the optimality cases,
the synthetic replay with a budget, and everything of the other groups.

Determinism: the planner's budgets count evaluations, never time, and the replay's random draws
are seeded; ``check`` gave the same results under different PYTHONHASHSEED values, with the
scenarios in reverse order, and in a pytest process whose planner memos were warmed by other
tests.  ``record`` twice writes byte-identical files (gzip without a time stamp).

Left out because they measure wall-clock time: ``PlanResult.search_time_s``, ``ReplaySuite.wall_s``
and ``planner_time_s``, ``PlannerCall.seconds``.  Nothing else is left out.

Floats are stored as JSON numbers (Python writes their shortest round-tripping repr, so reading
them back gives the same double) and compared by ``float.hex()``: bit for bit, so -0.0 differs
from 0.0 and NaN equals NaN; an int never equals a float.

Everything this file calls in the code under test goes through ``_api()`` (module paths move in
the redesign: that function is the one place to change).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "tests" / "golden" / "data"
FORMAT = 1


# ---- the code under test: every import and every read of its result objects --------------------


def _api() -> SimpleNamespace:
    """The entry points golden.py uses, and the adapters that turn their results into plain dicts.
    The redesign moves modules: change the imports here (and only here)."""
    for p in (str(ROOT), str(ROOT / "benchmarks")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import bench_planner
    from sailor_core.errors import InfeasibleError
    from sailor_core.network.model import default_network
    from sailor_core.plan.types import Plan, Replica, Stage, load_plan, plan_from_dict
    from sailor_core.planner import make_request, plan_job
    from sailor_core.planner.exhaustive import enumerate_best
    from sailor_core.profiles import default_profile_db
    from sailor_core.replay import run_policies
    from sailor_core.specs.replay import ReplaySpec
    from sailor_core.simulator import simulate, stage_memory_for
    from sailor_core.traces import PreemptionEvent, build_trace, load_trace

    def plan_result(res) -> dict:
        """A PlanResult, less its search time (``to_dict`` plus each candidate's full SimResult)."""
        out = res.to_dict()
        del out["search_time_s"]
        for row, cand in zip(out["plans"], res.candidates):
            row["sim"] = cand.sim.to_dict()
        return out

    def exhaustive_result(ex, request) -> dict:
        """enumerate_best's answer: its best (as a plan-file dict, built as Searcher.to_plan does,
        with the evaluator's figures) and how many plans it enumerated."""
        best = None
        if ex.best is not None:
            ev = ex.best
            plan = Plan(
                model=request.model, global_batch_size=request.global_batch_size, micro_batch_size=ev.mbs,
                stages=tuple(
                    Stage(layer_start=s.layer_start, layer_end=s.layer_end, replicas=tuple(
                        Replica(gpu=k.gpu, tp_degree=k.tp_degree, zone=z) for k, z, n in s.groups for _ in range(n)))
                    for s in ev.stages),
                seq_len=request.seq_len, regime=request.regime,
            )
            r = ev.res
            best = {
                "plan": plan.to_dict(), "score": ev.score, "feasible": ev.feasible, "num_gpus": ev.num_gpus,
                "figures": {
                    "iteration_time_s": r.iteration_time_s,
                    "throughput_samples_per_s": r.throughput_samples_per_s,
                    "usd_per_iteration": r.usd_per_iteration, "usd_per_hour": r.usd_per_hour,
                    "peak_memory_bytes": r.peak_memory_bytes, "fits": r.fits,
                    "busy_s": list(r.busy_s), "compute_s": list(r.compute_s),
                },
            }
        return {"best": best, "num_plans": ex.num_plans}

    def replay_suite(suite) -> dict:
        """A ReplaySuite, less its wall-clock fields."""
        out = {
            "single_gpu_type": suite.single_gpu_type, "samples_target": suite.samples_target,
            "planner_calls": suite.planner_calls, "trace_source": suite.trace_source,
            "trace_notes": list(suite.trace_notes),
            "micro_batch_sizes": list(suite.micro_batch_sizes) if suite.micro_batch_sizes else None,
            "prefetch": None if suite.prefetch is None else repr(suite.prefetch),
            "planner_call_log": [
                {"available": _pools(c.available), "num_options": c.num_options} for c in suite.planner_call_log
            ],
            "policies": {},
        }
        for name, r in suite.results.items():
            row = r.to_dict(with_timeline=True)
            out["policies"][name] = row
        out["policy_order"] = list(suite.results)
        return out

    return SimpleNamespace(
        bench_planner=bench_planner, ReplaySpec=ReplaySpec, InfeasibleError=InfeasibleError, default_network=default_network,
        default_profile_db=default_profile_db, make_request=make_request, plan_job=plan_job,
        enumerate_best=enumerate_best, load_plan=load_plan, plan_from_dict=plan_from_dict,
        simulate=simulate, stage_memory_for=stage_memory_for, run_policies=run_policies,
        load_trace=load_trace, build_trace=build_trace, PreemptionEvent=PreemptionEvent,
        plan_result=plan_result, exhaustive_result=exhaustive_result, replay_suite=replay_suite,
    )


# ---- helpers ------------------------------------------------------------------------------------


def _pools(available) -> list:
    """An availability {(gpu, zone): n} as a sorted list of [gpu, zone, n]."""
    return [[g, z, n] for (g, z), n in sorted(available.items())]


def _error(exc: BaseException) -> dict:
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}


def _canon(obj: Any) -> Any:
    """JSON's view of ``obj`` (tuples become lists), as stored: what both sides compare."""
    return json.loads(json.dumps(obj, sort_keys=True, allow_nan=True))


class _Ctx:
    """Loaded once per process: the profile database and the network model."""

    def __init__(self) -> None:
        self.api = _api()
        self.db = self.api.default_profile_db()
        self.net = self.api.default_network()


# ---- group: planner -----------------------------------------------------------------------------

PLANNER_MODELS = ("opt-350m", "gpt-neo-2.7b")
QUICK_PLANNER = (
    "opt-350m | homogeneous row 1",
    "opt-350m | heterogeneous row 0",
    "opt-350m | 2 zones A100+V100, cost cap",
    "gpt-neo-2.7b | geo 5 zones row 0",
    "gpt-neo-2.7b | 2 zones A100+V100, floor",
    "opt-350m | 3 types x 256, 3 zones",
)


def _planner_requests(ctx: _Ctx) -> list[tuple[str, dict]]:
    """(name, make_request kwargs) for every scenario, built as bench_planner.speed() does."""
    bp = ctx.api.bench_planner
    out = []
    for model in PLANNER_MODELS:
        gbs = bp._gbs(model)
        for label, avail, extra in bp.scenarios():
            kw = dict(extra)
            floor = kw.pop("floor_it_s", None)
            if floor is not None:
                kw["min_throughput_samples_per_s"] = floor * gbs
            out.append((f"{model} | {label}", dict(model=model, availability=avail, global_batch_size=gbs, **kw)))
    return out


def _describe_request(kw: dict) -> dict:
    return {k: (_pools(v) if k == "availability" else v) for k, v in sorted(kw.items())}


def _plan(ctx: _Ctx, req) -> dict:
    try:
        res = ctx.api.plan_job(req, profiles=ctx.db, network=ctx.net)
    except ctx.api.InfeasibleError as exc:
        return _error(exc)
    return ctx.api.plan_result(res)


def group_planner(ctx: _Ctx, only: Callable[[str], bool], golden: dict | None) -> dict:
    out = {}
    for name, kw in _planner_requests(ctx):
        if only(name):
            out[name] = {"request": _describe_request(kw), "result": _plan(ctx, ctx.api.make_request(**kw))}
    return out


# ---- group: optimality --------------------------------------------------------------------------

QUICK_OPTIMALITY = ("case 04", "case 10")
# The replays plan cold (each a few hundred planner searches): the default run replays one.
QUICK_REPLAY = "synthetic 3 types x 5 pools, 10 h, opt-350m 3e9 tokens, budget 60 USD"


def group_optimality(ctx: _Ctx, only: Callable[[str], bool], golden: dict | None) -> dict:
    out = {}
    for i, kw in enumerate(ctx.api.bench_planner.optimality_cases(20, 1)):
        name = f"case {i:02d}"
        if not only(name):
            continue
        req = ctx.api.make_request(**kw)
        # The order of bench_planner.optimality(): the enumeration first, then the planner.
        exact = ctx.api.enumerate_best(req, profiles=ctx.db, network=ctx.net)
        out[name] = {"request": _describe_request(kw), "exhaustive": ctx.api.exhaustive_result(exact, req),
                     "result": _plan(ctx, req)}
    return out


# ---- group: simulate ----------------------------------------------------------------------------


def _rep(gpu: str, tp: int, zone: str, n: int = 1) -> list[dict]:
    return [{"gpu": gpu, "tp": tp, "zone": zone}] * n


A, V, A80, C = "A100-40", "V100-16", "A100-80", "us-central1-"

# (name, plan-file dict, spot)
HAND_PLANS: list[tuple[str, dict, bool]] = [
    ("uneven stages", {
        "model": "opt-350m", "global_batch_size": 256, "micro_batch_size": 2, "stages": [
            {"layers": [0, 5], "replicas": _rep(A, 1, C + "a", 2)},
            {"layers": [5, 17], "replicas": _rep(A, 1, C + "a", 2)},
            {"layers": [17, 26], "replicas": _rep(A, 1, C + "a", 2)}]}, True),
    ("mixed GPU types in a stage", {
        "model": "opt-350m", "global_batch_size": 512, "micro_batch_size": 1, "stages": [
            {"layers": [0, 8], "replicas": _rep(A, 1, C + "a") + _rep(V, 1, C + "a") + _rep(A80, 1, C + "a")},
            {"layers": [8, 26], "replicas": _rep(V, 2, C + "a", 2)}]}, True),
    ("mixed TP in a stage", {
        "model": "gpt-neo-2.7b", "global_batch_size": 128, "micro_batch_size": 1, "stages": [
            {"layers": [0, 17], "replicas": _rep(A80, 1, C + "b") + _rep(A80, 2, C + "b") + _rep(A80, 4, C + "b")},
            {"layers": [17, 34], "replicas": _rep(A80, 2, C + "b", 2)}]}, True),
    ("several zones (cross-zone egress)", {
        "model": "opt-350m", "global_batch_size": 1024, "micro_batch_size": 2, "stages": [
            {"layers": [0, 9], "replicas": _rep(A, 1, C + "a", 2) + _rep(A, 1, C + "b", 2)},
            {"layers": [9, 18], "replicas": _rep(A, 2, "us-west1-b", 2)},
            {"layers": [18, 26], "replicas": _rep(V, 2, "us-east1-b") + _rep(V, 2, "europe-west4-a")}]}, True),
    ("on-demand prices (spot=False)", {
        "model": "opt-350m", "global_batch_size": 1024, "micro_batch_size": 2, "stages": [
            {"layers": [0, 14], "replicas": _rep(A, 2, C + "a") + _rep(V, 4, C + "a")},
            {"layers": [14, 26], "replicas": _rep(A, 1, C + "b", 2)}]}, False),
    ("several zones, on-demand", {
        "model": "gpt-neo-2.7b", "global_batch_size": 256, "micro_batch_size": 2, "stages": [
            {"layers": [0, 12], "replicas": _rep(A80, 1, C + "a", 3)},
            {"layers": [12, 34], "replicas": _rep(A80, 2, "us-west1-b", 2) + _rep(A, 4, "us-west1-b")}]}, False),
    ("replica counts 1, 3, 5 (micro-batches not divisible)", {
        "model": "opt-350m", "global_batch_size": 240, "micro_batch_size": 1, "stages": [
            {"layers": [0, 6], "replicas": _rep(A, 1, C + "a")},
            {"layers": [6, 16], "replicas": _rep(A, 1, C + "a", 3)},
            {"layers": [16, 26], "replicas": _rep(V, 1, C + "a", 4) + _rep(A, 1, C + "a")}]}, True),
    ("does not fit memory", {
        "model": "gpt-neo-2.7b", "global_batch_size": 64, "micro_batch_size": 8, "stages": [
            {"layers": [0, 34], "replicas": _rep("T4", 1, C + "a", 2)}]}, True),
    ("seq_len and regime set", {
        "model": "opt-350m", "global_batch_size": 128, "micro_batch_size": 4, "seq_len": 1024,
        "regime": "torch-fp32-adamw", "stages": [
            {"layers": [0, 10], "replicas": _rep(A, 1, C + "a", 2)},
            {"layers": [10, 26], "replicas": _rep(A80, 1, C + "a") + _rep("L4", 2, C + "a")}]}, True),
    ("eight stages, one GPU each", {
        "model": "gpt-neo-2.7b", "global_batch_size": 64, "micro_batch_size": 1, "stages": [
            {"layers": [4 * i + min(i, 2), 4 * (i + 1) + min(i + 1, 2)], "replicas": _rep(A, 1, C + "a")}
            for i in range(8)]}, True),
]
EXAMPLE_PLANS = ("plan_opt350m.json", "plan_tiny.json")


def _simulate(ctx: _Ctx, plan_dict: dict, spot: bool) -> dict:
    try:
        plan = ctx.api.plan_from_dict(plan_dict)
        return ctx.api.simulate(plan, profiles=ctx.db, network=ctx.net, spot=spot).to_dict()
    except Exception as exc:  # noqa: BLE001 - an error is an outcome too
        return _error(exc)


def _best_plans(planner: dict, optimality: dict) -> list[tuple[str, dict]]:
    out = []
    for name, e in planner.items():
        if "plans" in e["result"]:
            out.append((f"best of planner {name}", e["result"]["plans"][0]["plan"]))
    for name, e in optimality.items():
        if "plans" in e["result"]:
            out.append((f"best of optimality {name} planner", e["result"]["plans"][0]["plan"]))
        if e["exhaustive"]["best"] is not None:
            out.append((f"best of optimality {name} exhaustive", e["exhaustive"]["best"]["plan"]))
    return out


def group_simulate(ctx: _Ctx, only: Callable[[str], bool], golden: dict | None, *,
                   planner: dict | None = None, optimality: dict | None = None) -> dict:
    """When recording, the best plans come from this run's planner and optimality groups; when
    checking, from the golden file (so that the two groups' differences do not show here)."""
    inputs: list[tuple[str, dict, bool]] = []
    for f in EXAMPLE_PLANS:
        inputs.append((f"example {f}", json.loads((ROOT / "examples" / f).read_text()), True))
    inputs += [(f"hand: {n}", p, s) for n, p, s in HAND_PLANS]
    if golden is None:
        best = _best_plans(planner, optimality)
    else:
        best = [(n, e["plan"]) for n, e in sorted(golden.items()) if n.startswith("best of ")]
    inputs += [(n, p, True) for n, p in best]
    out = {}
    for name, plan, spot in inputs:
        if only(name):
            out[name] = {"plan": plan, "spot": spot, "sim": _simulate(ctx, plan, spot)}
    return out


# ---- group: memory ------------------------------------------------------------------------------

# (model, gpu, tp, micro-batch size, in flight, layers or None, extra keyword arguments)
MEMORY_CASES = [
    ("opt-350m", A, 1, 4, 1, None, {}),
    ("opt-350m", A, 1, 2, 4, (0, 8), {}),
    ("opt-350m", V, 2, 8, 2, (8, 26), {}),
    ("gpt-neo-2.7b", A80, 1, 1, 8, (0, 5), {}),
    ("gpt-neo-2.7b", A, 4, 2, 3, (20, 34), {}),
    ("gpt-neo-2.7b", "T4", 1, 8, 1, None, {}),
    ("gpt-neo-2.7b", "H100-80", 2, 4, 2, (0, 17), {"regime": "torch-fp32-adamw"}),
    ("opt-1.3b", "L4", 1, 1, 2, (0, 13), {"seq_len": 1024}),
    ("tiny", "cpu", 1, 2, 2, (0, 2), {}),
    ("llama-3.2-1b", "H200", 1, 4, 1, None, {}),
]


def group_memory(ctx: _Ctx, only: Callable[[str], bool], golden: dict | None) -> dict:
    out = {}
    for model, gpu, tp, mbs, inflight, layers, extra in MEMORY_CASES:
        span = "all" if layers is None else f"{layers[0]}:{layers[1]}"
        more = "".join(f" {k}={v}" for k, v in sorted(extra.items()))
        name = f"{model} {gpu} tp{tp} mbs{mbs} inflight{inflight} layers {span}{more}"
        if not only(name):
            continue
        try:
            mem = ctx.api.stage_memory_for(model, gpu, tp, mbs, inflight, layers, **extra).to_dict()
        except Exception as exc:  # noqa: BLE001
            mem = _error(exc)
        out[name] = mem
    return out


# ---- group: replay ------------------------------------------------------------------------------

GCP_4D = "derived:gcp-4d:1 opt-350m 5e9 tokens"
SYNTHETIC = "synthetic 3 types x 5 pools, 10 h, opt-350m 3e9 tokens"
SYNTHETIC_BUDGET = "synthetic 3 types x 5 pools, 10 h, opt-350m 3e9 tokens, budget 60 USD"


def _synthetic_trace(api):
    h = 3600.0
    a1, a2, v1, v2, l1 = (A, C + "a"), (A, "us-west1-b"), (V, C + "a"), (V, "us-east1-b"), ("L4", C + "b")
    samples = [
        (0.0, {a1: 8, a2: 4, v1: 8, v2: 0, l1: 4}),
        (0.5 * h, {a1: 6, a2: 4, v1: 8, v2: 4, l1: 4}),
        (1.25 * h, {a1: 6, a2: 0, v1: 12, v2: 4, l1: 8}),
        (2.0 * h, {a1: 0, a2: 0, v1: 12, v2: 8, l1: 8}),
        (3.5 * h, {a1: 8, a2: 8, v1: 4, v2: 8, l1: 2}),
        (5.0 * h, {a1: 16, a2: 8, v1: 4, v2: 8, l1: 2}),
        (6.0 * h, {a1: 12, a2: 8, v1: 0, v2: 0, l1: 0}),
        (8.0 * h, {a1: 12, a2: 12, v1: 8, v2: 8, l1: 8}),
    ]
    # One preemption inside a tick (the count does not move, but the holder lost its GPUs).
    extra = [api.PreemptionEvent(time_s=5.5 * h, gpu=A, zone=C + "a", num_gpus=4)]
    return api.build_trace(samples, preemptions=extra, end_s=10 * h, source="golden synthetic")


def group_replay(ctx: _Ctx, only: Callable[[str], bool], golden: dict | None) -> dict:
    out = {}
    if only(GCP_4D):
        suite = ctx.api.run_policies(ctx.api.load_trace("derived:gcp-4d:1"),
                                     ctx.api.ReplaySpec(trace="derived:gcp-4d:1", model="opt-350m", tokens=5e9, workers=0))
        out[GCP_4D] = ctx.api.replay_suite(suite)
    for name, budget in ((SYNTHETIC, None), (SYNTHETIC_BUDGET, 60.0)):
        if only(name):
            suite = ctx.api.run_policies(_synthetic_trace(ctx.api), ctx.api.ReplaySpec(
                trace="synthetic", model="opt-350m", tokens=3e9, budget_usd=budget, workers=0))
            out[name] = ctx.api.replay_suite(suite)
    return out


# ---- record / check -----------------------------------------------------------------------------

GROUPS = ("planner", "optimality", "simulate", "memory", "replay")
QUICK: dict[str, Callable[[str], bool]] = {
    "planner": lambda n: n in QUICK_PLANNER,
    "optimality": lambda n: n in QUICK_OPTIMALITY,
    "simulate": lambda n: True,
    "memory": lambda n: True,
    "replay": lambda n: n == QUICK_REPLAY,
}


def _path(data_dir: Path, group: str) -> Path:
    return data_dir / f"{group}.json.gz"


def _write(data_dir: Path, group: str, entries: dict, meta: dict) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, "group": group, "meta": meta, "entries": entries},
                      sort_keys=True, indent=1, allow_nan=True)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(text.encode())
    _path(data_dir, group).write_bytes(buf.getvalue())


def _read(data_dir: Path, group: str) -> dict:
    doc = json.loads(gzip.decompress(_path(data_dir, group).read_bytes()))
    if doc.get("format") != FORMAT:
        raise SystemExit(f"{_path(data_dir, group)}: format {doc.get('format')!r}, expected {FORMAT}")
    return doc


def _commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "sailor_core"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + (" (sailor_core/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(data_dir: Path = DATA_DIR, groups: tuple[str, ...] = GROUPS) -> dict[str, int]:
    """Record ``groups`` (every group by default; the others' files stay as they are). ``simulate``
    takes the best plans of ``planner`` and ``optimality``: recorded now, or from their files."""
    ctx = _Ctx()
    every = lambda _n: True  # noqa: E731
    out, seconds = {}, {}
    for group in GROUPS:
        if group not in groups:
            continue
        t0 = time.perf_counter()
        if group == "simulate":
            best = {g: out[g] if g in out else _read(data_dir, g)["entries"] for g in ("planner", "optimality")}
            entries = group_simulate(ctx, every, None, planner=best["planner"], optimality=best["optimality"])
        else:
            entries = GROUP_FNS[group](ctx, every, None)
        out[group] = _canon(entries)
        seconds[group] = time.perf_counter() - t0
    meta = {"commit": _commit(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    for group in out:
        _write(data_dir, group, out[group], meta)
        print(f"{group}: recorded {len(out[group])} entries in {seconds[group]:.1f} s -> "
              f"{_path(data_dir, group).relative_to(ROOT) if data_dir.is_relative_to(ROOT) else _path(data_dir, group)}")
    return {g: len(out[g]) for g in out}


GROUP_FNS = {"planner": group_planner, "optimality": group_optimality, "simulate": group_simulate,
             "memory": group_memory, "replay": group_replay}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v!r} ({v.hex()})"
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 200 else s[:200] + f"... ({len(s)} chars)"


def compare(golden: Any, now: Any, path: str = "") -> list[str]:
    """Every difference between two JSON values, bit for bit, as 'path: golden X, now Y' lines."""
    if type(golden) is not type(now):
        return [f"{path}: golden {type(golden).__name__} {_fmt(golden)}, now {type(now).__name__} {_fmt(now)}"]
    if isinstance(golden, dict):
        out = []
        for k in sorted(set(golden) | set(now)):
            p = f"{path}/{k}"
            if k not in now:
                out.append(f"{p}: missing now (golden {_fmt(golden[k])})")
            elif k not in golden:
                out.append(f"{p}: not in golden (now {_fmt(now[k])})")
            else:
                out += compare(golden[k], now[k], p)
        return out
    if isinstance(golden, list):
        out = []
        for i, (a, b) in enumerate(zip(golden, now)):
            out += compare(a, b, f"{path}/{i}")
        if len(golden) != len(now):
            out.append(f"{path}: golden has {len(golden)} items, now {len(now)}")
        return out
    if isinstance(golden, float):
        same = golden.hex() == now.hex() or (math.isnan(golden) and math.isnan(now))
    else:
        same = golden == now
    return [] if same else [f"{path}: golden {_fmt(golden)}, now {_fmt(now)}"]


def check(*, quick: bool = False, groups: tuple[str, ...] = GROUPS, data_dir: Path = DATA_DIR,
          out: Callable[[str], None] = print) -> bool:
    """Recompute ``groups`` (the quick subset of each with ``quick``) and compare them with the
    golden files; prints one summary line per group and every difference.  True when all equal."""
    ctx = _Ctx()
    ok = True
    for group in groups:
        golden = _read(data_dir, group)["entries"]
        only = QUICK[group] if quick else (lambda _n: True)
        t0 = time.perf_counter()
        now = _canon(GROUP_FNS[group](ctx, only, golden))
        seconds = time.perf_counter() - t0
        want = {n: e for n, e in golden.items() if only(n)}
        diffs, differing = [], 0
        for name in sorted(set(want) | set(now)):
            if name not in now:
                d = [f"{group}/{name}: missing now"]
            elif name not in want:
                d = [f"{group}/{name}: not in golden"]
            else:
                d = compare(want[name], now[name], f"{group}/{name}")
            diffs += d
            differing += bool(d)
        status = "OK" if not diffs else "DIFFERENT"
        scope = f"{len(want)} of {len(golden)} entries" if quick else f"{len(want)} entries"
        out(f"{group}: {status}: {scope}, {len(want) - differing if differing <= len(want) else 0} equal, "
            f"{differing} with differences ({len(diffs)} values) [{seconds:.1f} s]")
        for d in diffs:
            out(f"  {d}")
        ok = ok and not diffs
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="write the golden files from the current code")
    r.add_argument("--group", action="append", choices=GROUPS, help="only this group (repeatable)")
    r.add_argument("--data", type=Path, default=DATA_DIR, help=f"folder of the golden files (default {DATA_DIR})")
    c = sub.add_parser("check", help="recompute and compare bit for bit; exit 1 on any difference")
    c.add_argument("--quick", action="store_true", help="only the subset tests/golden runs by default")
    c.add_argument("--group", action="append", choices=GROUPS, help="only this group (repeatable)")
    c.add_argument("--data", type=Path, default=DATA_DIR, help=f"folder of the golden files (default {DATA_DIR})")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.cmd == "record":
        record(args.data, tuple(args.group or GROUPS))
        print(f"recorded in {time.perf_counter() - t0:.1f} s")
        return 0
    ok = check(quick=args.quick, groups=tuple(args.group or GROUPS), data_dir=args.data)
    print(f"{'all equal' if ok else 'DIFFERENCES FOUND'} ({time.perf_counter() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
