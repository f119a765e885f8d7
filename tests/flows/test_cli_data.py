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


# ---- corpora as people keep them: JSON Lines (text or chat) and Parquet; the manifest -----------------

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHATS = [[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
          {"role": "assistant", "content": "Blue."}],
         [{"role": "user", "content": "Héllo? Two\nlines."}, {"role": "assistant", "content": "Hi ✓"}]]


def chat_tokenizer(folder):
    """A byte-level BPE tokenizer with ChatML's special tokens, saved as a Hugging Face folder
    (tokenizer.json and a tokenizer_config.json with the chat template)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[AddedToken(s, special=True) for s in specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS + [m["content"] for chat in CHATS for m in chat], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>"}))
    return folder / "tokenizer.json"


def _documents(path, eos):
    ids = np.load(path) if path.suffix == ".npy" else np.fromfile(path, dtype="<u4" if ".u32" in path.name else "<u2")
    assert ids[-1] == eos
    return np.split(ids, np.flatnonzero(ids == eos) + 1)[:-1]


def test_a_jsonl_chat_corpus_renders_as_transformers_does_with_a_manifest(tmp_path, sailor_cli):
    import hashlib

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok_path = chat_tokenizer(tmp_path / "chat-tok")
    corpus = tmp_path / "chats.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": i, "conversation": c}) for i, c in enumerate(CHATS)) + "\n\n")
    r = sailor_cli("data", "prepare", "-i", str(corpus), "--tokenizer", str(tok_path),
                   "--messages-field", "conversation", "--out", str(tmp_path / "chat.bin"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id("<|endoftext|>")
    docs = _documents(tmp_path / "chat.bin", eos)
    hf = AutoTokenizer.from_pretrained(str(tok_path.parent))  # the yardstick of chat templates
    assert [tok.decode(d[:-1].tolist(), skip_special_tokens=False) for d in docs] == \
        [hf.apply_chat_template(c, tokenize=False) for c in CHATS]
    assert all(tok.token_to_id("<|im_start|>") in d for d in docs)  # special tokens are single ids
    # transformers' {% generation %} marks (assistant turns) render as their body, as there.
    from flows.cli.data_sources import load_chat_template

    marked = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + eos_token }}"
              "{% endgeneration %}{% else %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}")
    config = json.loads((tok_path.parent / "tokenizer_config.json").read_text())
    (tmp_path / "marked").mkdir()
    (tmp_path / "marked" / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": marked}))
    ours = load_chat_template(tmp_path / "marked" / "tokenizer.json")
    assert [ours.render(c, "test") for c in CHATS] == [hf.apply_chat_template(c, tokenize=False, chat_template=marked)
                                                     for c in CHATS]

    manifest = json.loads((tmp_path / "chat.bin.manifest.json").read_text())
    assert result["manifest"] == str(tmp_path / "chat.bin.manifest.json")
    assert manifest["tokenizer"] == {"path": str(tok_path), "name": "chat-tok", "vocab_size": tok.get_vocab_size()}
    assert (manifest["eos_id"], manifest["dtype"], manifest["num_documents"]) == (eos, "uint16", 2)
    assert manifest["num_tokens"] == result["tokens"] == sum(len(d) for d in docs)
    assert manifest["sources"] == [{"path": str(corpus), "bytes": corpus.stat().st_size,
                                    "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}]
    # an export copies the tokenizer files from the folder the manifest names
    from sailor_core.runtime.token_manifest import tokenizer_folder

    assert tokenizer_folder(str(tmp_path / "chat.bin")) == str(tok_path.parent)
    assert tokenizer_folder("s3://bucket/chat.bin") is None and tokenizer_folder(str(tmp_path / "none.bin")) is None


def test_jsonl_text_and_parquet_columns_are_one_document_per_record(bpe, tmp_path, sailor_cli):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenizers import Tokenizer

    rows = [TEXTS[0], None, "short one", TEXTS[1], "", "last\n"]
    pq.write_table(pa.table({"id": list(range(len(rows))), "body": rows}), tmp_path / "c.parquet", row_group_size=2)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in rows))
    r = sailor_cli("data", "prepare", "-i", str(tmp_path / "c.parquet"), str(tmp_path / "c.jsonl"),
                   "--tokenizer", str(bpe), "--text-field", "body", "--out", str(tmp_path / "c.npy"), "--json")
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.from_file(str(bpe))
    kept = [t for t in rows if t]  # a null or empty value is no document
    docs = _documents(tmp_path / "c.npy", tok.token_to_id("<|endoftext|>"))
    assert [tok.decode(d[:-1].tolist()) for d in docs] == kept * 2
    assert json.loads(r.stdout)["documents"] == 2 * len(kept)

    cases = [(["-i", str(tmp_path / "c.parquet")], "c.parquet has no column 'text' (it has: id, body; name it "
                                                     "with --text-field)"),
             (["-i", str(tmp_path / "c.jsonl")], "c.jsonl line 1 has no field 'text' (it has: body"),
             (["-i", str(tmp_path / "c.jsonl"), "--messages-field", "body"], "--messages-field needs a chat template")]
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n[1, 2]\n')
    (tmp_path / "num.jsonl").write_text('{"text": 7}\n')
    cases += [(["-i", str(tmp_path / "bad.jsonl")], "bad.jsonl line 2 is not a JSON object"),
              (["-i", str(tmp_path / "num.jsonl")], "num.jsonl line 1: 'text' is int, not text")]
    for args, needle in cases:
        r = sailor_cli("data", "prepare", *args, "--tokenizer", str(bpe), "--out", str(tmp_path / "e.bin"))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
        assert not (tmp_path / "e.bin").exists() and not (tmp_path / "e.bin.manifest.json").exists()


def test_a_128k_vocabulary_corpus_round_trips_as_uint32(tmp_path, sailor_cli):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from sailor_core.runtime.data import TokenDataset

    num_words = 128_000
    vocab = {f"w{i}": i for i in range(num_words)} | {"[UNK]": num_words, "<|endoftext|>": num_words + 1}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "big").mkdir()
    tok.save(str(tmp_path / "big" / "tokenizer.json"))
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, num_words, size=n).tolist() for n in (40, 1, 77)]
    docs[0][:3] = [0, 65_535, 65_536]  # around the 16-bit edge
    docs[2][-1] = num_words - 1
    (tmp_path / "big.jsonl").write_text("".join(json.dumps({"text": " ".join(f"w{i}" for i in d)}) + "\n"
                                                for d in docs))
    r = sailor_cli("data", "prepare", "-i", str(tmp_path / "big.jsonl"), "--tokenizer",
                   str(tmp_path / "big" / "tokenizer.json"), "--out", str(tmp_path / "big.bin"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["file"] == str(tmp_path / "big.u32.bin") and result["dtype"] == "uint32"
    manifest = json.loads((tmp_path / "big.u32.bin.manifest.json").read_text())
    assert manifest["dtype"] == "uint32" and manifest["tokenizer"]["vocab_size"] == num_words + 2
    expected = [i for d in docs for i in (*d, num_words + 1)]
    # Read back as the engine reads it: one sample spanning the whole file.
    data = TokenDataset(tmp_path / "big.u32.bin", len(expected) - 1, num_words + 2)
    inputs, labels = data.samples([0])
    assert inputs[0].tolist() == expected[:-1] and labels[0].tolist() == expected[1:]
