"""A model is its config: `--model <folder>` trains a Hugging Face model the catalog does not have.

A 3-layer Llama with 6 heads over 3 KV heads (no catalog entry has that depth nor that GQA ratio),
made by transformers, trains from its own weights on the embedded cloud under a real Prefect
server through a preemption; the workers learn the model from the plan they are given, and the export reloads in
transformers with the token ids and generation config the folder had and the tokenizer the job names.
"""

from __future__ import annotations

import json

import pytest
import torch

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    cfg = transformers.LlamaConfig(vocab_size=384, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                                   num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=64,
                                   tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("my-llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    """The data's tokenizer, kept apart from the model (the job records it: `--tokenizer`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # transformers' own dependency

    words = Tokenizer(models.WordLevel({"<pad>": 0, "<s>": 1, "</s>": 2, "[UNK]": 3, "hello": 4}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tokenizer")
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                         unk_token="[UNK]").save_pretrained(folder)
    return folder


def test_a_model_folder_trains_on_the_embedded_cloud_and_exports(prefect_api, llama_folder, tokenizer_folder,
                                                                 tmp_path, sailor_cli):
    from flows.train_job import train_job
    from sailor_core.job import state as js

    summary = train_job(model=str(llama_folder), init_from=str(llama_folder), tokenizer=str(tokenizer_folder),
                        budget_usd=0.05, steps=6,
                        checkpoint_every_steps=2, global_batch_size=8, validate_every_steps=0, cloud="embedded",
                        max_gpus=2, preempt_at_steps=[3], job_id="my-llama-folder")
    assert summary["status"] == "succeeded", summary
    assert summary["steps"] == 6 and summary["instances_left_running"] == 0
    assert summary["preemptions"] == 1  # the new workers learned the model from their plan, and resumed
    state = js.JobStore().load(summary["job_id"])
    assert state.spec.model == str(llama_folder)
    assert state.plan["model"] == str(llama_folder) and state.plan["model_spec"]["num_layers"] == 3

    r = sailor_cli("export", summary["job_id"], "--out", str(tmp_path / "export"), "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (3, 3)
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (0, 1, 2)
    model = transformers.AutoModelForCausalLM.from_pretrained(done["out"])
    assert model.config.num_hidden_layers == 3
    generation = json.loads((tmp_path / "export" / "generation_config.json").read_text())
    assert generation == json.loads((llama_folder / "generation_config.json").read_text())
    assert done["tokenizer_from"] == str(tokenizer_folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(done["out"])
    assert tokenizer("hello")["input_ids"] == [4] and tokenizer.pad_token_id == model.config.pad_token_id
