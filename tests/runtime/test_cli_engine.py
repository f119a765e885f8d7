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


def test_engine_run_reads_its_data_from_s3_and_rejects_bad_data_in_one_line(tmp_path, moto_s3, sailor_cli):
    """--data takes what `sailor train --data` takes: a URL is read by the workers (range reads)."""
    import boto3

    from sailor_core.runtime.data import generate_corpus

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": "tiny", "global_batch_size": 4, "micro_batch_size": 2,
                                "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu"}]}]}))
    corpus = generate_corpus(tmp_path / "corpus.npy", vocab_size=512, num_tokens=20_000, seed=3)
    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="tokens")
    boto3.client("s3", endpoint_url=moto_s3).upload_file(str(corpus), "tokens", "c/corpus.npy")
    here = sailor_cli("engine", "run", "--plan", str(plan), "--steps", "2", "--data", str(corpus), "--json")
    there = sailor_cli("engine", "run", "--plan", str(plan), "--steps", "2", "--data", "s3://tokens/c/corpus.npy",
                       "--json")
    assert here.returncode == 0 and there.returncode == 0, here.stderr + there.stderr
    assert json.loads(there.stdout)["losses"] == json.loads(here.stdout)["losses"]  # the same samples
    for data, needle in (("ftp://host/t.bin", "--data must be a path, file://, s3:// or gs://"),
                         (str(tmp_path / "missing.npy"), "no such file"),
                         ("corpus.txt", "--data must name a .bin")):
        r = sailor_cli("engine", "run", "--plan", str(plan), "--steps", "1", "--data", data)
        assert r.returncode != 0 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        assert needle in r.stderr, r.stderr


def test_engine_run_takes_a_jobs_learning_rate_and_refuses_a_bad_one_in_one_line(tmp_path, sailor_cli):
    from sailor_core.job.spec import JobSpec

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": "tiny", "global_batch_size": 4, "micro_batch_size": 2,
                                "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu"}]}]}))
    assert f"{JobSpec(budget_usd=1).learning_rate:g}" in sailor_cli("engine", "run", "--help").stdout  # one default
    r = sailor_cli("engine", "run", "--plan", str(plan), "--steps", "1", "--lr", "0")
    assert r.returncode != 0 and r.stderr == "error: --lr must be positive, got 0.0\n"
