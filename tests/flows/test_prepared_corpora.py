"""Corpora as people keep them, through `sailor data prepare` and `sailor train --data` on the embedded
cloud: a JSON Lines chat corpus and a Parquet corpus train through a preemption and end with the loss
of an uninterrupted run on the same file (the resumed generation continues at the data position the
checkpoint recorded), and a manifest whose vocabulary the model cannot embed is refused before renting.

A real Prefect server and real instances (~1 min each): slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sailor_core.job import state as js
from tests.flows.test_cli_data import CHATS, chat_tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WORDS = "the a fox dog runs sleeps over under quick lazy brown red blue green why how".split()


def _sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(5 + i % 9)) + "."


def _chat_corpus(tmp_path: Path) -> list[str]:
    corpus = tmp_path / "chats.jsonl"
    chats = [[{"role": "user", "content": _sentence(i)}, {"role": "assistant", "content": _sentence(i + 1)}]
             for i in range(200)] + CHATS
    corpus.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    return ["-i", str(corpus), "--messages-field", "messages"]


def _parquet_corpus(tmp_path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": [_sentence(i) * 3 for i in range(200)]}), tmp_path / "c.parquet",
                   row_group_size=64)
    return ["-i", str(tmp_path / "c.parquet"), "--text-field", "content"]


@pytest.mark.parametrize("corpus", [_chat_corpus, _parquet_corpus], ids=["jsonl-chat", "parquet"])
def test_a_prepared_corpus_trains_through_a_preemption(prefect_api, sailor_cli, tmp_path, corpus):
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.launch import launch_local

    tok = chat_tokenizer(tmp_path / "tok")
    r = sailor_cli("data", "prepare", *corpus(tmp_path), "--tokenizer", str(tok), "--out", str(tmp_path / "t.bin"),
                   "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] > 64 * 40  # samples for 10 steps of 8 and the held-out batch
    steps = 10  # the preemption at 4 lands a step or two later under load, well before the end
    r = sailor_cli("train", "--data", str(tmp_path / "t.bin"), "--budget-usd", "0.05", "--steps", str(steps),
                   "--preempt-at", "4", "--max-gpus", "1", "--cloud", "embedded", "--json")
    summary = json.loads(r.stdout)
    assert r.returncode == 0 and summary["status"] == "succeeded", (r.stderr, summary)
    assert summary["preemptions"] == 1 and summary["steps"] == steps
    state = js.JobStore().load(summary["job_id"])
    [resumed] = [r.at_step for r in state.replans][1:]
    assert 0 < resumed < steps, "resumed from a checkpoint, not from the start"

    ref = launch_local(plan_from_dict(state.plan), steps, data=tmp_path / "t.bin", seed=0, workdir=tmp_path / "ref")
    assert ref.status == "ok", ref.message
    assert summary["final_loss"] == pytest.approx(ref.losses[-1], rel=1e-5, abs=1e-6)

    # the export carries the tokenizer the data was prepared with (its manifest names it)
    r = sailor_cli("export", summary["job_id"], "--out", str(tmp_path / "export"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokenizer_from"] == str(tok.parent.resolve())
    from transformers import AutoTokenizer  # lazy: the yardstick

    text = "hello world"
    assert AutoTokenizer.from_pretrained(tmp_path / "export").encode(text) == Tokenizer.from_file(str(tok)).encode(
        text).ids


def test_train_refuses_a_corpus_prepared_for_a_larger_vocabulary(prefect_api, sailor_cli, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(600)} | {"<|endoftext|>": 600}  # tiny embeds 512 ids
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "c.txt").write_text(" ".join(f"w{i % 500}" for i in range(4000)))  # every id fits, the vocab does not
    r = sailor_cli("data", "prepare", "-i", str(tmp_path / "c.txt"), "--tokenizer", str(tmp_path / "tokenizer.json"),
                   "--out", str(tmp_path / "t.bin"))
    assert r.returncode == 0, r.stderr
    r = sailor_cli("train", "--data", str(tmp_path / "t.bin"), "--budget-usd", "0.05", "--steps", "2",
                   "--cloud", "embedded", "--job-id", "vocab-too-big", "--json")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == (f"error: data {str(tmp_path / 't.bin')!r} was prepared with tokenizer {tmp_path.name!r} of "
                        "601 ids; model 'tiny' has a vocabulary of 512 (token ids must be below it)")
    state = js.JobStore().load("vocab-too-big")
    assert state.status == js.FAILED and state.attempt == 0 and state.instances == ()  # nothing rented
