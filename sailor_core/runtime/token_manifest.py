"""The manifest ``sailor data prepare`` writes beside a token file, and the check of it against a model.

``tokens.bin`` gets ``tokens.bin.manifest.json``: the tokenizer (path, name, vocabulary size),
the end-of-text id, the dtype, the numbers of documents and tokens, and each source file with
its SHA-256.  ``sailor train --data`` reads it before renting (``tasks/jobs.check_data``): a
vocabulary larger than the model's would index past its embedding on the workers, and a
manifest whose token count is not the file's describes another file.  A token file without a
manifest (made by other tools) is taken as before.

Torch-free: the flow and the CLI read it without loading the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sailor_core.errors import InputError

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceFile:
    path: str
    num_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenManifest:
    tokenizer_path: str
    tokenizer_name: str
    vocab_size: int
    eos_id: int | None
    dtype: str  # "uint16" or "uint32"
    num_documents: int
    num_tokens: int
    sources: tuple[SourceFile, ...]

    def to_dict(self) -> dict:
        return {"version": MANIFEST_VERSION,
                "tokenizer": {"path": self.tokenizer_path, "name": self.tokenizer_name,
                              "vocab_size": self.vocab_size},
                "eos_id": self.eos_id, "dtype": self.dtype, "num_documents": self.num_documents,
                "num_tokens": self.num_tokens,
                "sources": [{"path": s.path, "bytes": s.num_bytes, "sha256": s.sha256} for s in self.sources]}

    @classmethod
    def from_dict(cls, data: dict, *, where: str) -> TokenManifest:
        try:
            tok = data["tokenizer"]
            vocab_size = tok["vocab_size"]
            if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
                raise ValueError(f"vocab_size {vocab_size!r} is not a positive integer")
            return cls(tokenizer_path=str(tok.get("path", "")), tokenizer_name=str(tok.get("name", "")),
                       vocab_size=vocab_size, eos_id=data.get("eos_id"), dtype=str(data["dtype"]),
                       num_documents=int(data["num_documents"]), num_tokens=int(data["num_tokens"]),
                       sources=tuple(SourceFile(path=str(s["path"]), num_bytes=int(s["bytes"]),
                                                sha256=str(s["sha256"])) for s in data.get("sources", ())))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"token manifest {where!r} is malformed: {exc}") from None


def manifest_path(token_file: str | Path) -> Path:
    path = Path(str(token_file).removeprefix("file://"))
    return path.with_name(path.name + MANIFEST_SUFFIX)


def write_manifest(token_file: Path, manifest: TokenManifest) -> Path:
    path = manifest_path(token_file)
    path.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(token_file: str | Path) -> TokenManifest | None:
    """The manifest beside a local token file, or None when there is none."""
    path = manifest_path(token_file)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"token manifest {str(path)!r} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"token manifest {str(path)!r} is malformed: not a JSON object")
    return TokenManifest.from_dict(data, where=str(path))


def tokenizer_folder(token_file: str) -> str | None:
    """The folder of the tokenizer a local token file was prepared with, as its manifest names it
    (None: a URL, no manifest, or a tokenizer no longer there): an export copies its files."""
    if "://" in token_file and not token_file.startswith("file://"):
        return None
    manifest = read_manifest(token_file)
    if manifest is None or not manifest.tokenizer_path:
        return None
    folder = Path(manifest.tokenizer_path).parent
    return str(folder) if folder.is_dir() else None


def check_manifest(token_file: str | Path, num_tokens: int, model: str, model_vocab_size: int) -> None:
    """InputError when the manifest beside a token file of ``num_tokens`` describes another file (a
    stale one: it would vouch for ids it never saw), or names a tokenizer with ids the model cannot embed."""
    manifest = read_manifest(token_file)
    if manifest is None:
        return
    if manifest.num_tokens != num_tokens:
        raise InputError(f"token manifest {str(manifest_path(token_file))!r} describes {manifest.num_tokens:,} tokens, "
                         f"but {str(token_file)!r} holds {num_tokens:,}: prepare the file again or delete the manifest")
    if manifest.vocab_size > model_vocab_size:
        name = manifest.tokenizer_name or manifest.tokenizer_path
        raise InputError(f"data {str(token_file)!r} was prepared with tokenizer {name!r} of {manifest.vocab_size:,} "
                         f"ids; model {model!r} has a vocabulary of {model_vocab_size:,} (token ids must be below it)")
