"""The controller's reasons: the figures behind a decision (``Decision.reason``) and its
economics in plain words for people (``Decision.why``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from sailor_core.controller.economics import Outlook
from sailor_core.controller.options import GpuZone
from sailor_core.controller.ranking import OptionRanking
from sailor_core.controller.state import ControllerConfig, ControllerState

_S_PER_HR = 3600.0


def hours(s: float) -> str:
    return f"{s / _S_PER_HR:.2f} h" if math.isfinite(s) else "never"


def figures(o: Outlook) -> str:
    return f"{hours(o.time_s)} and {o.cost_usd:,.2f} USD to finish"


def plain_versus(new: Outlook, now: Outlook, ranking: OptionRanking) -> str:
    """``new`` against ``now`` in the figure ``ranking`` ranks by (USD, or time)."""
    if ranking.by_cost:
        return f"it would cost {new.cost_usd:,.2f} USD to finish instead of {now.cost_usd:,.2f}"
    return f"it would finish in {hours(new.time_s)} instead of {hours(now.time_s)}"


def versus(new: Outlook, now: Outlook) -> str:
    return f"expects {figures(new)} against {figures(now)}"


def deadline_words(o: Outlook, margin_s: float, state: ControllerState, config: ControllerConfig) -> str:
    """When ``o`` finishes at the deadline's quantile of its preemptions, against the time left."""
    pct = f"{config.deadline_quantile:.0%}"
    return (f"finishes in {hours(o.time_s + margin_s)} in {pct} of outcomes ({hours(o.time_s)} expected, "
            f"{o.hits_per_s * _S_PER_HR:.1f} preemptions/h) with {hours(state.time_left_s)} left")


def left_unused(choice: Outlook, avail: Mapping[GpuZone, int], state: ControllerState) -> list[GpuZone]:
    """Pools offered with a preemption rate that the chosen plan does not use, stormiest first."""
    used = set(choice.option.all_gpus())
    return sorted((k for k in avail if k not in used and state.preemption_rate_per_s.get(k, 0) > 0),
                  key=lambda k: (-state.preemption_rate_per_s[k], k))


def explain(choice: Outlook, avail: Mapping[GpuZone, int], state: ControllerState, gave_up: str) -> str:
    """What was chosen, its expected figures, and the stormy pools it leaves unused on purpose."""
    text = f"{choice.option.label}, {figures(choice)}"
    if choice.hits_per_s > 0:
        text += f" ({choice.useful_fraction:.0%} of it training, {choice.hits_per_s * _S_PER_HR:.1f} preemptions/h)"
    left = left_unused(choice, avail, state)
    if left:
        text += "; leaves unused " + ", ".join(
            f"{g}@{z} ({state.preemption_rate_per_s[(g, z)] * _S_PER_HR:.1f} preemptions/h)" for g, z in left)
    if choice.option.on_demand:
        text += "; on demand: never preempted"
    if gave_up:
        text += f"; {gave_up}"
    return text


def gpus_words(gpus: Mapping[GpuZone, int]) -> str:
    return " + ".join(f"{n} {g} in {z}" for (g, z), n in sorted(gpus.items()) if n > 0)


def why_words(choice: Outlook, avail: Mapping[GpuZone, int], state: ControllerState, gave_up: str) -> str:
    """The choice's economics in plain words, for people (the flow's re-plan records)."""
    parts = []
    left = left_unused(choice, avail, state)
    if left:
        parts.append("left " + ", ".join(
            f"{g} in {z} unused (preempted {per_hour(state.preemption_rate_per_s[(g, z)])})" for g, z in left))
    if choice.option.on_demand:
        parts.append(f"{gpus_words(choice.option.on_demand)} on demand (never preempted)")
    if choice.hits_per_s > 0:
        # The count before the end, not the rate alone: a job of minutes learns its rates from
        # minutes (rate_window_s), and "96 times an hour" read as a storm where it means about one.
        parts.append(f"expects {hits_words(choice.expected_hits)} before the job ends "
                     f"({per_hour(choice.hits_per_s)}), training {choice.useful_fraction:.0%} of the time")
    if gave_up:
        parts.append(gave_up)
    return "; ".join(parts)


def hits_words(num_hits: float) -> str:
    if not math.isfinite(num_hits):
        return "preemptions without end"
    if num_hits < 0.5:
        return "less than one more preemption"
    if num_hits < 1.5:
        return "about one more preemption"
    return f"about {num_hits:.0f} more preemptions"


def per_hour(rate_per_s: float) -> str:
    per_hr = rate_per_s * _S_PER_HR
    return f"{per_hr:.1f} times an hour" if per_hr < 10 else f"{per_hr:.0f} times an hour"
