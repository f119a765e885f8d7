"""``sailor plan``'s settings and the plan flow's: what to plan for, and (on the command line)
over which GPUs and how wide to search."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.errors import InputError
from sailor_core.objective import Objective, objective_term
from sailor_core.specs.fields import at_least, option

# ZeRO and activation recomputation per stage (planner/levers.py): never; only when no plan fits
# without them; also where they make a plan that fits faster or cheaper, within about the plain
# search's time (the default); every lever searched in full for every request.
MEMORY_LEVER_MODES = ("off", "when-needed", "pays", "always")
DEFAULT_MEMORY_LEVERS = "pays"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanTerms:
    """What a plan is for: the model, the objective and the caps (the plan flow's settings)."""

    model: str = option(help="A catalog model, e.g. opt-350m, or a Hugging Face model folder (its config.json).")
    objective: Objective = option(Objective.THROUGHPUT, help=f"what to optimise: {Objective.described()}")
    global_batch_size: int | None = option(None, help="Sequences per iteration (default 1024).",
                                           aliases=("--global-batch",))
    max_usd_per_hr: float | None = option(None, help="Cost cap, USD per hour.", aliases=("--max-usd-per-hour",))
    min_throughput_samples_per_s: float | None = option(
        None, help="Throughput floor in samples (sequences) per second = iterations/s x global batch.",
        cli=("--min-throughput",))
    spot: bool = option(True, help="Price GPUs as spot (else on demand).", cli=("--spot/--no-spot",),
                        off_aliases=("--on-demand",))

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", objective_term(self.objective))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSpec(PlanTerms):
    """``sailor plan``: the terms, the GPUs available (a list or a trace's row) and the search's width."""

    gpus: str | None = option(None, help="GPUs available: 'A100-40@us-central1-a=32,V100-16@us-central1-a=96'.")
    trace: str | None = option(None, help="Take availability from a Sailor GPU trace CSV (with --row).")
    row: int = option(0, help="Row of --trace to plan for (0-based, after merging repeats).")
    max_usd_per_iter: float | None = option(None, help="Cost cap, USD per iteration.")
    top: int = option(5, help="How many plans to return.")
    max_stages: int = option(16, help="Most pipeline stages to consider.")
    memory_levers: str = option(DEFAULT_MEMORY_LEVERS, help="ZeRO and activation recomputation per stage: off, "
                                "when-needed (only when no plan fits without them), pays (also where they make "
                                "a plan faster or cheaper, found in about the time of the search without them) "
                                "or always (searched in full everywhere: slower).")

    def __post_init__(self) -> None:
        PlanTerms.__post_init__(self)  # not super(): slotted dataclasses are rebuilt classes
        at_least("max_stages", self.max_stages, 1)
        if self.memory_levers not in MEMORY_LEVER_MODES:
            raise InputError(f"--memory-levers must be one of {', '.join(MEMORY_LEVER_MODES)}, "
                             f"got {self.memory_levers!r}")
