"""``sailor data prepare``: the user's corpus -> a flat token file the engine reads, and its manifest.

The documents (a text file each, a JSON Lines line each, a Parquet row each: ``data_sources``)
are tokenised with the user's Hugging Face ``tokenizer.json`` (the ``tokenizers`` library, no
special tokens added) and each followed by the tokenizer's end-of-text token when it has one
(``--eos-token`` names another), so the model sees where documents end.  The output is what
``sailor_core.runtime.data`` reads: raw little-endian ``uint16`` (``.bin``) when every id fits,
``uint32`` (``.u32.bin``) otherwise, or ``.npy``; beside it ``<file>.manifest.json``
(``runtime.token_manifest``), which ``sailor train --data`` checks against the model's
vocabulary.  Inputs are read a piece at a time (text blocks cut at line ends, JSON lines,
Parquet row groups) and tokenised a batch at a time, line by line, so a large corpus never
sits in memory whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, print_json
from flows.cli.data_sources import Fields, Piece, document_pieces, load_chat_template
from sailor_core.errors import InputError
from sailor_core.runtime.token_manifest import SourceFile, TokenManifest, write_manifest

BATCH_BYTES = 4 << 20  # text per encode_batch call (the tokenizer spreads it over its threads)
UINT16_IDS = 1 << 16
# End-of-document tokens of common tokenizers, most specific first (GPT-2/NeoX, Llama 3, Llama 2/T5, Gemma).
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")

data_app = typer.Typer(help="Prepare training data.", no_args_is_help=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    path: Path
    num_tokens: int
    vocab_size: int
    dtype: str  # "uint16" or "uint32"
    eos_id: int | None
    num_documents: int
    manifest_path: Path

    def to_dict(self) -> dict:
        return {"file": str(self.path), "tokens": self.num_tokens, "vocab_size": self.vocab_size,
                "dtype": self.dtype, "eos_id": self.eos_id, "documents": self.num_documents,
                "manifest": str(self.manifest_path)}


def load_tokenizer(path: Path):
    if not path.is_file():
        raise InputError(f"tokenizer file {str(path)!r} does not exist")
    from tokenizers import Tokenizer  # lazy: the Rust extension, only for this command

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception on a malformed file
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read tokenizer {str(path)!r}: {detail}") from None


def eos_id(tokenizer, eos_token: str | None) -> int | None:
    """The id that ends each document: ``eos_token``'s, else the first of EOS_CANDIDATES the
    tokenizer knows, else None (documents are then simply concatenated)."""
    if eos_token is not None:
        found = tokenizer.token_to_id(eos_token)
        if found is None:
            raise InputError(f"--eos-token {eos_token!r} is not in the tokenizer's vocabulary")
        return found
    return next((i for t in EOS_CANDIDATES if (i := tokenizer.token_to_id(t)) is not None), None)


def output_path(out: Path, vocab_size: int) -> tuple[Path, str]:
    """Where the tokens go and as what: ``.bin`` holds uint16 ids, so a larger vocabulary writes
    ``<name>.u32.bin`` beside it."""
    fits = vocab_size <= UINT16_IDS
    if out.name.endswith(".u32.bin"):
        return out, "uint32"
    if out.suffix == ".bin":
        return (out, "uint16") if fits else (out.with_name(out.name[: -len(".bin")] + ".u32.bin"), "uint32")
    if out.suffix == ".npy":
        return out, "uint16" if fits else "uint32"
    raise InputError(f"--out {str(out)!r} must end in .bin, .u32.bin or .npy")


def prepare(inputs: Sequence[Path], tokenizer_path: Path, out: Path, *, eos_token: str | None = None,
            fields: Fields = Fields(), on_progress: Callable[[int, int], None] | None = None) -> Prepared:
    """Tokenise the documents of ``inputs`` into ``out``, each followed by the end-of-text id, and
    write the manifest beside it; ``on_progress(files_done, bytes_done)``."""
    import numpy as np  # lazy: only this command needs it

    if not inputs:
        raise InputError("no input files: name them with --input")
    for path in inputs:
        if not path.is_file():
            raise InputError(f"input file {str(path)!r} does not exist")
    tokenizer = load_tokenizer(tokenizer_path)
    chat = load_chat_template(tokenizer_path) if fields.messages is not None else None
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    eos = eos_id(tokenizer, eos_token)
    path, dtype = output_path(out, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    num_tokens, num_docs, bytes_done = 0, 0, 0  # text tokens, documents, input bytes read
    try:
        with open(tmp, "wb") as fh:
            for files_done, src in enumerate(inputs, 1):
                for batch in _batches(document_pieces(src, fields, chat)):
                    tokens, docs = _write(fh, tokenizer, batch, eos, np.dtype("<u4" if dtype == "uint32" else "<u2"))
                    num_tokens, num_docs = num_tokens + tokens, num_docs + docs
                    bytes_done += sum(p.num_bytes for p in batch)
                    if on_progress:
                        on_progress(files_done - 1, bytes_done)
                if on_progress:
                    on_progress(files_done, bytes_done)
        if num_tokens == 0:
            raise InputError("no tokens: the input files hold no text")
        num_tokens += num_docs if eos is not None else 0
        if path.suffix == ".npy":
            _raw_to_npy(tmp, num_tokens, dtype, np)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    manifest = TokenManifest(tokenizer_path=str(tokenizer_path.resolve()), tokenizer_name=_tokenizer_name(tokenizer_path),
                             vocab_size=vocab_size, eos_id=eos, dtype=dtype, num_documents=num_docs,
                             num_tokens=num_tokens, sources=tuple(_source(p) for p in inputs))
    return Prepared(path=path, num_tokens=num_tokens, vocab_size=vocab_size, dtype=dtype, eos_id=eos,
                    num_documents=num_docs, manifest_path=write_manifest(path, manifest))


def _tokenizer_name(tokenizer_path: Path) -> str:
    """The tokenizer's folder (a model's name, as Hugging Face lays them out), else its file."""
    folder = tokenizer_path.resolve().parent.name
    return folder or tokenizer_path.name


def _source(path: Path) -> SourceFile:
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    return SourceFile(path=str(path.resolve()), num_bytes=path.stat().st_size, sha256=digest)


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    """Pieces in groups of about BATCH_BYTES of text, one encode_batch call each."""
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece.text)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write(fh, tokenizer, batch: list[Piece], eos: int | None, dtype) -> tuple[int, int]:
    """Write the batch's ids, an end-of-text id after each document's last piece: (text tokens, documents)."""
    import numpy as np  # lazy: with the command

    # Line by line: the same ids up to where whitespace runs cross a line end, and about twice
    # as fast as whole blocks (shorter inputs for BPE's merges).
    lines_per_piece = [p.text.splitlines(keepends=True) for p in batch]
    encodings = tokenizer.encode_batch_fast([line for lines in lines_per_piece for line in lines],
                                            add_special_tokens=False)
    ids: list[int] = []
    num_docs, at = 0, 0
    for piece, lines in zip(batch, lines_per_piece):
        for enc in encodings[at: at + len(lines)]:
            ids.extend(enc.ids)
        at += len(lines)
        if piece.ends_document:
            num_docs += 1
            if eos is not None:
                ids.append(eos)
    np.asarray(ids, dtype=dtype).tofile(fh)
    return len(ids) - (num_docs if eos is not None else 0), num_docs


def _raw_to_npy(tmp: Path, num_tokens: int, dtype: str, np) -> None:
    """Put a .npy header in front of the raw ids (the count is known only at the end)."""
    import shutil  # lazy: with numpy, for this command only

    header_tmp = tmp.with_name(tmp.name + ".npy")
    with open(header_tmp, "wb") as out, open(tmp, "rb") as raw:
        np.lib.format.write_array_header_1_0(out, {"descr": "<u4" if dtype == "uint32" else "<u2",
                                                   "fortran_order": False, "shape": (num_tokens,)})
        shutil.copyfileobj(raw, out, 16 << 20)
    os.replace(header_tmp, tmp)


@data_app.command("prepare")
def prepare_cmd(
    inputs: Optional[list[Path]] = typer.Option(
        None, "--input", "-i", help="text files (UTF-8, one document each), .jsonl (one per line) or .parquet "
                                    "(one per row); more may follow"),
    more_inputs: Optional[list[Path]] = typer.Argument(None, help="more input files", show_default=False),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="the model's Hugging Face tokenizer.json"),
    out: Path = typer.Option(..., "--out", "-o",
                             help="tokens.bin (uint16 ids; NAME.u32.bin when the vocabulary needs 32 bits), "
                                  "tokens.u32.bin or tokens.npy"),
    eos_token: Optional[str] = typer.Option(
        None, "--eos-token", help="the token that ends each document (default: the tokenizer's end-of-text token)"),
    text_field: str = typer.Option("text", "--text-field",
                                   help="the .jsonl field or .parquet column that holds each document's text"),
    messages_field: Optional[str] = typer.Option(
        None, "--messages-field", help="the .jsonl field or .parquet column of chat messages ([{role, content}]), "
                                       "rendered with the chat template of tokenizer_config.json beside the tokenizer"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Tokenise a corpus into a token file for `sailor train --data` (a path, or upload it to s3:// or gs://)."""
    files = [*(inputs or []), *(more_inputs or [])]
    total_bytes = sum(p.stat().st_size for p in files if p.is_file())
    with _progress(len(files), total_bytes, show=not as_json and sys.stderr.isatty()) as on_progress:
        result = prepare(files, tokenizer, out, eos_token=eos_token, on_progress=on_progress,
                         fields=Fields(text=text_field, messages=messages_field))
    if as_json:
        print_json(result.to_dict())
        return
    eos = "no end-of-text token" if result.eos_id is None else f"documents end with id {result.eos_id}"
    docs = f"{result.num_documents} document" + ("s" if result.num_documents != 1 else "")
    console().print(f"wrote {result.num_tokens:,} tokens ({docs}, {eos}; "
                    f"vocabulary {result.vocab_size:,}, {result.dtype}) to {result.path}; manifest {result.manifest_path}")


@contextlib.contextmanager
def _progress(num_files: int, total_bytes: int, *, show: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A Rich bar on stderr, files done and bytes read (``None`` when ``show`` is off: not a terminal)."""
    if not show:
        yield None
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"files 0/{num_files}", total=total_bytes or None)
        yield lambda files, done: bar.update(task, completed=done, description=f"files {files}/{num_files}")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
