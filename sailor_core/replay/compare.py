"""Each policy's (time, cost) point, ours over objectives and deadlines, and comparisons at equal terms.

``compare_policies`` replays the trace under every policy as a user who wants it fastest
would run it, and as one who wants it cheapest (the cost objective; the skypilot policy keeps
its one request whatever the objective, so its point is the same), then ``ours`` again:

* with the cost objective and deadlines (a sweep from ours' fastest time out;
  ``deadline_factors``): with its fastest and cheapest runs, the points of ``ours``' Pareto
  front of time against cost;
* at equal terms with each other policy that finished: ``ours`` with a deadline equal to that
  policy's time (is it cheaper?) and with a budget equal to that policy's spend (is it
  faster?).

A point that did not finish (the horizon, a static plan out of GPUs, the budget) has no
time; the front holds finished points only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sailor_core.controller.policies import POLICIES
from sailor_core.objective import Objective
from sailor_core.replay.run import ReplaySuite, run_policies
from sailor_core.replay.result import ReplayResult
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import AvailabilityTrace

_S_PER_HR = 3600.0
DEADLINE_FACTORS = (1.25, 1.5, 2.0, 3.0)  # times ours' fastest: the sweep of the front


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One replay of one policy under some terms: where it lands in time and cost."""

    policy: str
    terms: str                  # "fastest", "cheapest", "deadline 12.0 h", "budget 250 USD"
    finished: bool
    time_h: float | None        # to train (None: not finished)
    usd: float
    useful_work_fraction: float
    num_replans: int
    stop_reason: str

    @classmethod
    def of(cls, r: ReplayResult, terms: str) -> Point:
        return cls(policy=r.policy, terms=terms, finished=r.finished,
                   time_h=r.time_to_train_s / _S_PER_HR if r.time_to_train_s is not None else None,
                   usd=r.usd_spent, useful_work_fraction=r.useful_work_fraction, num_replans=r.num_replans,
                   stop_reason=r.stop_reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class EqualTerms:
    """``ours`` against one other policy, on that policy's terms."""

    other: str
    other_point: Point
    ours_by_deadline: Point | None   # ours with deadline = other's time (None: the other did not finish)
    ours_by_budget: Point | None     # ours with budget = other's spend (None: the other did not finish)
    ours_fastest: Point              # ours as a user wanting it fastest runs it

    @property
    def cheaper_by(self) -> float | None:
        """Other's USD over ours' at the other's deadline (>1: ours cheaper), if ours met it."""
        o = self.ours_by_deadline
        if o is None or not o.finished or o.time_h is None or o.time_h > self.other_point.time_h * (1 + 1e-9):
            return None
        return self.other_point.usd / o.usd if o.usd > 0 else None

    @property
    def faster_by(self) -> float | None:
        """Other's time over ours' on the other's budget (>1: ours faster), if ours finished."""
        o = self.ours_by_budget
        if o is None or not o.finished or not o.time_h:
            return None
        return self.other_point.time_h / o.time_h


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    suite: ReplaySuite                 # every policy, fastest
    cheapest: ReplaySuite | None       # every policy but skypilot, cheapest
    points: tuple[Point, ...]          # every replay made
    front: tuple[Point, ...]           # ours' Pareto front of (time, cost), fastest first
    equal_terms: tuple[EqualTerms, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [dataclasses.asdict(p) for p in self.points],
            "front": [dataclasses.asdict(p) for p in self.front],
            "equal_terms": [
                {"other": e.other, "other_point": dataclasses.asdict(e.other_point),
                 "ours_fastest": dataclasses.asdict(e.ours_fastest),
                 "ours_by_deadline": dataclasses.asdict(e.ours_by_deadline) if e.ours_by_deadline else None,
                 "ours_by_budget": dataclasses.asdict(e.ours_by_budget) if e.ours_by_budget else None,
                 "cheaper_by": e.cheaper_by, "faster_by": e.faster_by}
                for e in self.equal_terms
            ],
        }


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The finished points no other finished point beats on both time and cost, fastest first."""
    done = sorted((p for p in points if p.finished and p.time_h is not None), key=lambda p: (p.time_h, p.usd))
    front: list[Point] = []
    for p in done:
        if not front or p.usd < front[-1].usd:
            front.append(p)
    return front


def compare_policies(trace: AvailabilityTrace, spec: ReplaySpec, *,
                     deadline_factors: Sequence[float] = DEADLINE_FACTORS,
                     progress: Callable[[str], None] | None = None, **run_args: Any) -> Comparison:
    """See the module doc: ``spec``'s policies on its trace and job, whatever its objective,
    deadline, floor and budget; ``run_args`` go to every ``run_policies`` (costs, planner...)."""
    say = progress or (lambda _text: None)
    policies = spec.policy_names or POLICIES
    base_spec = dataclasses.replace(spec, objective=Objective.THROUGHPUT, deadline_h=None, min_throughput_samples_per_s=None,
                                    budget_usd=None)

    def run(names: Sequence[str], **terms: Any) -> ReplaySuite:
        return run_policies(trace, dataclasses.replace(base_spec, policy=",".join(names), **terms), **run_args)

    def ours(label: str, **terms: Any) -> Point:
        say(f"ours, {label}")
        return Point.of(run(("ours",), **terms).results["ours"], label)

    say("every policy, fastest")
    suite = run(policies)
    fastest = {name: Point.of(r, "fastest") for name, r in suite.results.items()}
    points = list(fastest.values())
    by_cost = [p for p in policies if p != "skypilot"]
    cheapest = None
    if by_cost:
        say("every policy, cheapest")
        cheapest = run(by_cost, objective=Objective.COST)
        points += [Point.of(r, "cheapest") for r in cheapest.results.values()]
    if "ours" not in fastest:
        return Comparison(suite=suite, cheapest=cheapest, points=tuple(points), front=(), equal_terms=())
    base = fastest["ours"]
    deadlines = [base.time_h * f for f in deadline_factors] if base.time_h else []
    for d in deadlines:
        points.append(ours(f"deadline {d:.2f} h", objective=Objective.COST, deadline_h=d))
    equal = []
    for name, other in fastest.items():
        if name == "ours":
            continue
        by_deadline = by_budget = None
        if other.finished and other.time_h:
            by_deadline = ours(f"deadline {other.time_h:.2f} h ({name}'s time)", objective=Objective.COST,
                               deadline_h=other.time_h)
            by_budget = ours(f"budget {other.usd:.2f} USD ({name}'s spend)", budget_usd=other.usd)
            points += [by_deadline, by_budget]
        equal.append(EqualTerms(other=name, other_point=other, ours_by_deadline=by_deadline,
                                ours_by_budget=by_budget, ours_fastest=base))
    front = pareto_front([p for p in points if p.policy == "ours"])
    return Comparison(suite=suite, cheapest=cheapest, points=tuple(points), front=tuple(front),
                      equal_terms=tuple(equal))


def summary_lines(c: Comparison) -> list[str]:
    """The comparison in a few lines of words (the CLI and the benchmark print them)."""
    lines = []
    for terms in ("fastest", "cheapest"):
        at = {p.policy: p for p in c.points if p.terms == terms}
        o = at.get("ours")
        for name, other in at.items():
            if name in ("ours", "skypilot") or o is None:
                continue
            lines.append(f"{terms}, ours against {name}: {_point(o)} against {_point(other)}"
                         + (f" ({_verdict(o, other)})" if o.finished and other.finished else ""))
    for e in c.equal_terms:
        o = e.other_point
        if not o.finished:
            f = e.ours_fastest
            ours_text = (f"ours finishes in {f.time_h:.2f} h for {f.usd:.2f} USD" if f.finished
                         else f"ours does not finish either ({f.stop_reason.split(':')[0]})")
            lines.append(f"{e.other} did not finish ({o.stop_reason.split(':')[0]}, {o.usd:.2f} USD spent); "
                         f"{ours_text}")
            continue
        d, b = e.ours_by_deadline, e.ours_by_budget
        cheaper = e.cheaper_by
        lines.append(
            f"{e.other}: {o.time_h:.2f} h, {o.usd:.2f} USD. Ours by its deadline: "
            + (f"{d.time_h:.2f} h, {d.usd:.2f} USD ({cheaper:.2f}x cheaper)" if cheaper is not None
               else _missed(d, o))
            + ". Ours on its budget: "
            + (f"{b.time_h:.2f} h, {b.usd:.2f} USD ({e.faster_by:.2f}x faster)" if e.faster_by is not None
               else f"not finished ({b.stop_reason.split(':')[0]}, {b.usd:.2f} USD)"))
    return lines


def _point(p: Point) -> str:
    if p.finished and p.time_h is not None:
        return f"{p.time_h:.2f} h, {p.usd:.2f} USD"
    return f"not finished ({p.stop_reason.split(':')[0]}, {p.usd:.2f} USD)"


def _verdict(o: Point, other: Point) -> str:
    """How ours compares on each axis (1e-6 relative: the same plans give the same figures)."""
    def cmp(a: float, b: float, better: str, worse: str) -> str:
        if abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0):
            return "same"
        return better if a < b else worse
    return f"time {cmp(o.time_h, other.time_h, 'faster', 'slower')}, cost {cmp(o.usd, other.usd, 'cheaper', 'dearer')}"


def _missed(d: Point, other: Point) -> str:
    if d.finished and d.time_h is not None:
        return f"{d.time_h:.2f} h (late by {d.time_h - other.time_h:.2f} h), {d.usd:.2f} USD"
    return f"not finished ({d.stop_reason.split(':')[0]})"
