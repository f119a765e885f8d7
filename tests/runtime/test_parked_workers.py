"""Parked workers (runtime/park.py): two real agents and their workers; one instance preempted,
the survivors keep their processes and, where their shard stays, their state in memory."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sailor_core import settings
from sailor_core.catalog.layers import layer_shapes
from sailor_core.catalog.models import get_model
from sailor_core.job.protocol import AgentAction, AgentAssignment, AgentState, write_assignment
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.reference import train_reference
from sailor_core.job.protocol import EXIT_PREEMPTED
from sailor_core.plan.types import plan_from_dict

from sailor_core.ports import free_port
from tests.flows.test_agent import _wait_status

from .conftest import make_plan

TOTAL_STEPS = 40  # the recipe's (every generation continues the first one's schedule)
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


def _agent(tmp_path: Path, job_url: str, iid: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                             "--instance-id", iid, "--work-dir", str(tmp_path / iid)],
                            env={**os.environ, settings.NOTICE_S_ENV: "10"}, start_new_session=True)


def _run(generation: int, plan, ranks, world: int, port: int, corpus, ckpt: str, steps: int) -> AgentAssignment:
    return AgentAssignment(generation=generation, action=AgentAction.RUN, plan=plan.to_dict(), ranks=tuple(ranks),
                           world_size=world, master_addr="127.0.0.1", master_port=port, steps=steps,
                           data=str(corpus), ckpt_url=ckpt, ckpt_every=0, resume=generation > 1,
                           extra_worker_args=("--threads", "1", "--timeout-s", "30", "--validate-every", "0"))


def _started(st) -> dict:
    """Rank 0's 'started' line of the generation ``st`` reports."""
    lines = (Path(st.log_dir) / "metrics.jsonl").read_text().splitlines()
    return next(json.loads(line) for line in lines if '"started"' in line)


def _losses(*statuses) -> dict[int, float]:
    return {step: loss for st in statuses for step, loss in st.losses}


def test_survivors_park_and_train_on_with_their_state_in_memory(corpus, tmp_path: Path):
    job_url, ckpt, port = str(tmp_path / "job"), str(tmp_path / "ckpt"), free_port()
    a, b = _agent(tmp_path, job_url, "i-a"), _agent(tmp_path, job_url, "i-b")
    try:
        # Generation 1: stage 0 on i-a, stage 1 with one replica on each instance.
        wide = make_plan("tiny", [(0, 2, [1]), (2, 4, [1, 1])])
        write_assignment(job_url, "i-a", _run(1, wide, (0, 1), 3, port, corpus, ckpt, TOTAL_STEPS))
        write_assignment(job_url, "i-b", _run(1, wide, (2,), 3, port, corpus, ckpt, TOTAL_STEPS))
        first = _wait_status(job_url, "i-a", lambda st: st.step is not None and st.step >= 3)
        pids = dict(first.pids)
        os.killpg(b.pid, signal.SIGTERM)  # i-b is preempted: every rank checkpoints the same step
        assert b.wait(timeout=60) == 128 + signal.SIGTERM
        gen1 = _wait_status(job_url, "i-a", lambda st: len(st.exit_codes) == 2)
        assert gen1.exit_codes == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}  # parked, reported as stopped
        assert all(subprocess.run(["kill", "-0", str(p)]).returncode == 0 for p in pids.values())
        stop1 = gen1.step
        write_assignment(job_url, "i-a", AgentAssignment(generation=2, action=AgentAction.STOP))
        _wait_status(job_url, "i-a", lambda st: st.generation == 2)

        # Generation 3 on the survivor: the same stages, one replica each -> the same shards, kept.
        narrow = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
        write_assignment(job_url, "i-a", _run(3, narrow, (0, 1), 2, port, corpus, ckpt, stop1 + 3))
        gen3 = _wait_status(job_url, "i-a", lambda st: st.generation == 3 and st.state == AgentState.EXITED)
        assert gen3.pids == pids and gen3.exit_codes == {0: 0, 1: 0}
        assert _started(gen3)["state_from"] == "memory" and _started(gen3)["ready_s"] >= 0
        assert "kept in memory" in (Path(gen3.log_dir) / "rank1.log").read_text()

        # Generation 4 (new processes: generation 3's finished its steps and exited) is stopped while
        # it runs (the agent parks its workers); generation 6 moves the stage boundary: the same
        # processes take the layers they now hold from each other (runtime/handover.py).
        write_assignment(job_url, "i-a", _run(4, narrow, (0, 1), 2, port, corpus, ckpt, TOTAL_STEPS))
        _wait_status(job_url, "i-a", lambda st: st.generation == 4 and st.step is not None and st.step >= stop1 + 5)
        write_assignment(job_url, "i-a", AgentAssignment(generation=5, action=AgentAction.STOP))
        gen4 = _wait_status(job_url, "i-a", lambda st: st.generation == 5).previous
        assert gen4.exit_codes == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
        # (its two stages in two zones: the handover's bytes across them are metered with the first step's)
        moved = plan_from_dict({**make_plan("tiny", [(0, 1, [1]), (1, 4, [1])]).to_dict(), "stages": [
            {"layers": [lo, hi], "replicas": [{"gpu": "cpu", "tp": 1, "zone": zone}]}
            for lo, hi, zone in ((0, 1, ZONE_A), (1, 4, ZONE_B))]})
        write_assignment(job_url, "i-a", _run(6, moved, (0, 1), 2, port, corpus, ckpt, gen4.step + 2))
        gen6 = _wait_status(job_url, "i-a", lambda st: st.generation == 6 and st.state == AgentState.EXITED)
        assert gen6.pids == gen4.pids != pids and gen6.exit_codes == {0: 0, 1: 0}
        # rank 0 keeps layer 0 of what it held; rank 1 takes layer 1 and the tied matrix from it
        assert _started(gen6)["state_from"] == "memory"
        assert "handed over by its peers" in (Path(gen6.log_dir) / "rank1.log").read_text()
        steps = [json.loads(line) for line in (Path(gen6.log_dir) / "metrics.jsonl").read_text().splitlines()
                 if '"egress_bytes"' in line]
        sent = [{(src, dst): n for src, dst, n in st["egress_bytes"]} for st in steps]
        assert len(sent) == 2
        # layer 1 and the tied matrix (weights and both AdamW moments, float32), from zone A to B,
        # beside the step's activations and gradients (the same every step)
        shapes = layer_shapes("tiny", seq_len=1)
        spec = get_model("tiny")
        handed = (shapes[1].params + spec.vocab_size * spec.hidden_size) * 3 * 4
        assert sent[0][(ZONE_A, ZONE_B)] - sent[1][(ZONE_A, ZONE_B)] == handed
        assert sent[0][(ZONE_B, ZONE_A)] == sent[1][(ZONE_B, ZONE_A)]
        assert {(src, dst): n for src, dst, n in gen6.egress}[(ZONE_A, ZONE_B)] == sum(s[(ZONE_A, ZONE_B)] for s in sent)
    finally:
        for agent in (a, b):
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()

    # The same samples and updates as one process training straight through.
    losses = _losses(first, gen1, gen3, gen4, gen6)
    assert sorted(losses) == list(range(1, gen4.step + 3))
    ref = train_reference(wide, gen4.step + 2, str(corpus),
                          recipe=Recipe(total_steps=TOTAL_STEPS, validate_every_steps=0))
    # (the two-replica stage's all-reduce sums in another order than one process: drift ~1e-4)
    assert [losses[s] for s in sorted(losses)] == pytest.approx(ref.losses, rel=1e-4)


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trainer(plan, corpus):
    import torch

    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.process_groups import make_groups
    from sailor_core.runtime.trainer import StageTrainer

    spec = get_model(plan.model)
    data = TokenDataset(str(corpus), plan.effective_seq_len(), spec.vocab_size, validation_fraction=0.0,
                        min_val_samples=0)
    return StageTrainer(plan=plan, spec=spec, rank=0, data=data, recipe=Recipe(total_steps=TOTAL_STEPS), seed=3,
                        device=torch.device("cpu"), groups=make_groups(plan, 0))


def test_a_kept_state_is_exactly_the_checkpoint_it_saved(corpus, tmp_path: Path, one_rank_group):
    import torch

    from sailor_core.runtime import checkpoint as ckpt
    from sailor_core.runtime.stage_checkpoint import named_tensors, adopt, can_adopt, kept_state, load
    from sailor_core.runtime.checkpoint_writer import save_sync
    from sailor_core.storage import open_storage

    plan = make_plan("tiny", [(0, 4, [1])], gbs=4)
    first = _trainer(plan, corpus)
    for _ in range(3):
        first.train_step()
    storage = open_storage(str(tmp_path / "ck"))
    save_sync(first, storage, keep=2, rank=0)
    info = ckpt.latest_valid_checkpoint(str(tmp_path / "ck"))
    kept = kept_state(first)
    adopted, loaded = _trainer(plan, corpus), _trainer(plan, corpus)
    adopt(adopted, kept, info)
    load(loaded, storage, info)
    for (_, name, p), (_, _, q) in zip(named_tensors(adopted), named_tensors(loaded)):
        assert torch.equal(p, q), name
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(adopted.optimizer.state[p][key], loaded.optimizer.state[q][key]), (name, key)
    assert (adopted.step, adopted.next_sample) == (loaded.step, loaded.next_sample) == (3, 12)
    assert adopted.train_step() == loaded.train_step()  # and they train on identically

    # Another shard (a stage boundary moved), or a checkpoint of another step: read it instead.
    assert not can_adopt(adopted, dataclasses.replace(kept, shard=(0, 2, 1, 0)), info)
    first.train_step()
    assert not can_adopt(adopted, kept_state(first), info)


def test_a_rendezvous_port_in_use_is_named_as_such(corpus, tmp_path: Path):
    """Rank 0 cannot host the store (the port is taken): exit 77 saying so, not 'checkpoint I/O'."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(make_plan("tiny", [(0, 4, [1])], gbs=2, mbs=1).to_dict()))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "sailor_core.runtime.worker", "--plan", str(plan), "--steps", "1",
                            "--data", str(corpus), "--threads", "1"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                                "WORLD_SIZE": "1"})
    assert r.returncode == 77, r.stderr
    assert f"rendezvous at 127.0.0.1:{port} failed" in r.stderr and "checkpoint I/O" not in r.stderr, r.stderr


def test_a_parked_worker_waits_for_its_agent_and_no_longer(tmp_path: Path):
    from sailor_core.runtime import park

    me = os.getpid()
    # its agent gone (the parent is no longer that process): no wait
    assert park.wait_handover(tmp_path, me, stopped=lambda: False, parent_pid=os.getppid() + 1) is None
    assert park.wait_handover(tmp_path, me, stopped=lambda: True, parent_pid=os.getppid()) is None  # SIGTERM
    park.write_parked(tmp_path, park.Parked(pid=me, rank=3, local_rank=1, step=7))
    assert park.read_parked(tmp_path, me) == park.Parked(pid=me, rank=3, local_rank=1, step=7)
    park.write_handover(tmp_path, me, park.Handover(argv=("--plan", "p.json"), env={"RANK": "0"}, log_path="x.log"))
    assert park.read_parked(tmp_path, me) is None  # answered
    got = park.wait_handover(tmp_path, me, stopped=lambda: False, parent_pid=os.getppid())
    assert got == park.Handover(argv=("--plan", "p.json"), env={"RANK": "0"}, log_path="x.log")
    park.write_handover(tmp_path, me, park.Handover(exit=True))
    assert park.wait_handover(tmp_path, me, stopped=lambda: False, parent_pid=os.getppid()) is None
    assert list(tmp_path.iterdir()) == []  # nothing left behind
