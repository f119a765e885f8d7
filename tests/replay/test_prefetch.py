"""Planner answers searched ahead: the lookahead names the requests the next re-plan makes,
and worker processes' answers leave a replay's results as they are without them."""

import dataclasses

import pytest

from sailor_core.controller import controller_config
from sailor_core.replay import (
    ChangeCosts,
    Goal,
    Lookahead,
    Market,
    ReplayPolicy,
    controller_costs,
    replay,
    run_policies,
)
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import build_trace, derive_preset

from tests.controller.planners import linear_planner

A = ("A100-40", "us-central1-a")
B = ("A100-40", "us-east1-b")
V = ("V100-16", "us-central1-a")
ONE_USD = lambda gpu, zone, t: 1.0  # noqa: E731


def recorded_replay(trace, policy, *, target, decisions=1, costs=None):
    """Replay with the linear planner; return (planner requests, lookahead lists), in the
    order they happened, as ("ask", availability) and ("guess", [availabilities])."""
    events = []

    def plan_fn(available):
        events.append(("ask", dict(available)))
        return linear_planner(available)

    costs = costs or ChangeCosts(checkpoint_bytes=4e9)
    config = controller_config(policy, costs=controller_costs(costs), shutdown_s=costs.shutdown_s, gpu_type="V100-16")
    result = replay(trace, policy=ReplayPolicy(config=config, plan_fn=plan_fn, name=policy),
                    market=Market(price_fn=ONE_USD), goal=Goal(samples_target=target), costs=costs, seed=1,
                    lookahead=Lookahead(prefetch=lambda requests: events.append(("guess", [dict(a) for a in requests])),
                                        num_decisions=decisions))
    return events, result


def _new_requests(events):
    """(guessed, missed): the requests first asked, by whether the guess before them named them."""
    asked, guess, guessed, missed = [], None, [], []
    for kind, what in events:
        if kind == "guess":
            guess = what
            continue
        if what not in asked:
            (guessed if what in guess else missed).append(what)
        asked.append(what)
    return guessed, missed


@pytest.mark.parametrize("policy", ["ours", "single-type"])
def test_every_request_was_guessed_by_the_lookahead_before_it(policy):
    trace = derive_preset("aws-3d", seed=1)
    # (no interim on survivors here: a rejoin as long as the provisioning leaves it no time)
    costs = ChangeCosts(checkpoint_bytes=4e9, rejoin_s=90.0)
    events, result = recorded_replay(trace, policy, target=3e7, costs=costs)
    assert result.num_restarts > 20 and result.num_interims == 0  # many forced re-plans to guess
    assert events[0][0] == "guess"  # the first plan's requests too, before the replay asks them
    guessed, missed = _new_requests(events)
    # The first re-plan after a decision depends only on the plan in use: never missed.
    assert missed == [] and len(guessed) > 20


@pytest.mark.parametrize("policy", ["ours", "single-type"])
def test_only_interims_ask_what_the_lookahead_did_not_guess(policy):
    """An interim's request (the survivors the plan just chosen keeps) follows from that plan:
    it cannot be named before the decision, and is at most one per interim."""
    events, result = recorded_replay(derive_preset("aws-3d", seed=1), policy, target=3e7)
    guessed, missed = _new_requests(events)
    assert result.num_interims > 20 and len(missed) <= result.num_interims
    assert len(guessed) > 20 * len(missed)


def test_no_guesses_for_strategies_whose_next_request_depends_on_the_next_plan():
    trace = derive_preset("aws-3d", seed=1)
    for policy in ("static", "skypilot"):
        events, _ = recorded_replay(trace, policy, target=3e7)
        assert all(what == [] for kind, what in events if kind == "guess")


def test_deeper_lookahead_lists_the_next_decisions_in_order():
    trace = derive_preset("aws-3d", seed=1)
    events, _ = recorded_replay(trace, "ours", target=3e7, decisions=3)
    guesses = [what for kind, what in events if kind == "guess"]
    # Each re-plan over both GPU types asks about all six pools, then each type alone, then
    # without the stormiest pool, the two stormiest, ... (once every pool has seen a preemption),
    # and after a loss the GPUs the plan still holds (the restart may stay on them).
    assert max(len(g) for g in guesses) == 27
    full = next(g for g in guesses if len(g) == 27)
    assert [len({gpu for gpu, _ in a}) for a in full[:3]] == [2, 1, 1]
    for i in range(3):
        one = full[9 * i:9 * (i + 1)]
        assert [len(a) for a in one[:8]] == [6, 3, 3, 5, 4, 3, 2, 1]
        assert all(one[8].get(k, 0) <= n for k, n in one[0].items())  # within what is offered


def test_worker_processes_leave_a_real_replay_unchanged():
    # Two GPU types, pools that lose and regain GPUs: several forced re-plans.
    trace = build_trace([(0.0, {A: 8, B: 8, V: 8}), (1800.0, {A: 6, B: 8, V: 8}), (2400.0, {A: 6, B: 5, V: 8}),
                         (3000.0, {A: 6, B: 5, V: 4}), (3600.0, {A: 8, B: 8, V: 8}), (4200.0, {A: 3, B: 8, V: 6})])
    spec = ReplaySpec(trace="-", model="opt-350m", tokens=3e8, policy="ours,static", seed=3)
    alone = run_policies(trace, dataclasses.replace(spec, workers=0))
    helped = run_policies(trace, dataclasses.replace(spec, workers=2))
    assert alone.prefetch is None
    assert helped.prefetch.num_from_workers > 0
    assert helped.prefetch.num_from_workers + helped.prefetch.num_in_process == helped.planner_calls
    assert helped.planner_calls == alone.planner_calls
    for name, r in alone.results.items():
        h = helped.results[name]
        assert (h.time_to_train_s, h.usd_spent, h.num_replans, h.decisions) == \
            (r.time_to_train_s, r.usd_spent, r.num_replans, r.decisions)


@pytest.mark.parametrize("cpus, load, expected", [(2, 0.1, 2), (2, 1.0, 0), (8, 3.2, 5), (1, 0.0, 0), (4, 9.0, 0), (16, 0.2, 8)])
def test_default_workers_are_the_idle_cpus_or_none(monkeypatch, cpus, load, expected):
    import os

    import sailor_core.replay.prefetch as prefetch

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)), raising=False)
    # Idle now, where the system tells (Linux), else by the load average.
    monkeypatch.setattr(prefetch, "idle_cpus_now", lambda: cpus - load)
    assert prefetch.default_workers() == expected
    monkeypatch.setattr(prefetch, "idle_cpus_now", lambda: None)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert prefetch.default_workers() == expected


def test_idle_cpus_now_are_the_idle_share_of_the_cpu_time_between_two_readings(monkeypatch):
    import os

    from sailor_core.replay.prefetch import idle_cpus_now

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    # user nice system idle iowait irq softirq steal: 100 jiffies pass, 60 of them idle or iowait.
    lines = iter(["cpu  100 0 50 1000 10 0 0 0 0 0", "cpu  130 0 60 1055 15 0 0 0 0 0"])
    assert idle_cpus_now(window_s=0.0, read_stat=lambda: next(lines)) == 4 * 60 / 100
    assert idle_cpus_now(window_s=0.0, read_stat=lambda: "garbage") is None


def test_idle_cpus_are_measured_now_on_this_machine():
    import multiprocessing
    import os

    from sailor_core.replay.prefetch import idle_cpus_now

    quiet = idle_cpus_now(window_s=0.3)
    assert quiet is not None and 0.0 <= quiet <= os.cpu_count()
    # One process spinning takes about one CPU away (seen only where one was free).
    stop = multiprocessing.Event()
    spinner = multiprocessing.Process(target=_spin, args=(stop,))
    spinner.start()
    try:
        busy = idle_cpus_now(window_s=0.3)
    finally:
        stop.set()
        spinner.join()
    assert busy <= max(quiet - 0.5, 0.5)


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def test_a_worker_killed_mid_search_costs_time_not_the_answer():
    import os
    import signal

    from sailor_core.controller import planner_plan_fn
    from sailor_core.replay.prefetch import PrefetchingPlanner

    from sailor_core.planner.request import PlanQuery, SearchSettings

    query = PlanQuery(model="opt-350m", search=SearchSettings(max_evaluations=50))
    request = {A: 8, V: 8}
    planner = PrefetchingPlanner(query, workers=1)
    try:
        planner.prefetch([request])
        # A worker killed (say by the kernel, for memory) breaks the whole pool.
        for pid in list(planner._pool._processes):
            os.kill(pid, signal.SIGKILL)
        got = planner(request)
        assert planner.workers == 0 and planner.stats().num_in_process == 1
        planner.prefetch([{A: 4}])  # later guesses are ignored, not a crash
    finally:
        planner.close()
    assert got == tuple(planner_plan_fn(query)(request))


def test_the_single_type_pick_asks_what_the_replay_searches_ahead_for_it():
    from sailor_core.replay.policies import pick_single_type, single_type_requests

    trace = derive_preset("aws-3d", seed=1)
    asked = []

    def plan_fn(available):
        asked.append(dict(available))
        return linear_planner(available)

    pick_single_type(trace, plan_fn)
    assert asked == single_type_requests(trace)
    assert {frozenset(gpu for gpu, _ in a) for a in asked} == {frozenset({"V100-16"}), frozenset({"T4"})}


def test_progress_follows_each_policy_through_simulated_time():
    trace = derive_preset("aws-3d", seed=1)
    seen = []
    spec = ReplaySpec(trace="-", model="opt-350m", tokens=1.5e10, policy="ours,static", gpu="V100-16", workers=0)
    suite = run_policies(trace, spec, plan_fn=linear_planner, progress=lambda *a: seen.append(a))
    for policy in ("ours", "static"):
        times = [t for p, t, _ in seen if p == policy]
        assert len(times) > 2 and times == sorted(times)
    assert len([p for p, *_ in seen if p == "ours"]) > 10
    assert [p for p, *_ in seen] == sorted((p for p, *_ in seen), key=("ours", "static").index)
    searches = [n for *_, n in seen]
    assert searches == sorted(searches) and searches[-1] <= suite.planner_calls


def test_a_shadow_search_shares_the_workers_answers_and_stops_when_they_stop():
    import os
    import signal

    from sailor_core.controller import planner_plan_fn
    from sailor_core.replay.prefetch import PrefetchingPlanner

    from sailor_core.planner.request import PlanQuery, SearchSettings

    query = PlanQuery(model="opt-350m", search=SearchSettings(max_evaluations=50))
    request, other = {A: 8, V: 8}, {A: 4}
    planner = PrefetchingPlanner(query, workers=1)
    try:
        planner.start()
        planner.prefetch([request])
        shadow_answer = planner.search_in_worker(request)  # the guess already searching: waited for
        assert planner(request) == shadow_answer  # and kept for the replay: not searched again
        assert planner.stats().num_searched_ahead == 1 and planner.stats().num_in_process == 0
        for pid in list(planner._pool._processes):
            os.kill(pid, signal.SIGKILL)
        assert planner.search_in_worker(other) is None  # the shadow stops; the replay searches it
        assert planner.workers == 0
        assert planner(other) == tuple(planner_plan_fn(query)(other))
    finally:
        planner.close()
    assert shadow_answer == tuple(planner_plan_fn(query)(request))
