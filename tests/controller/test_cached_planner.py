"""CachedPlanner: which availabilities it answers from earlier planner answers, and which reach the planner."""

from sailor_core.controller import CachedPlanner, PlanOption

A = ("A100-40", "us-central1-a")
B = ("A100-40", "us-central1-b")


def saturating(avail):
    """Throughput 10/s per GPU up to 4 GPUs in all; prefers pool A, then B (ties: the first found)."""
    plan, left = {}, 4
    for key in (A, B):
        take = min(left, avail.get(key, 0))
        if take:
            plan[key] = take
            left -= take
    if not plan:
        return []
    return [PlanOption(gpus=plan, throughput_samples_per_s=10.0 * sum(plan.values()), usd_per_hr=1.0)]


def counted(fn):
    calls = []

    def wrapped(avail):
        calls.append(dict(avail))
        return fn(avail)

    return wrapped, calls


def test_a_known_plan_as_fast_as_the_best_on_a_superset_answers_without_the_planner():
    fn, calls = counted(saturating)
    cp = CachedPlanner(plan_fn=fn)
    assert cp({B: 4})[0].gpus == {B: 4}
    assert cp({A: 4, B: 4})[0].gpus == {A: 4}
    # {A: 2, B: 4} is inside {A: 4, B: 4}, whose best (40/s) no longer fits; {B: 4} fits and
    # is as fast, and nothing on a subset can beat the superset's best.
    got = cp({A: 2, B: 4})
    assert len(calls) == 2 and got[0].gpus == {B: 4} and got[0].throughput_samples_per_s == 40.0
    assert got[0].throughput_samples_per_s == saturating({A: 2, B: 4})[0].throughput_samples_per_s


def test_a_slower_known_plan_does_not_answer():
    fn, calls = counted(saturating)
    cp = CachedPlanner(plan_fn=fn)
    cp({A: 4, B: 4})
    cp({B: 2})
    # {A: 2, B: 3}: the only known plan that fits ({B: 2}, 20/s) is slower than the bound (40/s),
    # while the planner finds 40/s: it must be asked.
    got = cp({A: 2, B: 3})
    assert len(calls) == 3 and got[0].throughput_samples_per_s == 40.0


def test_nothing_on_a_superset_means_nothing_on_a_subset():
    fn, calls = counted(lambda avail: [])
    cp = CachedPlanner(plan_fn=fn)
    assert cp({A: 4, B: 4}) == ()
    assert cp({A: 1, B: 4}) == () and cp({B: 2}) == ()
    assert len(calls) == 1 and cp.num_hits == 2


def test_calls_lists_each_planner_search():
    fn, _ = counted(saturating)
    cp = CachedPlanner(plan_fn=fn)
    cp({A: 4, B: 4})
    cp({A: 3})   # covered: the superset's best {A: 4} does not fit, but {A: 3} is not implied (30 < 40)
    cp({A: 4})   # covered: {A: 4} fits
    assert [c.available for c in cp.calls] == [{A: 4, B: 4}, {A: 3}]
    assert [c.num_gpu_types for c in cp.calls] == [1, 1]
    assert all(c.seconds >= 0 for c in cp.calls) and cp.planner_time_s == sum(c.seconds for c in cp.calls)
    assert cp.num_calls == 2 and cp.num_hits == 1


def test_knows_says_which_calls_need_no_planner_search_without_searching():
    fn, calls = counted(saturating)
    cp = CachedPlanner(plan_fn=fn)
    assert not cp.knows({A: 4})
    cp({A: 4, B: 4})
    assert cp.knows({A: 4, B: 4, ("V100-16", "us-central1-a"): 0})  # empty pools do not count
    assert cp.knows({A: 4, B: 1})        # implied: the superset's best still fits
    assert not cp.knows({A: 2, B: 1})    # the best no longer fits and nothing as fast is known
    assert not cp.knows({A: 5})          # not inside anything searched
    assert len(calls) == 1 and cp.num_hits == 0
