"""The lever rungs' bounds never exceed the simulated time of a plan they cover, and ``strengthen``
skips only plans on which ZeRO cannot pay.

``levers.cannot_pay`` and ``levers.search_rung_directly`` bound a shape the search without levers
split by its pipeline and the sync its placed stages cannot avoid after it (``lever_bounds.least_sync_s``):
on every such shape of the AE rows where the ``pays`` rungs run (one GPU type, no cap or floor) and
of the completeness scenarios without a floor, the bound each of them prunes on is checked against the plans it
covers: the rung's split and its one-layer neighbours (what polishing reaches) on the rung's kinds
(both bounds), and the split on the plain and ZeRO-2 kinds too (``cannot_pay``'s bound, which also
covers relaxed plans), wherever they fit; and the least sync against the split's slowest stage sync
in ``simulate``.  ``levers.zero_cannot_pay``: wherever it holds on those requests (and on small
GPUs where ZeRO can pay), trying ZeRO on every stage as ``strengthen`` did keeps the plan."""

import pytest

from sailor_core.plan.types import RECOMPUTE_NONE
from sailor_core.planner import lever_bounds, levers, make_request, plan_job
from sailor_core.planner.search.shape_bound import ShapeBounds
from sailor_core.planner.search.shapes import fast_stages
from sailor_core.simulator.simulate import simulate
from sailor_core.source_data import SAILOR_CONFIGS_DIR
from sailor_core.traces import load_gpu_trace
from tests.planner.test_completeness import SCENARIOS

AE_TRACES = {"homog": "gpu_trace_scaled.csv", "geo": "gpu_trace_multizone.csv"}


def _ae_request(name: str, row: int):
    counts = load_gpu_trace(SAILOR_CONFIGS_DIR / AE_TRACES[name]).row(row)
    return make_request(model="opt-350m", availability={k: n for k, n in counts.items() if n},
                        global_batch_size=1024, spot=False)


REQUESTS = {f"AE {name} {row}": (_ae_request, (name, row)) for name in AE_TRACES for row in range(3)}
REQUESTS.update({f"completeness: {name}": (lambda kw: make_request(**kw), (kw,))
                 for name, (_, kw) in SCENARIOS.items()
                 if len({g for g, _ in kw["availability"]}) == 1 and "min_throughput_samples_per_s" not in kw})


def _neighbours(ends: list[int]) -> list[list[int]]:
    """The split and every split one boundary away from it."""
    out = [list(ends)]
    for b in range(len(ends) - 1):
        for delta in (-1, 1):
            moved = list(ends)
            moved[b] += delta
            if all(x < y for x, y in zip([0, *moved], moved)):
                out.append(moved)
    return out


def _check(searcher, rung, found: dict) -> None:
    """Every shape ``searcher`` split: the bounds of the rung walk and of ``cannot_pay`` against the
    plans they cover (see the module doc); tallies into ``found``."""
    regime, bounds = searcher.req.regime, ShapeBounds(searcher)
    kinds = levers.lever_kinds(searcher, rung)
    settings = (kinds, searcher.kinds, levers.lever_kinds(searcher, (RECOMPUTE_NONE, 2)))
    for _, t_lb, space, shape, order in searcher.split_orders:
        placed = searcher.build_stages(order)
        if placed is None:
            continue
        sync_s = lever_bounds.least_sync_s(searcher, placed, rung[1])
        rung_stages = [(kinds.get(k.gpu, k.tp_degree, k.micro_batch_size, regime), z) for k, z in placed]
        prep = searcher.split_placed(space.mbs, rung_stages, 0.0)
        busiest = levers._least_busiest(searcher, kinds, space.mbs, placed)
        if prep is None or busiest is None:
            continue
        rung_shape = levers._on_rung(searcher, kinds, shape, {})
        split_busiest = prep[2] * (1 - levers._RUNG_SPLIT_TOL)
        paired = lever_bounds.two_stage_s(searcher, space.mbs, rung_stages, rung[1]) * (1 - levers._ROUNDING)
        found["paired"] += paired > t_lb
        walk = lever_bounds.synced_tight(bounds, space, rung_shape, split_busiest, max(t_lb, paired), sync_s)
        proof = lever_bounds.synced_tight(bounds, space, shape, busiest, t_lb, sync_s)
        found["raised"] += walk is not None and walk[2][0] > bounds.tight(
            space, rung_shape, split_busiest, known=(t_lb, 0.0))[2][0]
        if len(placed) == 2:  # two_stage_s bounds every split of the shape on the rung's kinds
            for e in range(1, searcher.num_layers):
                ev = searcher.evaluate(space.mbs, fast_stages(rung_stages, [e, searcher.num_layers]))
                assert paired <= ev.res.iteration_time_s * (1 + 1e-9), (space.mbs, placed, e, paired, ev.res)
        for ends in _neighbours(prep[1]):
            for setting in settings if ends == prep[1] else settings[:1]:
                stages = [(setting.get(k.gpu, k.tp_degree, k.micro_batch_size, regime), z) for k, z in placed]
                if any(kind is None for kind, _ in stages):
                    continue
                ev = searcher.evaluate(space.mbs, fast_stages(stages, ends))
                if not ev.res.fits:
                    continue
                took = ev.res.iteration_time_s * (1 + 1e-9)
                if setting is kinds and walk is not None:
                    assert walk[2][0] <= took, (space.mbs, placed, ends, walk, ev.res)
                if proof is not None:
                    assert proof[2][0] <= took, (space.mbs, placed, ends, proof, ev.res)
                if ends == prep[1] and setting is kinds:
                    sim = simulate(searcher.to_plan(ev), profiles=searcher.profiles, network=searcher.network,
                                   spot=searcher.req.spot, validate=False)
                    assert sync_s <= max(s.dp_sync_s for s in sim.stages) * (1 + 1e-9), (placed, ends, sync_s)
                found["plans"] += 1


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_rung_bounds_never_exceed_the_simulated_time(monkeypatch, name):
    make, args = REQUESTS[name]
    found = {"plans": 0, "raised": 0, "rungs": 0, "paired": 0}
    directly = levers.search_rung_directly

    def spied(searcher, rung, req):
        found["rungs"] += 1
        _check(searcher, rung, found)
        return directly(searcher, rung, req)

    monkeypatch.setattr(levers, "search_rung_directly", spied)
    plan_job(make(*args))
    assert found["rungs"] == len(levers.PAYS_RUNGS) and found["plans"] > 0
    if name.startswith("AE geo"):
        assert found["raised"] > 0  # stages placed over us-west1-b: the least sync raises their bound
    if name.startswith("AE homog"):
        assert found["paired"] > 0  # two-stage shapes: pipeline and sync of one split together


# (and where the optimizer step is long enough that ZeRO may pay: bf16 on L4, 0.25 ms + 0.17 ns a
# parameter, where the skip never holds)
STRENGTHEN = {**REQUESTS, "opt-350m in bf16 on L4": (lambda kw: make_request(**kw), (dict(
    model="opt-350m", availability={("L4", "us-central1-a"): 8}, global_batch_size=256,
    regime="torch-bf16-autocast-adamw"),))}


@pytest.mark.parametrize("name", sorted(STRENGTHEN))
def test_strengthen_and_relax_skip_only_what_cannot_pay(monkeypatch, name):
    make, args = STRENGTHEN[name]
    decided = {True: 0, False: 0}
    cannot_pay, relax = levers.zero_cannot_pay, levers.relax

    def checked(searcher, ev):
        skip = cannot_pay(searcher, ev)
        decided[skip] += 1
        if skip:
            with monkeypatch.context() as m:
                m.setattr(levers, "zero_cannot_pay", lambda *a: False)
                assert levers.strengthen(searcher, ev) is ev
        return skip

    def relaxed(searcher, ev):
        out = relax(searcher, ev)
        with monkeypatch.context() as m:
            m.setattr(levers, "stronger_cannot_pay", lambda *a: False)
            full = relax(searcher, ev)
        assert (out.key, out.score) == (full.key, full.score)
        return out

    monkeypatch.setattr(levers, "zero_cannot_pay", checked)
    monkeypatch.setattr(levers, "relax", relaxed)
    plan_job(make(*args))
    if name in REQUESTS:
        assert decided[True] > 0  # (one stage of 40 replicas holds the whole model's step: 0.2 % of it)
    else:
        assert decided[True] == 0 and decided[False] > 0
