"""The controller's policies by name, as configurations: the train-job flow runs ``ours``, the
replay compares all four (``controller_config``, the one way either builds a ControllerConfig)."""

from __future__ import annotations

from sailor_core.controller.economics import Costs
from sailor_core.controller.state import ControllerConfig
from sailor_core.errors import InputError
from sailor_core.objective import JobTerms

POLICIES = ("ours", "skypilot", "single-type", "static")
POLICY_HELP = {
    "ours": "re-plan on every change over all GPU types and zones",
    "skypilot": "SkyPilot-style managed job: one fixed GPU request in one zone, restarted in the next cheapest zone",
    "single-type": "our planner restricted to one GPU type (all zones)",
    "static": "the plan chosen at the start; shrinks on losses, never grows back",
}


def controller_config(policy: str, *, costs: Costs, shutdown_s: float, terms: JobTerms = JobTerms(),
                      gpu_type: str | None = None) -> ControllerConfig:
    """The controller of ``policy`` with its costs of change (``costs``, then ``shutdown_s`` to stop)
    on the job's ``terms`` (the skypilot policy keeps its one request whatever the objective)."""
    common = dict(shutdown_s=shutdown_s, save_s=costs.save_s, provisioning_s=costs.provisioning_s,
                  startup_s=costs.startup_s, rejoin_s=costs.rejoin_s, work_lost_s=costs.work_lost_s, terms=terms,
                  state_load=costs.state_load)
    if policy == "ours":
        return ControllerConfig(strategy="replan", **common)
    if policy == "static":
        return ControllerConfig(strategy="static", **common)
    if policy in ("skypilot", "single-type"):
        if gpu_type is None:
            raise InputError(f"policy {policy!r} needs a GPU type")
        strategy = "failover" if policy == "skypilot" else "replan"
        return ControllerConfig(strategy=strategy, gpu_types=(gpu_type,), **common)
    raise InputError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
