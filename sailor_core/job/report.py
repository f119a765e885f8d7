"""A job's numbers and plans in words for people: the terminal, ``sailor jobs``, the Prefect artifacts.

Pure functions, no Prefect: the CLI formats with them without loading it.  Amounts keep
three significant digits (``0.00000214 USD``, not ``0.000000``), durations read as
``3 min 12 s``, GPUs as ``2 T4 in us-central1-a``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


def sig(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, in plain notation (``0.00214``, ``1,230``, ``4.94``)."""
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{min(decimals, 12)}f}"


def usd(x: float | None) -> str:
    """An amount of money: cents from 1 USD up, three significant digits below."""
    if x is None or not math.isfinite(x):
        return "- USD"
    return f"{x:,.2f} USD" if abs(x) >= 1 else f"{sig(x)} USD"


def spend(spent_usd: float, budget_usd: float) -> str:
    """``0.0123 of 0.05 USD (25 %)``."""
    share = f" ({100 * spent_usd / budget_usd:.0f} %)" if budget_usd > 0 else ""
    return f"{sig(spent_usd)} of {sig(budget_usd)} USD{share}"


def rent_and_egress(rent_usd: float, egress_usd: float, checkpoint_egress_usd: float = 0.0) -> str:
    """``GPU rent 0.0123 USD + egress 0.00456 USD (checkpoints 0.001 USD)``: a spend's parts, the
    egress of checkpoints to and from a bucket in another region said apart when there is any."""
    of = f" (checkpoints {usd(checkpoint_egress_usd)})" if checkpoint_egress_usd else ""
    return f"GPU rent {usd(rent_usd)} + egress {usd(egress_usd)}{of}"


def egress_rows(by_pair: Mapping[tuple[str, str], tuple[float, float]]) -> list[dict[str, Any]]:
    """One row per zone pair the job's bytes crossed: the bytes and what they cost."""
    return [{"from": src, "to": dst, "GB": sig(num_bytes / 1e9), "USD": sig(cost)}
            for (src, dst), (num_bytes, cost) in sorted(by_pair.items())]


def duration(seconds: float | None) -> str:
    """``45 s``, ``3 min 12 s``, ``1 h 05 min``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def local_time(unix_s: float | None, *, date: bool = True) -> str:
    if unix_s is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M" if date else "%H:%M:%S", time.localtime(unix_s))


def gpus(counts: Mapping[tuple[str, str], int]) -> str:
    """``{(T4, us-central1-a): 2}`` -> ``2 T4 in us-central1-a`` (several pools joined by ``+``)."""
    parts = [f"{n} {gpu} in {zone}" for (gpu, zone), n in sorted(counts.items()) if n > 0]
    return " + ".join(parts) if parts else "no GPUs"


def plan_gpus(plan: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """GPUs a plan document uses per (type, zone): each replica holds ``tp`` of them."""
    out: dict[tuple[str, str], int] = {}
    for stage in plan.get("stages", ()):
        for rep in stage.get("replicas", ()):
            key = (rep["gpu"], rep["zone"])
            out[key] = out.get(key, 0) + int(rep.get("tp", 1))
    return out


def plan_line(plan: Mapping[str, Any] | None, *, usd_per_hr: float | None = None,
              samples_per_s: float | None = None) -> str:
    """A plan in one line: ``2 T4 in us-central1-a, 2 stages, micro-batch 1, 0.30 USD/h, 4.1 samples/s``."""
    if not plan:
        return "none yet"
    num_stages = len(plan.get("stages", ()))
    parts = [gpus(plan_gpus(plan)), f"{num_stages} stage{'s' if num_stages != 1 else ''}",
             f"micro-batch {plan.get('micro_batch_size')}"]
    if usd_per_hr is not None:
        parts.append(f"{sig(usd_per_hr)} USD/h")
    if samples_per_s is not None:
        parts.append(f"{sig(samples_per_s)} samples/s predicted")
    return ", ".join(parts)


def nodes_line(nodes: Iterable[Mapping[str, Any]]) -> str:
    """What is rented for an attempt: ``1 x n1-standard-8-t4x2 (2 T4) in us-central1-b``."""
    counts: dict[tuple[str, int, str, str], int] = {}
    for n in nodes:
        key = (n["instance_type"], int(n["gpus_per_node"]), n["gpu"], n["zone"])
        counts[key] = counts.get(key, 0) + 1
    return " + ".join(f"{k} x {t} ({g} {gpu}) in {z}" for (t, g, gpu, z), k in counts.items()) or "nothing"


def restart_words(*, num_ranks: int | None, num_ranks_rejoined: int | None, ready_s: float | None,
                  state_from: str | None, num_ranks_standby: int | None = None) -> str:
    """How an attempt's workers came back ('' when the agents did not say): its first-step event."""
    if ready_s is None or not num_ranks:
        return ""
    kept, standby = num_ranks_rejoined or 0, num_ranks_standby or 0
    parts = ([f"{kept} of {num_ranks} ranks kept their processes"] if kept else []) + (
        [f"{standby} of {num_ranks} ranks in standby workers"] if standby else [])
    how = ", ".join(parts) or "new worker processes"
    source = {"memory": "kept in memory", "peers": "handed over by its peers",
              "checkpoint": "read from the checkpoint"}.get(state_from or "")
    return f"workers ready in {ready_s:.1f} s ({how}{f'; rank 0 state {source}' if source else ''})"


def markdown_table(rows: list[Mapping[str, Any]]) -> str:
    """Rows of equal keys as a markdown table (the Prefect UI renders it)."""
    if not rows:
        return ""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in cols) + " |" for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """How far a job's training is: steps, the last loss and validation loss (step, loss), samples/s."""

    steps_done: int
    steps_target: int
    loss: float | None
    val_loss: tuple[int, float] | None = None
    samples_per_s: float | None = None
    checkpoint: tuple[int, float | None] | None = None  # the newest checkpoint: (step, when it completed)


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetUse:
    """What a job has spent of its budget."""

    spent_usd: float
    budget_usd: float
    egress_usd: float = 0.0  # of spent_usd
    checkpoint_egress_usd: float = 0.0  # of egress_usd: checkpoints to and from a bucket in another region


def checkpoint_words(step: int | None, at_unix_s: float | None = None) -> str:
    """``checkpoint 540 (12:03:04)``: the job's newest checkpoint, as status lines say it."""
    if step is None:
        return "no checkpoint yet"
    return f"checkpoint {step}" + (f" ({local_time(at_unix_s, date=False)})" if at_unix_s else "")


def status_markdown(*, progress: Progress, budget: BudgetUse, usd_per_hr_now: float, attempt: int, plan: str,
                    status: str, last_event: tuple[float, str] | None) -> str:
    """The live status of a job, a few short lines (the description of its status artifact)."""
    p = progress
    pct = 100 * min(p.steps_done, p.steps_target) / max(1, p.steps_target)
    train = [f"**Step {p.steps_done} of {p.steps_target}** ({pct:.0f} %)", f"loss {sig(p.loss, 4)}"]
    if p.val_loss is not None:
        train.append(f"val loss {sig(p.val_loss[1], 4)} (step {p.val_loss[0]})")
    if p.samples_per_s is not None:
        train.append(f"{sig(p.samples_per_s)} samples/s")
    if p.checkpoint is not None:
        train.append(checkpoint_words(*p.checkpoint))
    lines = [" · ".join(train),
             f"**Spent** {spend(budget.spent_usd, budget.budget_usd)}"
             + (f" (egress {usd(budget.egress_usd)}" if budget.egress_usd else "")
             + (f", checkpoints {usd(budget.checkpoint_egress_usd)}" if budget.checkpoint_egress_usd else "")
             + (")" if budget.egress_usd else "")
             + f" · {sig(usd_per_hr_now)} USD/h now · {status}",
             f"**Plan** (attempt {attempt}): {plan}"]
    if last_event is not None:
        lines.append(f"**Last event** {local_time(last_event[0], date=False)}: {last_event[1]}")
    return "\n\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStart:
    """When and why an attempt began, and the step it resumed from."""

    attempt: int
    at_unix_s: float
    reason: str
    resume_step: int


def attempt_markdown(*, start: AttemptStart, budget: BudgetUse, plan: str, nodes: list[Mapping[str, Any]],
                     plan_rows: list[Mapping[str, Any]], history: list[str], pareto: str) -> str:
    """One attempt's section of the job's attempts artifact: why, what was rented and why, the plan."""
    attempt, at_unix_s, reason, resume_step = start.attempt, start.at_unix_s, start.reason, start.resume_step
    rented = [{"rented": n["instance_type"], "zone": n["zone"], "ranks": ",".join(map(str, n["ranks"])),
               "USD/h": sig(n["usd_per_hr"]), "why": n.get("why") or "-"} for n in nodes]
    lines = [f"### Attempt {attempt} · {local_time(at_unix_s, date=False)}", "", reason[:1].upper() + reason[1:] + ".",
             "", f"From step {resume_step}, {spend(budget.spent_usd, budget.budget_usd)} spent so far. Plan: {plan}.", "",
             markdown_table(rented)]
    if history:
        lines += ["", "Provisioning, cheapest zone first: " + "; ".join(history) + "."]
    lines += ["", markdown_table(plan_rows)]
    if pareto:
        lines += ["", pareto]
    return "\n".join(lines)


def pareto_rows(points: Iterable[tuple[float, float]], chosen: tuple[float, float] | None) -> list[dict[str, str]]:
    """The planner's Pareto front for people: samples/s and USD per iteration, the chosen plan marked."""
    return [{"samples/s": sig(t), "USD/iteration": sig(c), "": "chosen" if chosen and (t, c) == chosen else ""}
            for t, c in sorted(points)]


_GCE_NAME_TAIL = re.compile(r"^sailor-.+-(a\d+-[0-9a-f]{6})$")


def short_instance_id(instance_id: str) -> str:
    """A GCP instance's name without the ``sailor-<job>-`` it starts with (``a2-c0a695``); others as they are."""
    m = _GCE_NAME_TAIL.match(instance_id)
    return m.group(1) if m else instance_id


def cost_rows(instances, by_instance_usd: Mapping[str, float], now_unix_s: float) -> list[dict[str, Any]]:
    """One row per instance the job rented: short enough for a laptop screen."""
    return [{"instance": short_instance_id(i.instance_id), "type": i.instance_type, "zone": i.zone,
             "attempt": i.attempt,
             "USD/h": sig(i.usd_per_hr), "ran": duration((i.ended_unix_s or now_unix_s) - i.launched_unix_s),
             "USD": sig(by_instance_usd.get(i.instance_id, 0.0)), "ended": i.end_reason or "running"}
            for i in instances]
