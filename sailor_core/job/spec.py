"""What the user asked of a training job: its one description, fixed for the life of the job."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.errors import InputError


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What the user asked for; fixed for the life of the job."""

    model: str
    budget_usd: float
    steps: int
    dataset: str = "synthetic"
    max_usd_per_hr: float | None = None
    min_throughput_samples_per_s: float | None = None
    clouds: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    spot: bool = True
    on_demand_fallback: bool = False
    objective: str = "throughput"
    checkpoint_url: str = ""
    checkpoint_every_steps: int = 5
    preempt_at_steps: tuple[int, ...] = ()  # injected on the embedded cloud only
    global_batch_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.budget_usd > 0:
            raise InputError(f"budget must be positive, got {self.budget_usd} USD")
        if self.steps < 1:
            raise InputError(f"steps must be at least 1, got {self.steps}")
        if self.checkpoint_every_steps < 1:
            raise InputError(f"checkpoint interval must be at least 1 step, got {self.checkpoint_every_steps}")
        if self.max_usd_per_hr is not None and not self.max_usd_per_hr > 0:
            raise InputError(f"USD/h cap must be positive, got {self.max_usd_per_hr}")
        if any(s < 1 for s in self.preempt_at_steps):
            raise InputError(f"preemption steps must be positive, got {list(self.preempt_at_steps)}")
