"""Planner leaf functions: CPU time per call of ``FastSim.evaluate``, ``FastSim.rent_and_egress``
and ``split.min_max_split``, replaying calls recorded while ``plan_job`` planned a few requests,
and a check that every replayed call gives exactly (bit for bit) the figures recorded from the
implementation of commit 1b9065a (before the leaf functions were made faster).

    .venv/bin/python benchmarks/bench_planner_leaves.py          # check + time (min of 7 runs)
    .venv/bin/python benchmarks/bench_planner_leaves.py --reps 3
    .venv/bin/python benchmarks/bench_planner_leaves.py record   # re-record (overwrites the reference!)

``record`` runs ``plan_job`` with the three functions wrapped and writes their inputs and outputs
to ``tests/planner/data/planner_leaf_calls.json.gz`` (floats as ``repr``, so they round-trip
exactly); ``tests/planner/test_leaf_replay.py`` replays a part of it on every test run.

A replay builds fresh kinds and a fresh ``FastSim`` for every repetition (memoised figures start
empty, as in a planning run) and calls the functions in the recorded order, so a repetition does
what the planning runs did, minus the search around it ("cold"); "warm" times the same calls
once more on the same instances (a process planning the same requests again).  Each function is
replayed on instances of its own.  Times are process CPU seconds; the shared machine is noisy,
so the minimum over repetitions is reported.

To time the implementation before the change with the same script, unpack that commit's
``sailor_core`` and ``tests/planner/data`` next to a copy of this file and run it there::

    mkdir -p /tmp/before/benchmarks && git archive 284f822 sailor_core tests/planner/data | tar -x -C /tmp/before
    cp benchmarks/bench_planner_leaves.py /tmp/before/benchmarks/
    (cd /tmp/before && /work/main/.venv/bin/python benchmarks/bench_planner_leaves.py)
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "tests" / "planner" / "data" / "planner_leaf_calls.json.gz"

# (model, scenario label of bench_planner.scenarios()): a cost cap over two zones and two types,
# a three-type one-zone cluster, five zones, and a throughput floor.
REQUESTS = [
    ("opt-350m", "2 zones A100+V100, cost cap"),
    ("gpt-neo-2.7b", "2 zones A100+V100, cost cap"),
    ("opt-350m", "heterogeneous row 1"),
    ("gpt-neo-2.7b", "heterogeneous row 1"),
    ("opt-350m", "geo 5 zones row 1"),
    ("gpt-neo-2.7b", "2 zones A100+V100, floor"),
]
# At most this many calls of each function per request are kept (evenly spaced), so the file
# stays small and the test fast.
MAX_CALLS = 1500


def _thin(calls: list, limit: int) -> list:
    if len(calls) <= limit:
        return calls
    step = len(calls) / limit
    return [calls[int(i * step)] for i in range(limit)]


def record() -> None:
    """Run plan_job on REQUESTS with the leaf functions wrapped; write inputs and outputs."""
    import bench_planner as bp

    import sailor_core.planner.search.searcher as search_mod
    import sailor_core.planner.split as split_mod
    from sailor_core.errors import SailorError
    from sailor_core.network.model import default_network
    from sailor_core.planner import make_request, plan_job
    from sailor_core.planner.fastsim import FastSim
    from sailor_core.planner.kinds import KindCache
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    kind_ids: dict[int, int] = {}
    kinds: list = []
    keep_alive: list = []
    orig_get = KindCache.get

    def get(self, gpu, tp_degree, micro_batch_size, regime=None):
        kind = orig_get(self, gpu, tp_degree, micro_batch_size, regime)
        if kind is not None and id(kind) not in kind_ids:
            kind_ids[id(kind)] = len(kinds)
            # the cache's memory levers too: a kind under recomputation or ZeRO answers differently
            kinds.append([self.model, self.seq_len, self.regime_name, gpu, tp_degree, micro_batch_size, regime,
                          list(self.levers)])
            keep_alive.append(kind)
        return kind

    sims: list = []
    sim_ids: dict[int, int] = {}

    def sim_id(fast) -> int:
        if id(fast) not in sim_ids:
            sim_ids[id(fast)] = len(sims)
            sims.append([fast.model, fast.gbs, fast.spot, fast.regime_name])
            keep_alive.append(fast)
        return sim_ids[id(fast)]

    def enc_stages(stages) -> list:
        return [[s.layer_start, s.layer_end, [[kind_ids[id(k)], z, n] for k, z, n in s.groups]] for s in stages]

    calls = {"evaluate": [], "rent_and_egress": [], "min_max_split": []}
    depth = [0]
    orig_eval, orig_rent, orig_split = FastSim.evaluate, FastSim.rent_and_egress, split_mod.min_max_split

    def evaluate(self, micro_batch_size, stages):
        depth[0] += 1
        try:
            res = orig_eval(self, micro_batch_size, stages)
        finally:
            depth[0] -= 1
        calls["evaluate"].append([sim_id(self), micro_batch_size, enc_stages(stages), result_fields(res)])
        return res

    def rent_and_egress(self, micro_batch_size, stages):
        out = orig_rent(self, micro_batch_size, stages)
        if depth[0] == 0:  # calls from evaluate are timed with it
            calls["rent_and_egress"].append([sim_id(self), micro_batch_size, enc_stages(stages), list(out)])
        return out

    def min_max_split(slots, num_layers, *, lower_bound_s=0.0, rel_tol=5e-3, memory_hits=None):
        ends = orig_split(slots, num_layers, lower_bound_s=lower_bound_s, rel_tol=rel_tol, memory_hits=memory_hits)
        calls["min_max_split"].append([
            [[kind_ids[id(s.kind)], s.num_microbatches, s.num_inflight, s.dp_degree] for s in slots],
            num_layers, lower_bound_s, rel_tol, ends])
        return ends

    KindCache.get = get
    FastSim.evaluate, FastSim.rent_and_egress = evaluate, rent_and_egress
    split_mod.min_max_split = search_mod.min_max_split = min_max_split
    scen = {label: (avail, extra) for label, avail, extra in bp.scenarios()}
    out = {"kinds": kinds, "sims": sims, "evaluate": [], "rent_and_egress": [], "min_max_split": []}
    try:
        for model, label in REQUESTS:
            avail, extra = scen[label]
            kw = dict(extra)
            gbs = bp._gbs(model)
            floor = kw.pop("floor_it_s", None)
            if floor is not None:
                kw["min_throughput_samples_per_s"] = floor * gbs
            req = make_request(model=model, availability=avail, global_batch_size=gbs, **kw)
            for name in calls:
                calls[name] = []
            try:
                plan_job(req, profiles=db, network=net)
            except SailorError as exc:
                print(f"{model} / {label}: {exc}")
            print(f"{model} / {label}: " + ", ".join(f"{n} {len(c)} calls" for n, c in calls.items()))
            for name, c in calls.items():
                out[name].extend(_thin(c, MAX_CALLS))
    finally:
        KindCache.get = orig_get
        FastSim.evaluate, FastSim.rent_and_egress = orig_eval, orig_rent
        split_mod.min_max_split = search_mod.min_max_split = orig_split
    DATA.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(DATA, "wt") as f:
        json.dump(out, f)
    print(f"wrote {DATA} ({DATA.stat().st_size} bytes)")


def result_fields(res) -> list:
    """A FastResult as a JSON list, field by field (tuples as lists)."""
    from dataclasses import fields

    return [list(v) if isinstance(v, tuple) else v for v in (getattr(res, f.name) for f in fields(res))]


def load() -> dict:
    with gzip.open(DATA, "rt") as f:
        return json.load(f)


class Replay:
    """Recorded calls with fresh kinds and FastSim instances (see the module doc)."""

    def __init__(self, data: dict, profiles, network) -> None:
        from sailor_core.planner.fastsim import FastSim, FastStage
        from sailor_core.planner.kinds import KindCache
        from sailor_core.planner.split import StageSlot
        from sailor_core.plan.types import RECOMPUTE_NONE

        caches: dict = {}
        self.kinds = []
        for model, seq_len, cache_regime, gpu, tp, mbs, regime, *levers in data["kinds"]:
            lever = tuple(levers[0]) if levers else (RECOMPUTE_NONE, 0)
            ckey = (model, seq_len, cache_regime, lever)
            if ckey not in caches:
                caches[ckey] = KindCache(model, seq_len, cache_regime, profiles, levers=lever)
            self.kinds.append(caches[ckey].get(gpu, tp, mbs, regime))
        self.sims = [FastSim(model=m, global_batch_size=g, network=network, spot=s, regime=r)
                     for m, g, s, r in data["sims"]]

        def stages(enc):
            return [FastStage(a, b, tuple((self.kinds[k], z, n) for k, z, n in groups)) for a, b, groups in enc]

        self.evaluate = [(self.sims[i], mbs, stages(enc), want) for i, mbs, enc, want in data["evaluate"]]
        self.rent = [(self.sims[i], mbs, stages(enc), want) for i, mbs, enc, want in data["rent_and_egress"]]
        self.split = [([StageSlot(kind=self.kinds[k], num_microbatches=n, num_inflight=f, dp_degree=d[0] if d else 1)
                        for k, n, f, *d in slots],
                       num_layers, lb, tol, want) for slots, num_layers, lb, tol, want in data["min_max_split"]]


def mismatches(replay: Replay, limit: int | None = None) -> list[str]:
    """Every replayed call whose output differs from the recorded one (bit for bit)."""
    from sailor_core.planner.split import min_max_split

    bad = []
    for n, (fast, mbs, stages, want) in enumerate(replay.evaluate[:limit]):
        got = result_fields(fast.evaluate(mbs, stages))
        if got != want or any(type(g) is not type(w) for g, w in zip(got, want) if not isinstance(w, list)):
            bad.append(f"evaluate #{n}: {got} != {want}")
    for n, (fast, mbs, stages, want) in enumerate(replay.rent[:limit]):
        got = list(fast.rent_and_egress(mbs, stages))
        if got != want:
            bad.append(f"rent_and_egress #{n}: {got} != {want}")
    for n, (slots, num_layers, lb, tol, want) in enumerate(replay.split[:limit]):
        got = min_max_split(slots, num_layers, lower_bound_s=lb, rel_tol=tol)
        if got != want:
            bad.append(f"min_max_split #{n}: {got} != {want}")
    return bad


def _time(fn, calls) -> float:
    t0 = time.process_time()
    fn(calls)
    return time.process_time() - t0


def bench(reps: int) -> None:
    from sailor_core.network.model import default_network
    from sailor_core.planner.split import min_max_split
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    data = load()
    bad = mismatches(Replay(data, db, net))
    print(f"check: {len(data['evaluate'])} evaluate, {len(data['rent_and_egress'])} rent_and_egress, "
          f"{len(data['min_max_split'])} min_max_split calls; {len(bad)} differ from the recording")
    for line in bad[:5]:
        print("  ", line)

    def run_eval(calls):
        for fast, mbs, stages, _ in calls:
            fast.evaluate(mbs, stages)

    def run_rent(calls):
        for fast, mbs, stages, _ in calls:
            fast.rent_and_egress(mbs, stages)

    def run_split(calls):
        for slots, num_layers, lb, tol, _ in calls:
            min_max_split(slots, num_layers, lower_bound_s=lb, rel_tol=tol)

    names = ("evaluate", "rent_and_egress", "min_max_split")
    runs = {"evaluate": (run_eval, "evaluate"), "rent_and_egress": (run_rent, "rent"),
            "min_max_split": (run_split, "split")}
    cold = dict.fromkeys(names, float("inf"))
    warm = dict.fromkeys(names, float("inf"))
    for _ in range(reps):
        for name in names:
            # Fresh kinds and FastSims: their memos start empty, as in a process's first
            # planning run; then the same calls again on them, as when a process plans the
            # same requests again (kinds and FastSims are kept per process: kinds.shared_kind_cache).
            fn, attr = runs[name]
            calls = getattr(Replay(data, db, net), attr)
            cold[name] = min(cold[name], _time(fn, calls))
            warm[name] = min(warm[name], _time(fn, calls))
    print(f"CPU time, min of {reps} replays of the recorded calls (cold: fresh memos; warm: the same calls again):")
    print("| function | calls | cold cpu s | cold us/call | warm cpu s | warm us/call |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, name in (("FastSim.evaluate", "evaluate"), ("FastSim.rent_and_egress", "rent_and_egress"),
                        ("split.min_max_split", "min_max_split")):
        n = len(data[name])
        print(f"| {label} | {n} | {cold[name]:.3f} | {1e6 * cold[name] / n:.1f} | "
              f"{warm[name]:.3f} | {1e6 * warm[name] / n:.1f} |")
    if bad:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="bench", choices=["bench", "record"])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    if args.what == "record":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        record()
    else:
        bench(args.reps)


if __name__ == "__main__":
    main()
