"""Preemption (SIGTERM) with an emergency checkpoint, resume under another plan, dead workers."""

from __future__ import annotations

import signal

import pytest

from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.stage_checkpoint import full_params_close
from sailor_core.runtime.engine_run import final_params
from sailor_core.runtime.launch import launch_local
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.reference import train_reference
from sailor_core.storage import open_storage
from sailor_core.runtime.faults import BEFORE_COMMIT, FaultConfig, Kill
from sailor_core.job.protocol import EXIT_PEER_LOST, EXIT_PREEMPTED

from .conftest import make_plan, sigterm_rank_after_step


# 40 steps over two launches (~40 s): the default run resumes under another plan in test_hf_roundtrip and
# keeps the recipe's schedule across a checkpoint in test_recipe
@pytest.mark.slow
def test_preempt_then_resume_under_another_plan(corpus, tmp_path):
    """Preempted in the middle of the warm-up, resumed under another plan with other recipe flags:
    the run continues the checkpoint's schedule exactly, on the same samples."""
    url = str(tmp_path / "ck")
    plan_a = make_plan("tiny", [(0, 3, [1]), (3, 4, [1, 1])])
    a = launch_local(plan_a, 40, data=corpus, ckpt_dir=url, workdir=tmp_path / "a", timeout_s=240,
                     on_started=sigterm_rank_after_step(2, 2),
                     worker_args=("--warmup-steps", "20", "--validate-every", "100"))
    assert a.status == "preempted", (a.message, a.stderr_tails)
    assert set(a.exit_codes.values()) == {EXIT_PREEMPTED}
    stop_step = a.steps[-1]
    assert 2 <= stop_step < 20  # inside the warm-up
    assert ckpt.latest_valid_checkpoint(url).step == stop_step
    assert a.val_losses == {}  # a step ending on a preemption notice checkpoints instead

    # plan B: other stage boundaries, DP and TP degrees, and flags the checkpoint overrides
    plan_b = make_plan("tiny", [(0, 1, [2]), (1, 4, [1])])
    b = launch_local(plan_b, stop_step + 2, data=corpus, ckpt_dir=url, resume=True,
                     workdir=tmp_path / "b", timeout_s=240,
                     worker_args=("--lr", "5e-3", "--warmup-steps", "2", "--validate-every", "100"))
    assert b.status == "ok", (b.message, b.stderr_tails)
    assert b.steps == [stop_step + 1, stop_step + 2]
    assert "continuing the checkpoint's recipe" in b.stderr_tails[0]
    # B continues A's schedule (warm-up over 20 of A's 40 steps), which its checkpoint holds
    recipe = Recipe(total_steps=40, warmup_steps=20, validate_every_steps=100)
    ref = train_reference(plan_a, stop_step + 2, str(corpus), recipe=recipe)
    assert a.losses == pytest.approx(ref.losses[:stop_step], abs=1e-5)
    assert b.losses == pytest.approx(ref.losses[stop_step:], abs=1e-5)
    assert b.val_losses == pytest.approx(ref.val_losses, abs=1e-5) and list(b.val_losses) == [stop_step + 2]
    info, params = final_params(url)
    assert full_params_close(params, ref.params) < 2e-5
    assert info.meta["recipe"] == recipe.to_dict()


def test_killed_worker_makes_the_others_exit_with_its_rank_named(corpus, tmp_path):
    plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1, 1])])
    res = launch_local(plan, 6, data=corpus, workdir=tmp_path, timeout_s=240,
                       collective_timeout_s=15, faults=FaultConfig(kill=Kill(rank=1, step=3)))
    assert res.status == "failed" and res.dead_rank == 1
    assert res.exit_codes[1] == -signal.SIGKILL
    assert not res.hung_ranks
    for r in (0, 2):
        assert res.exit_codes[r] == EXIT_PEER_LOST
        assert res.exit_times_s[r] - res.death_time_s < 20
    assert "rank 1 died" in res.message
    assert res.steps == [1, 2]
    for r in (0, 2):  # the survivors name the dead rank themselves (heartbeats), as a VM would
        assert "peer lost: dead ranks [1]" in res.stderr_tails[r]


def test_crash_during_save_leaves_previous_checkpoint_usable(corpus, tmp_path):
    url = str(tmp_path / "ck")
    plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
    res = launch_local(plan, 4, data=corpus, ckpt_dir=url, ckpt_every=1, workdir=tmp_path / "a",
                       timeout_s=240, collective_timeout_s=15,
                       faults=FaultConfig(kill=Kill(rank=0, step=2, point=BEFORE_COMMIT)))
    assert res.status == "failed" and res.dead_rank == 0 and not res.hung_ranks
    assert "peer lost: dead ranks [0]" in res.stderr_tails[1]
    assert (tmp_path / "ck" / "step_00000002" / "layer_0000.pt").exists()  # written, never committed
    assert not (tmp_path / "ck" / "step_00000002" / "MANIFEST.json").exists()
    info = ckpt.latest_valid_checkpoint(url)  # verifies every file against the manifest
    assert info.step == 1 and info.meta["next_sample"] == plan.global_batch_size
    # it loads (resuming from a checkpoint is exercised by the preemption test above)
    storage = open_storage(url)
    ref = train_reference(plan, 1, str(corpus), recipe=Recipe(total_steps=4))
    params = {i: ckpt.read_layer(storage, info, i)["params"] for i in ref.params}
    assert full_params_close(params, ref.params) < 2e-5


@pytest.mark.slow
def test_checkpoint_to_s3_and_resume(corpus, tmp_path, moto_s3):
    import boto3

    endpoint = moto_s3
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="sailor-ckpt")
    url = "s3://sailor-ckpt/job-1"
    plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
    a = launch_local(plan, 2, data=corpus, ckpt_dir=url, workdir=tmp_path / "a", timeout_s=240)
    assert a.status == "ok", (a.message, a.stderr_tails)
    assert ckpt.latest_valid_checkpoint(url).step == 2
    plan_b = make_plan("tiny", [(0, 4, [2])])
    b = launch_local(plan_b, 3, data=corpus, ckpt_dir=url, resume=True, workdir=tmp_path / "b",
                     timeout_s=240)
    assert b.status == "ok" and b.steps == [3], (b.message, b.stderr_tails)
    ref = train_reference(plan, 3, str(corpus), recipe=Recipe(total_steps=2))  # the checkpoint's schedule
    assert a.losses + b.losses == pytest.approx(ref.losses, abs=1e-5)


def test_an_error_every_rank_writes_is_said_once():
    from sailor_core.runtime.launch import _distinct_events

    events = [{"event": "error", "rank": r, "message": "data holds 3 samples"} for r in (0, 1)]
    events += [{"event": "error", "rank": 1, "message": "checkpoint I/O failed"}, {"event": "done", "rank": 0}]
    assert _distinct_events(events) == ['{"event": "error", "rank": 0, "message": "data holds 3 samples"}',
                                        '{"event": "error", "rank": 1, "message": "checkpoint I/O failed"}']
