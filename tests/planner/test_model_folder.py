"""`--model <folder>`: a Hugging Face model folder is a model; its config.json is its spec.

A Llama made by transformers with a depth and a GQA ratio no catalog entry has (3 layers, 8 heads
over 4 KV heads) plans, its plan file carries the spec (a worker or a later `sailor simulate`
needs no folder), and the planner's TP degrees divide its KV heads.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from sailor_core.catalog.hf_config import hf_config, resolve_model, spec_from_hf_config
from sailor_core.catalog.models import get_model, model_slug
from sailor_core.errors import InputError, UnknownNameError
from sailor_core.job.spec import JobSpec, JobSpecError, check_names
from sailor_core.plan.types import plan_from_dict

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=[2, 3])
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("models") / "my-llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def test_the_folder_is_its_config(folder):
    name = resolve_model(str(folder))
    spec = get_model(name)
    assert name == str(folder) and spec.name == name
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.ffn_size, spec.vocab_size) == (3, 8, 2, 96, 300)
    assert (spec.pad_token_id, spec.bos_token_id, spec.eos_token_id) == (0, 1, (2, 3))
    assert resolve_model(f"file://{folder}/") == f"file://{folder}"  # a URL names it too
    assert model_slug(name).startswith("my-llama-") and "/" not in model_slug(name)


def test_sailor_plan_takes_the_folder_and_its_plan_carries_the_spec(folder, tmp_path, sailor_cli):
    r = sailor_cli("plan", "--model", str(folder), "--gpus", "T4@us-central1-a=4", "--json")
    assert r.returncode == 0, r.stderr
    plans = [p["plan"] for p in json.loads(r.stdout)["plans"]]
    assert plans and all(p["model"] == str(folder) and p["model_spec"]["num_layers"] == 3 for p in plans)
    # 2 KV heads: never TP 4, though T4 nodes hold 4 and the 8 heads would split
    assert {rep["tp"] for p in plans for s in p["stages"] for rep in s["replicas"]} <= {1, 2}

    moved = dict(plans[0], model="/gone/my-llama", model_spec=dict(plans[0]["model_spec"], name="/gone/my-llama"))
    plan = plan_from_dict(moved)  # no folder there: the spec the plan carries is the model
    assert get_model(plan.model).num_layers == 3
    (tmp_path / "plan.json").write_text(json.dumps(moved))
    r = sailor_cli("simulate", str(tmp_path / "plan.json"), "--json")
    assert r.returncode == 0, r.stderr


def test_memory_takes_the_folder_and_refuses_a_tp_the_kv_heads_do_not_split(folder, sailor_cli):
    assert sailor_cli("memory", "--model", str(folder), "--gpu", "T4", "--mbs", "1", "--tp", "2").returncode == 0
    r = sailor_cli("memory", "--model", str(folder), "--gpu", "T4", "--mbs", "1", "--tp", "4")
    assert r.returncode == 2 and "TP degree 4 does not divide" in r.stderr and "2 KV heads" in r.stderr


def test_a_job_takes_an_absolute_folder_only(folder, tmp_path, monkeypatch):
    check_names(JobSpec(budget_usd=1.0, model=str(folder), init_from=str(folder)))
    monkeypatch.chdir(folder.parent)
    with pytest.raises(JobSpecError, match="must be an absolute path or a URL"):
        check_names(JobSpec(budget_usd=1.0, model="./my-llama"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(JobSpecError, match="no readable config.json"):
        check_names(JobSpec(budget_usd=1.0, model=str(empty)))
    with pytest.raises(UnknownNameError):
        resolve_model("no-such-model")


def test_token_ids_survive_the_config_both_ways(folder):
    ours = get_model(resolve_model(str(folder)))
    written = hf_config(ours)
    assert (written["pad_token_id"], written["bos_token_id"], written["eos_token_id"]) == (0, 1, [2, 3])
    assert spec_from_hf_config(written, name=ours.name) == ours
    tiny = hf_config(get_model("tiny"))  # OPT's published ids: the pad row's gradient stays zero as in transformers
    assert (tiny["pad_token_id"], tiny["bos_token_id"], tiny["eos_token_id"]) == (1, 2, 2)
    loaded = transformers.OPTConfig(**{k: v for k, v in tiny.items() if k != "architectures"})
    assert loaded.pad_token_id == 1
    # a pretrained folder's eos ids (an Instruct model's several) win over the catalog entry's
    instruct = hf_config(get_model("llama-3.2-1b"), base={"eos_token_id": [128001, 128008, 128009]})
    assert (instruct["bos_token_id"], instruct["eos_token_id"]) == (128000, [128001, 128008, 128009])


def test_a_copy_of_a_folder_is_another_model(folder, tmp_path):
    copy = tmp_path / "my-llama"
    shutil.copytree(folder, copy)
    assert model_slug(resolve_model(str(copy))) != model_slug(resolve_model(str(folder)))
    with pytest.raises(InputError, match="a mixture-of-experts model"):
        spec_from_hf_config({**json.loads((folder / "config.json").read_text()), "num_local_experts": 4})


def test_a_model_in_object_storage_is_a_model(folder, moto_s3):
    import boto3

    from sailor_core.storage import open_storage

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="models")
    open_storage("s3://models/my-llama").put("config.json", (folder / "config.json").read_bytes())
    spec = get_model(resolve_model("s3://models/my-llama"))
    assert spec.name == "s3://models/my-llama" and (spec.num_layers, spec.num_kv_heads) == (3, 2)
    check_names(JobSpec(budget_usd=1.0, model="s3://models/my-llama"))
