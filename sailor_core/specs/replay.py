"""``sailor replay``'s settings and the replay flow's: the trace, the job, the policies, the costs
of a change and the planner's workers.  A new replay setting is one field here plus the code
that uses it (``replay/run.run_policies``); the command's options and the flow's parameters
follow."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.errors import InputError
from sailor_core.network.storage_egress import place_named
from sailor_core.objective import JobTerms, Objective
from sailor_core.specs.fields import SpecError, at_least, option


def parse_tokens(text: str) -> float:
    """``2e10``, ``500M``, ``20B``: a positive number of tokens (ValueError says why not)."""
    t = text.strip().lower().replace("_", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if t[-1:] in "kmbgt" else t) * scale
    except ValueError:
        raise ValueError(f"must be a number like 2e9 or 500M, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"must be positive, got {text!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySpec:
    """What to replay and how: see each field's help (``sailor replay --help``)."""

    trace: str = option(help="Sailor GPU-trace CSV, a spot_traces file (formats A-D), "
                             "or derived:aws-3d / derived:gcp-4d[:SEED].")
    model: str = option(help="Model name, e.g. opt-350m.")
    tokens: float = option(help="Tokens to train, e.g. 2e10 or 20B.", parse=parse_tokens)
    policy: str = option("all", help="ours | skypilot | single-type | static | all (comma list ok).")
    budget_usd: float | None = option(None, help="Stop before spending more than this.")
    global_batch_size: int | None = option(None, help="Sequences per iteration (default 1024).",
                                           aliases=("--global-batch",))
    gpu: str | None = option(None, help="GPU type of the skypilot/single-type policies "
                                        "(default: the fastest at the start).")
    prices: str | None = option(None, help="Spot price series CSV (USD per GPU-hour).")
    trace_gpu: str | None = option(None, help="GPU type of a one-pool trace whose file name does not say.")
    trace_zone: str | None = option(None, help="Zone of a one-pool trace whose file name does not say.")
    provisioning_s: float = option(90.0, help="Spot request to running VM.")
    startup_s: float = option(60.0, help="Worker start-up and rendezvous.")
    rejoin_s: float = option(10.0, help="A change onto instances all held: their parked workers re-form the job "
                                        "in place (no new processes).")
    standby_workers: bool = option(True, help="New instances' workers start at boot, parked until their first "
                                              "assignment: after provisioning they start as in a rejoin (--no-standby"
                                              "-workers: they start once the VM runs, --startup-s).",
                                   cli=("--standby-workers/--no-standby-workers",))
    handover: bool = option(True, help="A change's ranks take their state from the ranks held that keep it, over "
                                       "the job's network; only what no survivor holds comes from the checkpoint "
                                       "(--no-handover: every change reloads the checkpoint from storage).",
                            cli=("--handover/--no-handover",))
    storage_gb_per_s: float = option(1.0, help="Checkpoint store bandwidth (GB/s).")
    checkpoint_interval_s: float = option(1800.0, help="Periodic checkpoints.")
    checkpoint_bucket: str = option("local", help="Where the checkpoint bucket lies, cloud:region (e.g. "
                                                  "aws:us-west-2; a cloud alone: region not known, priced as the "
                                                  "farthest); saves and restores from outside its region are "
                                                  "charged as egress (local: beside every zone, none).")
    exact_availability: bool = option(False, help="Plan on exact counts (slower; default rounds pools to a 1/8 grid).")
    seed: int = option(0, help="Seed of which of our GPUs a preemption picks.")
    plan_cache: str | None = option(None, help="JSON file keeping the planner's answers between replays (delete it "
                                               "after changing planner or profiles).")
    workers: int | None = option(None, help="Processes that search the next re-plans ahead (default: one per idle "
                                            "CPU up to 8, none if fewer than two are idle; 0: none). Results do not "
                                            "depend on it.")
    objective: Objective = option(Objective.THROUGHPUT, help=f"What the job asks: {Objective.described()}; every "
                                                             "policy but skypilot re-plans by it.")
    min_throughput_samples_per_s: float | None = option(
        None, help="Throughput floor (samples/s, counting restarts) for the cost objective.",
        cli=("--min-throughput",))
    deadline_h: float | None = option(None, help="Finish within this many hours of the trace's start (with "
                                                 "--objective cost: the cheapest plans that do).")
    on_demand_gpus: int = option(0, help="On-demand GPUs per pool of the trace the policies may rent besides spot "
                                         "(never preempted; skypilot rents spot only).")

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, (int, float)):  # a flow's parameter written as text ("20B")
            try:
                object.__setattr__(self, "tokens", parse_tokens(str(self.tokens)))
            except ValueError as exc:
                raise SpecError("tokens", str(exc)) from None
        object.__setattr__(self, "objective", self.terms.objective)  # validates the terms (JobTerms)
        if self.workers is not None:
            at_least("workers", self.workers, 0)
        try:
            place_named(self.checkpoint_bucket)
        except InputError as exc:
            raise SpecError("checkpoint_bucket", str(exc)) from None

    @property
    def terms(self) -> JobTerms:
        """The job's objective and constraints, which every policy but skypilot's re-plans by."""
        return JobTerms.of(self)

    @property
    def policy_names(self) -> tuple[str, ...] | None:
        """The policies asked for (None: all)."""
        if self.policy.strip() == "all":
            return None
        return tuple(p.strip() for p in self.policy.split(",") if p.strip())
