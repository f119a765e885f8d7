"""The estimator's calibrations kept on disk between processes (``$SAILOR_HOME/cache/calibrations``).

Fitting one GPU's constants (``estimator.calibrate``: grids over launch time, efficiency and the
TP all-reduce) takes 10-30 ms of CPU, paid by every fresh process that estimates a profile on
that GPU: a third of ``sailor plan``'s search on a one-type request (docs/benchmarks/planner.md).
A file is named by a digest of everything the fit reads: the profiles, the GPU's and the regime's
specs, the specs of the profiled models, the GPU's intra-node link fits and the source of the
modules that compute it; so a change to any of them is a new name, never a stale answer.  The
constants are stored as JSON, whose floats read back bit for bit.  A cache that cannot be read
or written is skipped (the fit is computed as before)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import os
import struct
import sys
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.models import get_model
from sailor_core.network.model import default_network
from sailor_core.profiles import estimator as est
from sailor_core.regimes import get_regime
from sailor_core.settings import sailor_home

_FORMAT = 2
# the modules whose code the fit runs (their data enters the digest as the specs it reads)
_CODE = ("sailor_core.profiles.estimator", "sailor_core.catalog.layers", "sailor_core.catalog.models",
         "sailor_core.catalog.gpus", "sailor_core.regimes", "sailor_core.network.model", "sailor_core.network.fits")


def cache_dir() -> Path:
    return sailor_home() / "cache" / "calibrations"


def cached_calibrate(profiles: Sequence, gpu: str, regime: str) -> est.Calibration:
    """``estimator.calibrate(profiles, gpu, regime)``, read from the cache when it holds it."""
    path = cache_dir() / f"{_digest(profiles, gpu, regime)}.json"
    try:
        return _from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        pass
    cal = est.calibrate(profiles, gpu, regime)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(cal)))
        os.replace(tmp, path)  # whole or not at all: another process may be reading it
    except OSError:
        pass
    return cal


def _digest(profiles: Sequence, gpu: str, regime: str) -> str:
    spec = get_gpu(gpu)
    fits = default_network().intra_fits
    parts = [
        f"format {_FORMAT}", _code_digest(), repr(spec), repr(get_regime(regime)),
        repr(sorted((k, v) for k, v in fits.items() if k[0] == spec.name)),
        repr([get_model(m) for m in sorted({p.model for p in profiles})]),
    ]
    h = hashlib.sha256("\n".join(parts).encode())
    for profile in profiles:
        h.update(_profile_bytes(profile))
    return h.hexdigest()


# How a layer's field of each declared type is packed (8 bytes each, exact); other types by repr.
_PACKED = {"float": "d", "int": "q", "bool": "?"}


def _profile_bytes(profile) -> bytes:
    """Every field of ``profile``, exactly: its layers' fields packed column by column, the rest
    by repr.  (The repr of every layer's floats took 1.5 ms of each fresh process's first
    estimate on a GPU of 35 profiles.)"""
    names, _, _ = _fields_of(type(profile))
    out = [repr([(name, getattr(profile, name)) for name in names if name != "layers"]).encode()]
    layers = profile.layers
    if layers:
        layer_names, codes, row_of = _fields_of(type(layers[0]))
        columns = zip(*map(row_of, layers)) if len(layer_names) > 1 else ([row_of(x) for x in layers],)
        for name, code, column in zip(layer_names, codes, columns):
            try:
                out.append(struct.pack(f"<{len(column)}{code}", *column) if code else repr(list(column)).encode())
            except struct.error:  # a value not of its declared type
                out.append(repr(list(column)).encode())
            out.append(name.encode())
    out.append(str(len(layers)).encode())
    return b"\x00".join(out)


@lru_cache(maxsize=16)
def _fields_of(cls) -> tuple[tuple[str, ...], tuple[str | None, ...], Callable]:
    """(field names, their ``_PACKED`` codes (None: by repr), a getter of them all) of a dataclass."""
    fields = dataclasses.fields(cls)
    codes = tuple(_PACKED.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
                  for f in fields)
    names = tuple(f.name for f in fields)
    return names, codes, operator.attrgetter(*names)


@lru_cache(maxsize=1)
def _code_digest() -> str:
    h = hashlib.sha256()
    for name in _CODE:
        h.update(Path(sys.modules[name].__file__).read_bytes())
    return h.hexdigest()


def _from_json(data: dict) -> est.Calibration:
    return est.Calibration(**{f.name: tuple(data[f.name]) if isinstance(data[f.name], list) else data[f.name]
                              for f in dataclasses.fields(est.Calibration)})
