"""Every family, end to end: a tiny random ``transformers`` model of shapes the catalog lacks (GQA
3:1, untied heads, head sizes other than hidden / heads, sliding windows) trains from
``--model <folder> --init-from <folder>`` on the embedded cloud under a real Prefect server, on 2
pipeline stages of TP 2 each (4 T4 in one zone), through a preemption.  Its first step's loss is
transformers' on the same samples, and ``sailor export`` of the job reloads in transformers with
the engine's logits on the trained weights.

The planner picks DP for models this small, so the job's planner is replaced by one that answers
the PP 2 x TP 2 plan (priced and placed by the flow's own planner); everything else is the flow's.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from tests.hf_tiny import perturbed_model, tiny_configs

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# one model per family, by the name of its config in tests/hf_tiny.py
FAMILIES = ("opt", "gpt-neo", "llama-3-like", "qwen2", "mistral", "qwen3", "phi3", "gemma2", "gemma3")
STEPS, BATCH, MICRO_BATCH = 4, 8, 2
TOL = 1e-5


def _force_pp2_tp2(monkeypatch) -> list[dict]:
    """The flow's planner answers 2 stages x TP 2 on the first pool with 4 GPUs; returns the plans
    it gave (as dicts), one per planning."""
    from sailor_core.catalog.hf_config import resolve_model
    from sailor_core.catalog.models import get_model
    from sailor_core.controller.options import CachedPlanner
    from sailor_core.plan.types import plan_from_dict
    from tasks import control

    real = control.job_planner
    given: list[dict] = []

    def job_planner(spec, offers):
        planner = real(spec, offers)
        last = get_model(resolve_model(spec.model)).num_layer_indices

        def pp2_tp2(available):
            pools = sorted(pool for pool, n in available.items() if n >= 4)
            if not pools:
                return []
            gpu, zone = pools[0]
            replica = {"gpu": gpu, "tp": 2, "zone": zone}
            plan = plan_from_dict({"model": spec.model, "global_batch_size": BATCH, "micro_batch_size": MICRO_BATCH,
                                   "stages": [{"layers": [0, last // 2], "replicas": [replica]},
                                              {"layers": [last // 2, last], "replicas": [replica]}]})
            given.append(plan.to_dict())
            return [planner.option(plan, 10.0)]

        return dataclasses.replace(planner, cached=CachedPlanner(plan_fn=pp2_tp2), cheap=None)

    monkeypatch.setattr(control, "job_planner", job_planner)
    return given


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_folder_trains_pp_tp_through_a_preemption_and_exports(family, prefect_api, monkeypatch, tmp_path,
                                                                       sailor_cli):
    from flows.train_job import train_job
    from sailor_core.catalog.hf_config import resolve_model
    from sailor_core.catalog.models import get_model
    from sailor_core.job import state as js
    from sailor_core.runtime.data import TokenDataset, generate_corpus
    from sailor_core.runtime.engine_run import final_params
    from sailor_core.runtime.model import StageModel
    from sailor_core.runtime.stage_checkpoint import load_full_weights

    transformers.logging.set_verbosity_error()
    hf = perturbed_model(tiny_configs()[family], seed=3)
    folder = tmp_path / f"my-{family}"
    hf.save_pretrained(folder)
    spec = get_model(resolve_model(str(folder)))
    data = generate_corpus(tmp_path / "corpus.npy", vocab_size=spec.vocab_size, num_tokens=20_000, seed=4)
    given = _force_pp2_tp2(monkeypatch)

    summary = train_job(model=str(folder), init_from=str(folder), dataset=str(data), budget_usd=0.05, steps=STEPS,
                        checkpoint_every_steps=1, global_batch_size=BATCH, validation_fraction=0.0,
                        validate_every_steps=0, cloud="embedded", gpus=("T4",), zones=("us-central1-a",),
                        max_gpus=4, max_gpus_per_zone=4, preempt_at_steps=[2], job_id=f"family-{family}")
    assert summary["status"] == "succeeded", summary
    assert summary["steps"] == STEPS and summary["instances_left_running"] == 0
    assert summary["preemptions"] == 1  # the second attempt resumed from a checkpoint
    state = js.JobStore().load(summary["job_id"])
    # the flow keeps its planner between attempts (its memo answers the second decision): one plan at least
    assert given and {(len(p["stages"]), tuple(r["tp"] for s in p["stages"] for r in s["replicas"])) for p in given} \
        == {(2, (2, 2))}
    assert len(state.replans) == 2 and state.replans[1].at_step >= 1  # resumed from a checkpoint
    for replan in state.replans:  # both attempts ran 2 stages of TP 2
        assert [[r["tp"] for r in s["replicas"]] for s in replan.plan["stages"]] == [[2], [2]]

    # step 1 (before any update) is transformers' loss on the job's first batch
    dataset = TokenDataset(str(data), spec.seq_len, spec.vocab_size, validation_fraction=0.0, min_val_samples=BATCH)
    with torch.no_grad():
        want = sum(float(F.cross_entropy(hf(input_ids=x).logits.reshape(-1, spec.vocab_size), y.reshape(-1)))
                   for x, y in (dataset.microbatch(0, 0, m, BATCH, MICRO_BATCH)
                                for m in range(BATCH // MICRO_BATCH))) / (BATCH // MICRO_BATCH)
    assert dict(state.losses)[1] == pytest.approx(want, abs=TOL)

    r = sailor_cli("export", summary["job_id"], "--out", str(tmp_path / "export"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step"] == STEPS
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export").float().eval()
    assert type(exported) is type(hf)
    _, params = final_params(state.spec.checkpoint_url)
    engine = StageModel(spec, 0, spec.num_layer_indices)
    load_full_weights(engine, params, "test")
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        theirs = exported(input_ids=tokens).logits
        assert float((theirs - engine(tokens)).abs().max()) <= TOL
        assert float((theirs - hf(input_ids=tokens).logits).abs().max()) > 1e-4  # it trained
