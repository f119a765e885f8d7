"""Engine runs of heterogeneous plans match single-process training on the same samples (fp32 CPU)."""

from __future__ import annotations

import pytest

from sailor_core.runtime.engine_run import final_params
from sailor_core.runtime.trainer import full_params_close
from sailor_core.runtime.launch import launch_local
from sailor_core.runtime.reference import train_reference

from .conftest import make_plan

STEPS = 3


# The 2-stage x 2-replica plan is checked through the CLI (test_cli_engine.py).  One launch
# covers both an uneven 3-stage split and a stage with a TP-2 and a TP-1 replica (process
# start-up dominates these runs); the slow variants check them one by one and with DP 3.
@pytest.mark.parametrize("model,stages", [
    ("tiny-llama", [(0, 1, [1]), (1, 3, [2, 1]), (3, 4, [1])]),
    pytest.param("tiny", [(0, 2, [2, 1]), (2, 4, [1])], marks=pytest.mark.slow),
    pytest.param("tiny", [(0, 1, [1]), (1, 3, [1, 2, 1]), (3, 4, [2])], marks=pytest.mark.slow),
], ids=["uneven-3-stage-mixed-tp-llama", "mixed-tp", "uneven-3-stage-dp3"])
def test_plan_matches_single_process(model, stages, corpus, tmp_path):
    plan = make_plan(model, stages, gbs=12 if len(stages) == 3 else 8)
    res = launch_local(plan, STEPS, data=corpus, ckpt_dir=str(tmp_path / "ck"), workdir=tmp_path,
                       timeout_s=240)
    assert res.status == "ok", (res.message, res.stderr_tails)
    ref = train_reference(plan, STEPS, str(corpus))
    assert res.steps == [1, 2, 3]
    assert res.losses == pytest.approx(ref.losses, abs=1e-5)
    assert ref.losses[-1] < ref.losses[0]  # it trains
    info, params = final_params(str(tmp_path / "ck"))
    assert info.step == STEPS and info.meta["next_sample"] == STEPS * plan.global_batch_size
    assert full_params_close(params, ref.params) < 2e-5
