"""`sailor engine run` on the tiny model with a 2-stage x 2-replica plan, compared with one process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow  # ~15-25 s; the engine equals the reference in test_engine_reference's default case
def test_engine_run_reference_json(tmp_path):
    plan = {"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
            "stages": [{"layers": [0, 2], "replicas": [{"gpu": "cpu"}, {"gpu": "cpu"}]},
                       {"layers": [2, 4], "replicas": [{"gpu": "cpu"}, {"gpu": "cpu"}]}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, "-m", "flows.cli.app", "engine", "run", "--plan", str(path),
                          "--steps", "3", "--reference", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["status"] == "ok" and res["steps"] == [1, 2, 3] and res["world_size"] == 4
    assert res["max_param_diff"] < 2e-5 and res["max_loss_diff"] < 1e-5
    assert res["losses"][-1] < res["losses"][0]
    assert res["throughput_samples_per_s"] > 0 and res["tokens_per_s"] > 0


def test_engine_run_bad_plan_is_one_line_error(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
                                "stages": [{"layers": [0, 3], "replicas": [{"gpu": "cpu"}]}]}))
    out = subprocess.run([sys.executable, "-m", "flows.cli.app", "engine", "run", "--plan", str(path),
                          "--steps", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1 and "layers" in out.stderr
