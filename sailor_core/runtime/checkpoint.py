"""Resharding checkpoints: full per-layer tensors, a manifest written last, keep the latest K.

Layout under the checkpoint URL::

    step_00000012/layer_0000.pt    full (unsharded) params + AdamW state of layer index 0
    step_00000012/...              one file per layer index
    step_00000012/meta.json        step, next global sample, model, plan it was written under, the
                                   training recipe (``recipe``: LR schedule, weight decay, clipping) and
                                   the held-out split (``data``), which a resume continues
    step_00000012/MANIFEST.json    sha256 and size of every file above; written LAST, atomically

A step directory without a manifest, or whose files do not match it, is not a
checkpoint (a crash mid-save leaves the previous one as the latest valid).
Because tensors are stored full per layer index, a checkpoint written under
one plan loads under any other stage split, DP and TP degree.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass
from typing import Any

import torch

from sailor_core.errors import InputError
from sailor_core.runtime import faults
from sailor_core.storage import Storage, open_storage

MANIFEST = "MANIFEST.json"
META = "meta.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(InputError):
    """A checkpoint that is missing, corrupt or does not fit the model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInfo:
    url: str
    dirname: str
    step: int
    meta: dict[str, Any]
    files: dict[str, dict[str, Any]]  # name -> {"sha256", "bytes"}


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


def layer_filename(layer_index: int) -> str:
    return f"layer_{layer_index:04d}.pt"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def serialize_layer(state: dict[str, dict[str, torch.Tensor]]) -> bytes:
    """``state``: {"params": {name: tensor}, "exp_avg": {...}, "exp_avg_sq": {...}}."""
    buf = io.BytesIO()
    torch.save({k: {n: t.detach().cpu() for n, t in v.items()} for k, v in state.items()}, buf)
    return buf.getvalue()


def write_layer(storage: Storage, step: int, layer_index: int,
                state: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, Any]]:
    data = serialize_layer(state)
    name = layer_filename(layer_index)
    path = f"{step_dirname(step)}/{name}"
    faults.at(faults.UPLOAD, path=path)
    storage.put(path, data)
    return {name: {"sha256": sha256(data), "bytes": len(data)}}


def commit(storage: Storage, step: int, files: dict[str, dict[str, Any]], meta: dict[str, Any],
           keep: int = 0) -> None:
    """Write meta, then the manifest (the commit point), then drop all but the latest ``keep``."""
    d = step_dirname(step)
    meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
    storage.put(f"{d}/{META}", meta_bytes)
    files = dict(files)
    files[META] = {"sha256": sha256(meta_bytes), "bytes": len(meta_bytes)}
    manifest = {"step": step, "files": files}
    storage.put_atomic(f"{d}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True).encode())
    if keep > 0:
        prune(storage, keep)


def prune(storage: Storage, keep: int) -> None:
    """Delete all but the latest ``keep`` committed checkpoints, and uncommitted older debris."""
    steps = sorted((int(m.group(1)), name) for name in storage.list_dirs()
                   if (m := _STEP_DIR.match(name)))
    committed = [s for s, name in steps if storage.exists(f"{name}/{MANIFEST}")]
    if len(committed) <= keep:
        return
    oldest_kept = committed[-keep]
    for s, name in steps:
        if s < oldest_kept:
            storage.delete_dir(name)


VERIFY_CONTENTS = "contents"  # every file read and hashed against the manifest
VERIFY_SIZES = "sizes"  # every file's stored size against the manifest: catches a torn write, reads nothing
VERIFY_NONE = "none"


def read_checkpoint(storage: Storage, dirname: str, url: str = "", verify: str = VERIFY_CONTENTS) -> CheckpointInfo:
    try:
        manifest = json.loads(storage.get(f"{dirname}/{MANIFEST}"))
    except Exception as exc:
        raise CheckpointError(f"checkpoint {dirname} has no readable manifest: {exc}") from None
    files = manifest["files"]
    assert verify in (VERIFY_CONTENTS, VERIFY_SIZES, VERIFY_NONE), verify
    for name, want in files.items() if verify != VERIFY_NONE else ():
        where = f"{dirname}/{name}"
        if verify == VERIFY_CONTENTS:
            _check(storage.get(where), want, where)
        elif storage.size(where) != want["bytes"]:
            raise CheckpointError(f"checkpoint file {where} is not the size its manifest says")
    meta = json.loads(storage.get(f"{dirname}/{META}"))
    return CheckpointInfo(url=url, dirname=dirname, step=int(manifest["step"]), meta=meta, files=files)


def _check(data: bytes, want: dict[str, Any], where: str) -> None:
    if len(data) != want["bytes"] or sha256(data) != want["sha256"]:
        raise CheckpointError(f"checkpoint file {where} does not match its manifest checksum")


def latest_valid_checkpoint(url: str, *, verify: str = VERIFY_CONTENTS,
                            storage: Storage | None = None) -> CheckpointInfo | None:
    """The newest step directory whose manifest exists and whose files match it (``verify``: their
    contents, their sizes alone, or not at all); None if none.  ``storage``: the URL's, opened by the
    caller (a worker's is metered: ``runtime/storage_meter.py``)."""
    storage = storage or open_storage(url)
    names = sorted((name for name in storage.list_dirs() if _STEP_DIR.match(name)), reverse=True)
    for name in names:
        if not storage.exists(f"{name}/{MANIFEST}"):
            continue
        try:
            return read_checkpoint(storage, name, url, verify=verify)
        except (CheckpointError, KeyError, ValueError, OSError):
            continue
    return None


def read_layer(storage: Storage, info: CheckpointInfo, layer_index: int) -> dict[str, dict[str, torch.Tensor]]:
    name = layer_filename(layer_index)
    if name not in info.files:
        raise CheckpointError(f"checkpoint {info.dirname} has no layer index {layer_index}")
    data = storage.get(f"{info.dirname}/{name}")
    _check(data, info.files[name], f"{info.dirname}/{name}")
    return torch.load(io.BytesIO(data), weights_only=True)
