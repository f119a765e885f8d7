"""`sailor train` refuses what its workers would refuse after renting, or what no plan could do,
before the flow is submitted: exit 2, one `error:` line, no job state written and no flow run on
the Prefect server (docs/reliability.md has the table and the measured times)."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from sailor_core.job import state as js


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Hugging Face folders: a Llama (transformers'), a Qwen2, a corrupt copy of the Llama, a BERT config."""
    import transformers  # lazy: transformers and torch, the yardstick, only for these folders

    from tests.hf_tiny import tiny_configs

    root = tmp_path_factory.mktemp("hf-bad")
    out = {name: str(root / name) for name in ("llama", "qwen2", "corrupt", "bert")}
    transformers.AutoModelForCausalLM.from_config(tiny_configs()["llama-3-like"]).save_pretrained(out["llama"])
    transformers.AutoModelForCausalLM.from_config(tiny_configs()["qwen2"]).save_pretrained(out["qwen2"])
    transformers.AutoModelForCausalLM.from_config(tiny_configs()["llama-3-like"]).save_pretrained(out["corrupt"])
    weights = os.path.join(out["corrupt"], "model.safetensors")
    data = open(weights, "rb").read()
    open(weights, "wb").write(data[: len(data) * 2 // 3])
    os.makedirs(out["bert"])
    with open(os.path.join(out["bert"], "config.json"), "w") as f:
        json.dump({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2}, f)
    (root / "a-file").write_text("not a folder")
    out["unwritable"] = str(root / "a-file" / "checkpoints")
    out["missing"] = str(root / "missing")
    return out


# (arguments, what the one line says); {name} is a folder of the fixture
BAD_INPUTS = {
    "init-from missing folder": (["--init-from", "{missing}"], "--init-from {missing}: no readable config.json"),
    "init-from mismatched config": (["--model", "{llama}", "--init-from", "{qwen2}"],
                                    "--init-from {qwen2} is not a {llama}: family 'qwen2'"),
    "unsupported family": (["--model", "{llama}", "--init-from", "{bert}"], "model_type 'bert' is not one of"),
    "unsupported family as --model": (["--model", "{bert}"], "model_type 'bert' is not one of"),
    "corrupt safetensors": (["--model", "{llama}", "--init-from", "{corrupt}"],
                            "--init-from {corrupt}/model.safetensors: tensor"),
    "missing data bucket": (["--data", "s3://no-such-bucket/corpus/tokens.bin"], "no bucket 'no-such-bucket'"),
    "missing gs:// data bucket": (["--clouds", "gcp", "--data", "gs://no-such-bucket/corpus/tokens.bin"],
                                  "no bucket 'no-such-bucket'"),
    "gs:// with AWS allowed": (["--checkpoint-url", "gs://ckpt-bucket/job"],
                               "--clouds must be gcp alone for a job with gs:// locations (--checkpoint-url "
                               "gs://ckpt-bucket/job): aws instances have no GCP identity; give --clouds gcp"),
    "local checkpoint folder": (["--checkpoint-url", "{unwritable}"],
                                "--checkpoint-url {unwritable}: a folder on this machine is out of the instances' reach"),
    "unreachable throughput floor": (["--min-throughput", "1e9"],
                                     "--min-throughput 1e+09 samples/s is above what any plan on the GPUs offered "
                                     "reaches: at most"),
    "budget below one checkpoint": (["--budget-usd", "0.000001"],
                                    "--budget-usd 1e-06 USD does not buy one checkpoint interval (5 steps) of the "
                                    "cheapest plan: that takes at least"),
}


def _num_flow_runs(api: str) -> int:
    req = urllib.request.Request(f"{api}/flow_runs/count", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(json.loads(resp.read()))


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_input_is_refused_before_anything_starts(prefect_api, folders, sailor_cli, case):
    args, needle = BAD_INPUTS[case]
    args = [a.format(**folders) for a in args]
    jobs_before = [s.job_id for s in js.JobStore().list()]
    runs_before = _num_flow_runs(prefect_api)
    job_id = "bad-" + "".join(c if c.isalnum() else "-" for c in case)
    r = sailor_cli("train", "--budget-usd", "1", *args, "--job-id", job_id)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle.format(**folders) in lines[0], lines[0]
    assert [s.job_id for s in js.JobStore().list()] == jobs_before
    assert _num_flow_runs(prefect_api) == runs_before


@pytest.mark.slow  # the embedded cloud's session opens first (~100 s on a loaded 2-core machine)
def test_a_flow_run_started_elsewhere_fails_at_its_start_with_nothing_rented(prefect_api):
    """A deployment run or one from the UI skips the CLI: the flow checks the same at its start,
    on the offers of its session, and ends the job failed with the one line."""
    from flows.train_job import train_job
    from sailor_core.errors import InputError

    with pytest.raises(InputError, match="min_throughput_samples_per_s 1e\\+09 samples/s is above what any plan"):
        train_job(model="tiny", budget_usd=1.0, steps=10, min_throughput_samples_per_s=1e9, cloud="embedded",
                  job_id="bad-floor-in-flow")
    state = js.JobStore().load("bad-floor-in-flow")
    assert state.status == js.FAILED and "above what any plan" in state.status_reason
    assert state.attempt == 0 and not state.instances
