"""Pieces of the network profile between cloud instances that need no cloud: the link's ranks and
zones, a profile's JSON round trip, and the agent's command for the profiler's worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailor_core.errors import ProfileError
from sailor_core.job.protocol import AgentAssignment, ProtocolError
from sailor_core.profiler.network import (NET_WORKER_MODULE, NetworkProfile, network_link, network_profile_from_points,
                                          network_worker_args)
from sailor_core.runtime.agent import worker_command


def test_ranks_alternate_between_source_and_destination_zones():
    link = network_link("a100-40gb", "us-central1-a", "europe-west4-a", 4)
    assert link.gpu == "A100-40"
    assert link.zones_by_rank() == ["us-central1-a", "europe-west4-a", "us-central1-a", "europe-west4-a"]
    assert network_link("T4", "us-east-1a", "us-central1-b").clouds == ("aws", "gcp")
    assert network_link("T4", "us-central1-a").zones_by_rank() == ["us-central1-a", "us-central1-a"]


def test_a_profile_survives_its_json():
    pts = {"world_size": 3, "p2p": [[2**16, 1e-4], [2**18, 2e-4], [2**20, 6e-4], [2**22, 2e-3]],
           "allreduce": [[2**16, 3e-4], [2**20, 2e-3]], "allreduce_cpu": [[2**16, 1e-4], [2**20, 1e-3]]}
    prof = network_profile_from_points(pts, src_zone="us-central1-a", src_gpu="T4", dst_zone="us-central1-b",
                                       source="test")
    again = NetworkProfile.from_json(prof.to_json())
    assert again == prof
    with pytest.raises(ProfileError, match="not a network profile"):
        NetworkProfile.from_json({"fits": {}})


def test_the_agent_runs_the_profilers_worker_module_and_only_sailors(tmp_path: Path):
    args = network_worker_args(sizes=[2**16, 2**18, 2**20], reps=2, device="cpu")
    assignment = AgentAssignment(generation=1, module=NET_WORKER_MODULE, extra_worker_args=tuple(args))
    cmd = worker_command(assignment, tmp_path / "plan.json", tmp_path / "metrics.jsonl", python="py")
    assert cmd == ["py", "-m", NET_WORKER_MODULE, "--metrics-file", str(tmp_path / "metrics.jsonl"), *args]
    with pytest.raises(ProtocolError, match="not one of Sailor's"):
        AgentAssignment(generation=1, module="os")
    with pytest.raises(ProtocolError, match="not one of Sailor's"):
        AgentAssignment.from_dict({**assignment.to_dict(), "module": "os"})
