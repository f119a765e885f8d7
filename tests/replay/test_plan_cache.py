"""Planner answers kept on disk: what a second replay reads back, and when the file is written."""

import json

from sailor_core.replay import run_policies
from sailor_core.replay.plan_cache import persistent
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import build_trace

from tests.controller.planners import linear_planner

A = ("A100-40", "us-central1-a")
V = ("V100-16", "us-central1-a")


def counted(calls):
    def fn(avail):
        calls.append(dict(avail))
        return linear_planner(avail)
    return fn


def test_answers_come_back_from_the_file(tmp_path):
    path = tmp_path / "plans.json"
    calls = []
    first = persistent(counted(calls), path, prefix="m|k")
    want = first({A: 4, V: 2})
    first.flush()
    again = persistent(counted(calls), path, prefix="m|k")
    got = again({A: 4, V: 2})
    assert len(calls) == 1
    assert [(o.gpus, o.throughput_samples_per_s, o.usd_per_hr) for o in got] == \
        [(o.gpus, o.throughput_samples_per_s, o.usd_per_hr) for o in want]
    other_knobs = persistent(counted(calls), path, prefix="m|other")
    other_knobs({A: 4, V: 2})
    assert len(calls) == 2  # another prefix is another request


def test_the_file_is_rewritten_at_most_every_interval_and_on_flush(tmp_path):
    path = tmp_path / "plans.json"
    fn = persistent(counted([]), path, prefix="p")
    fn.write_interval_s = 3600.0
    for n in range(1, 6):
        fn({A: n})
    assert not path.exists()  # five answers, no rewrite yet
    fn.flush()
    assert len(json.loads(path.read_text())) == 5
    fn.write_interval_s = 0.0
    fn({A: 9})
    assert len(json.loads(path.read_text())) == 6


def test_a_damaged_file_only_costs_time(tmp_path):
    path = tmp_path / "plans.json"
    path.write_text("{not json")
    calls = []
    fn = persistent(counted(calls), path, prefix="p")
    assert fn({A: 2}) and len(calls) == 1


def test_a_second_replay_plans_nothing(tmp_path, monkeypatch):
    from sailor_core.replay import run as replay_run

    trace = build_trace([(0.0, {A: 8}), (3600.0, {A: 4}), (7200.0, {A: 8})])
    path = tmp_path / "plans.json"
    spec = ReplaySpec(trace="-", model="opt-350m", tokens=2e8, policy="ours,static", plan_cache=str(path), workers=0)
    cold = run_policies(trace, spec)
    assert cold.planner_calls > 0 and path.exists()

    def no_search(*_args, **_kwargs):
        def search(_available):
            raise AssertionError("the second replay searched instead of reading the file")
        return search

    monkeypatch.setattr(replay_run, "planner_plan_fn", no_search)
    warm = run_policies(trace, spec)
    assert warm.planner_calls == cold.planner_calls  # same calls, answered from the file
    for name, r in cold.results.items():
        assert (warm.results[name].time_to_train_s, warm.results[name].usd_spent) == (r.time_to_train_s, r.usd_spent)


def test_a_sibling_keeps_its_answers_in_the_same_file(tmp_path):
    path = tmp_path / "plans.json"
    calls = []
    main = persistent(counted(calls), path, prefix="m|fast")
    cheap = main.sibling(counted(calls), prefix="m|cheap,floor=40")
    main({A: 4})
    cheap({A: 4})
    cheap.flush()  # whichever writes, writes both
    again = persistent(counted(calls), path, prefix="m|cheap,floor=40")
    again({A: 4})
    assert len(calls) == 2 and set(json.loads(path.read_text())) == {"m|fast|A100-40@us-central1-a=4",
                                                                     "m|cheap,floor=40|A100-40@us-central1-a=4"}


def test_the_cheapest_planner_keeps_one_memo_per_floor():
    from sailor_core.controller import CheapestPlanner
    from sailor_core.controller.options import floors_on_grid

    made = []

    def make(floor):
        made.append(floor)
        return lambda a: [o for o in linear_planner(a) if floor is None or o.throughput_samples_per_s >= floor]

    cheapest = CheapestPlanner(make=make)
    assert [o.throughput_samples_per_s for o in cheapest({A: 4, V: 2}, 30.0)] == [48.0, 40.0]
    cheapest({A: 4, V: 2}, 30.0)
    cheapest({A: 4, V: 2}, None)
    assert made == [30.0, None] and cheapest.num_calls == 2
    lo, hi = floors_on_grid(40.0)
    assert lo <= 40.0 <= hi and hi / lo == 2 ** (1 / 8)
    assert floors_on_grid(32.0) == (32.0, 32.0)


def test_the_cache_keys_of_typed_queries_are_those_the_replays_dicts_wrote():
    import dataclasses

    from sailor_core.objective import Objective
    from sailor_core.planner.request import PlanQuery
    from sailor_core.replay.run import REPLAY_SEARCH, cache_prefix

    fast = PlanQuery(model="opt-350m", search=dataclasses.replace(REPLAY_SEARCH, micro_batch_sizes=(1, 2, 4)))
    assert cache_prefix(fast) == "opt-350m|gbs=None|max_evaluations=200,micro_batch_sizes=(1, 2, 4),top_n=3"
    cheap = dataclasses.replace(PlanQuery(model="opt-350m", global_batch_size=64, search=REPLAY_SEARCH),
                                objective=Objective.COST, min_throughput_samples_per_s=12.5)
    assert cache_prefix(cheap) == \
        "opt-350m|gbs=64|max_evaluations=200,min_throughput_samples_per_s=12.5,objective=cost,top_n=3"
