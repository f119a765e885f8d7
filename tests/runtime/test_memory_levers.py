"""A stage's memory levers (plan stage ``recompute`` and ``zero``): training under them is training
without them, and their checkpoints are any plan's (fp32 CPU, gloo)."""

from __future__ import annotations

import shutil

import pytest
import torch

from sailor_core.catalog.models import get_model
from sailor_core.plan.types import RECOMPUTE_MODES, plan_from_dict
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.engine_run import final_params
from sailor_core.runtime.launch import launch_local
from sailor_core.runtime.model import StageModel
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.reference import train_reference
from sailor_core.runtime.stage_checkpoint import full_params_close
from sailor_core.runtime.allreduce import OverlappedAllReduce
from sailor_core.runtime.optimizer import decay_groups, make_optimizer
from sailor_core.runtime.zero import ShardedAdamW, chunk_of
from sailor_core.storage import open_storage

from .tp_threads import run_tp, threaded_world

CLIP = ("--grad-clip-norm", "0.3")


def lever_plan(model: str, stages: list[tuple[int, int, list[tuple[str, int]], dict]], *, gbs: int = 8):
    """stages: (layer_start, layer_end, [(gpu, tp) of each replica], {"recompute": .., "zero": ..})."""
    return plan_from_dict({"model": model, "global_batch_size": gbs, "micro_batch_size": 2,
                           "stages": [{"layers": [a, b], "replicas": [{"gpu": g, "tp": t} for g, t in reps], **levers}
                                      for a, b, reps, levers in stages]})


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
def test_recomputation_gives_the_same_gradients_bit_for_bit(model):
    spec = get_model(model)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, spec.vocab_size, (2, 24), generator=gen) for _ in range(2))
    results = []
    for mode in RECOMPUTE_MODES:
        stage = StageModel(spec, 0, spec.num_layer_indices, recompute=mode)
        loss = stage(x, y)
        loss.backward()
        results.append((loss.item(), [p.grad for p in stage.parameters()]))
    (loss0, grads0), *others = results
    for loss, grads in others:
        assert loss == loss0
        assert all(torch.equal(a, b) for a, b in zip(grads, grads0))


def test_chunks_cover_a_bucket_once():
    for n in (1, 7, 8, 1000):
        for d in (1, 2, 3, 8):
            c = chunk_of(n, d)
            ranges = [(min(i * c, n), min((i + 1) * c, n)) for i in range(d)]
            assert sum(hi - lo for lo, hi in ranges) == n and c * d >= n


def _tokens(spec, rank: int, step: int) -> torch.Tensor:
    return torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(10 * step + rank))


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_sharded_adamw_is_adamw_on_the_summed_gradient(zero_stage):
    """Two DP ranks (threads) each update their half of AdamW's states: the parameters and the
    gathered moments are those of one AdamW on the sum of both ranks' gradients, bit for bit,
    and each rank holds half of the moments."""
    spec = get_model("tiny")
    lr, wd, steps = 1e-2, 0.1, 3

    def dp_rank(rank, group):
        model = StageModel(spec, 0, 2)  # the same initial values on every rank
        overlap = OverlappedAllReduce(list(model.parameters()), group, reduce_scatter=zero_stage == 2)
        named = {id(p): (layer, name, p) for layer, name, p in model.named_layer_params()}
        zero = ShardedAdamW([[named[id(p)] for p in b] for b in overlap.buckets], group=group,
                            zero_stage=zero_stage, full_space=False, lr=lr, weight_decay=wd)
        for step in range(steps):
            overlap.arm()
            model(_tokens(spec, rank, step)).square().mean().backward()
            overlap.finish()
            zero.shard_grads = overlap.shards if zero_stage == 2 else None
            zero.take_grads()
            zero.step()
            zero.zero_grad()
        return ([p.detach().clone() for p in model.parameters()], zero.gathered_states(has_state=True),
                [id(p) for p in model.parameters()], zero.state_bytes(), len(overlap.buckets))

    with threaded_world():
        results = run_tp(2, dp_rank)
    ref = StageModel(spec, 0, 2)
    opt = make_optimizer(decay_groups(ref, wd), lr)
    for step in range(steps):
        for rank in range(2):  # gradients accumulate: the sum of both ranks'
            ref(_tokens(spec, rank, step)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    full_state_bytes = sum(8 * p.numel() for p in ref.parameters())
    for params, states, ids, state_bytes, num_buckets in results:
        assert all(torch.equal(a, b) for a, b in zip(params, ref.parameters()))
        for i, p in zip(ids, ref.parameters()):
            assert torch.equal(states[i]["exp_avg"], opt.state[p]["exp_avg"])
            assert torch.equal(states[i]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])
        assert abs(state_bytes - full_state_bytes / 2) <= 8 * num_buckets  # half, up to a bucket's padding
    assert sum(r[3] for r in results) == full_state_bytes


def _matches_single_process(plan, corpus, tmp_path) -> None:
    steps = 3
    res = launch_local(plan, steps, data=corpus, ckpt_dir=str(tmp_path / "ck"), workdir=tmp_path, timeout_s=240,
                       worker_args=CLIP)
    assert res.status == "ok", (res.message, res.stderr_tails)
    ref = train_reference(plan, steps, str(corpus), recipe=Recipe(total_steps=steps, grad_clip_norm=0.3))
    assert min(ref.grad_norms) > 0.3  # every step clips: the norm over ZeRO-2's shards counts
    assert res.losses == pytest.approx(ref.losses, abs=1e-5)
    _, params = final_params(str(tmp_path / "ck"))
    assert full_params_close(params, ref.params) < 2e-5


def test_levers_on_pp_dp_with_mixed_replicas_match_single_process(corpus, tmp_path):
    """Two stages of two replicas of different GPU types: ZeRO-2 with full recomputation, ZeRO-1
    with selective recomputation (the TP variants: the slow test below)."""
    _matches_single_process(lever_plan("tiny", [(0, 2, [("V100-16", 1), ("A100-40", 1)], {"zero": 2, "recompute": "full"}),
                                                (2, 4, [("T4", 1), ("L4", 1)], {"zero": 1, "recompute": "selective"})]),
                            corpus, tmp_path)


@pytest.mark.slow  # 7 processes (~40 s on 2 cores)
def test_levers_on_pp_tp_dp_with_mixed_replicas_match_single_process(corpus, tmp_path):
    """Stage 0: two TP-2 replicas of different GPU types, ZeRO-2 and full recomputation; stage 1:
    a TP-2 and a TP-1 replica (the mixed-TP DP group: ZeRO over full tensors), ZeRO-1 and
    selective recomputation."""
    _matches_single_process(lever_plan("tiny-llama", [(0, 2, [("V100-16", 2), ("A100-40", 2)], {"zero": 2, "recompute": "full"}),
                                                      (2, 4, [("T4", 2), ("L4", 1)], {"zero": 1, "recompute": "selective"})]),
                            corpus, tmp_path)


def _layers(url: str, step: int) -> dict:
    storage = open_storage(url)
    info = ckpt.read_checkpoint(storage, ckpt.step_dirname(step), url)
    return {i: ckpt.read_layer(storage, info, i) for i in range(int(info.meta["num_layer_indices"]))}


def _same_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[i][k].keys() == b[i][k].keys() and all(torch.equal(a[i][k][n], b[i][k][n]) for n in a[i][k])
        for i in a for k in ("params", "exp_avg", "exp_avg_sq"))


@pytest.mark.slow  # five launches (~60 s on 2 cores)
def test_a_zero_checkpoint_is_any_plans(corpus, tmp_path):
    """ZeRO-1 over DP 2 trains and checkpoints (AdamW's states gathered) bit for bit as without
    ZeRO; its step-2 checkpoint resumed under ZeRO-0 with the same replicas continues bit for bit
    as the uninterrupted run, and under ZeRO-0 over DP 1 and ZeRO-2 over DP 3 (with full
    recomputation) as single-process training."""
    def plan(dp: int, zero: int, recompute: str = "none"):
        reps = [("V100-16", 1), ("T4", 1), ("L4", 1)][:dp]
        levers = {"zero": zero, "recompute": recompute}
        return lever_plan("tiny", [(0, 2, reps, levers), (2, 4, reps, levers)], gbs=12)

    def run(p, url, name, resume=False):
        res = launch_local(p, 4, data=corpus, ckpt_dir=url, ckpt_every=2, resume=resume,
                           workdir=tmp_path / name, timeout_s=300, worker_args=CLIP)
        assert res.status == "ok", (res.message, res.stderr_tails)
        return res

    sharded, plain = str(tmp_path / "sharded"), str(tmp_path / "plain")
    whole = run(plan(2, 1), sharded, "sharded")
    assert run(plan(2, 0), plain, "plain").losses == whole.losses
    for step in (2, 4):
        assert _same_states(_layers(sharded, step), _layers(plain, step))

    ref = train_reference(plan(1, 0), 4, str(corpus), recipe=Recipe(total_steps=4, grad_clip_norm=0.3))
    for dp, zero, recompute in ((2, 0, "none"), (1, 0, "none"), (3, 2, "full")):
        url = str(tmp_path / f"resumed-{dp}-{zero}")
        shutil.copytree(sharded, url)
        shutil.rmtree(f"{url}/{ckpt.step_dirname(4)}")  # resume from step 2
        res = run(plan(dp, zero, recompute), url, f"r{dp}{zero}", resume=True)
        assert res.steps == [3, 4]
        if dp == 2:
            assert res.losses == whole.losses[2:]  # bit for bit
        assert res.losses == pytest.approx(ref.losses[2:], abs=1e-5)
        _, params = final_params(url)
        assert full_params_close(params, ref.params) < 2e-5
