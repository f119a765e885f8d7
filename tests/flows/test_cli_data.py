"""`sailor data prepare`: text files -> a token file the engine reads (tokenizers trained here, no network)."""

from __future__ import annotations

import json

import numpy as np
import pytest

TEXTS = ["The quick brown fox jumps over the lazy dog.\nAnd again, the dog sleeps.\n\n" * 30,
         "Héllo wörld: ünïcode ✓, tabs\tand  spaces\nlast line without a newline"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE tokenizer (GPT-2 style) with an end-of-text token, trained on the texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _inputs(tmp_path):
    paths = []
    for i, text in enumerate(TEXTS):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    return paths


@pytest.mark.parametrize("out_name", ["tokens.bin", "tokens.npy"])
def test_prepare_round_trips_the_text_with_documents_ended_by_eos(bpe, tmp_path, sailor_cli, out_name):
    from tokenizers import Tokenizer

    from sailor_core.runtime.data import TokenDataset

    a, b = _inputs(tmp_path)
    # --input takes several files after it
    r = sailor_cli("data", "prepare", "--input", str(a), str(b), "--tokenizer", str(bpe),
                   "--out", str(tmp_path / out_name), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    tok = Tokenizer.from_file(str(bpe))
    eos = tok.token_to_id("<|endoftext|>")
    vocab_size = tok.get_vocab_size()
    assert result["eos_id"] == eos and result["vocab_size"] == vocab_size and result["dtype"] == "uint16"
    path = tmp_path / out_name
    ids = np.load(path) if out_name.endswith(".npy") else np.fromfile(path, dtype="<u2")
    assert len(ids) == result["tokens"] and ids.dtype == np.uint16
    docs = np.split(ids, np.flatnonzero(ids == eos) + 1)[:-1]
    assert len(docs) == 2 and all(d[-1] == eos for d in docs)
    assert [tok.decode(d.tolist()) for d in docs] == TEXTS  # byte-level BPE: exact round trip
    assert TokenDataset(path, 16, vocab_size).num_samples == (len(ids) - 1) // 16  # the engine reads it

    r = sailor_cli("data", "prepare", "--input", str(a), "--tokenizer", str(bpe), "--out", str(tmp_path / "x.bin"))
    assert r.returncode == 0 and f"tokens (1 document, documents end with id 0; vocabulary {vocab_size}, uint16)" \
        in r.stdout, r.stdout


def test_a_vocabulary_past_16_bits_writes_u32(tmp_path, sailor_cli):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000, "hello": 70_001, "world": 70_002}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "t.txt").write_text("hello world w5\nw69999 hello\n")
    r = sailor_cli("data", "prepare", "--input", str(tmp_path / "t.txt"),
                   "--tokenizer", str(tmp_path / "tokenizer.json"), "--out", str(tmp_path / "tokens.bin"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["file"] == str(tmp_path / "tokens.u32.bin") and result["dtype"] == "uint32"
    assert result["eos_id"] is None  # no end-of-text token: documents are concatenated
    assert np.fromfile(tmp_path / "tokens.u32.bin", dtype="<u4").tolist() == [70_001, 70_002, 5, 69_999, 70_001]


def test_prepare_errors_are_one_line(bpe, tmp_path, sailor_cli):
    a, _ = _inputs(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        (["--input", str(tmp_path / "missing.txt"), "--tokenizer", str(bpe)], "input file", "does not exist"),
        (["--input", str(a), "--tokenizer", str(tmp_path / "bad.json")], "cannot read tokenizer", "bad.json"),
        (["--input", str(a), "--tokenizer", str(tmp_path / "none.json")], "tokenizer file", "does not exist"),
        (["--input", str(tmp_path / "empty.txt"), "--tokenizer", str(bpe)], "no tokens", "hold no text"),
        (["--input", str(tmp_path / "latin1.txt"), "--tokenizer", str(bpe)], "is not UTF-8 text", "byte 3"),
        (["--input", str(a), "--tokenizer", str(bpe), "--eos-token", "<eos>"], "--eos-token '<eos>'", "not in"),
        (["--tokenizer", str(bpe)], "no input files", "--input"),
    ]
    for args, *needles in cases:
        r = sailor_cli("data", "prepare", *args, "--out", str(tmp_path / "out.bin"))
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)
        assert all(n in lines[0] for n in needles), (args, lines[0])
        assert not (tmp_path / "out.bin").exists() and not list(tmp_path.glob(".out.bin*"))
    r = sailor_cli("data", "prepare", "--input", str(a), "--tokenizer", str(bpe), "--out", str(tmp_path / "t.txt"))
    assert r.returncode != 0 and "must end in .bin, .u32.bin or .npy" in r.stderr
