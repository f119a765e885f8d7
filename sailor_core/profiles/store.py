"""The on-disk profile format: a parquet table, one row per (model, gpu, tp, mbs, seq, layer).

Columns (one format for the shipped data, the importers, the profiler and the user's own files):

==================== ======= ==========================================================
column               type    meaning
==================== ======= ==========================================================
model                string  catalog model name (``opt-350m``)
gpu                  string  catalog GPU type (``A100-40``)
tp_degree            int64   tensor-parallel degree
micro_batch_size     int64   sequences per micro-batch
seq_len              int64   tokens per sequence
layer                int64   layer index 0..L+1 (every index present once per profile)
fwd_s                float64 forward time of one micro-batch on one GPU
bwd_s                float64 backward time of one micro-batch on one GPU
params               int64   parameters of the layer held by one GPU
activation_bytes     int64   bytes kept for backward per micro-batch per GPU
output_bytes         int64   bytes sent to the next stage per micro-batch
measured             bool    False for estimated rows
regime               string  training regime (``sailor_core.regimes``)
source               string  where the numbers come from
update_s_per_param   float64 optimizer step seconds per parameter (same on every row of a profile)
update_fixed_s       float64 optimizer step fixed seconds (same on every row of a profile)
update_measured      bool    False when the update rate was estimated
==================== ======= ==========================================================

The file's schema metadata carries ``sailor_profile_format = 1``.  pyarrow is imported only
when a file is read or written, so importing the database stays light.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from sailor_core.errors import ProfileError
from sailor_core.profiles.types import LayerProfile, ModelProfile
from sailor_core.settings import sailor_home

FORMAT_VERSION = "1"
SHIPPED_DIR = Path(__file__).parent / "data"

_KEY_COLUMNS = ("model", "gpu", "tp_degree", "micro_batch_size", "seq_len")
_COLUMNS: dict[str, str] = {
    "model": "string",
    "gpu": "string",
    "tp_degree": "int64",
    "micro_batch_size": "int64",
    "seq_len": "int64",
    "layer": "int64",
    "fwd_s": "float64",
    "bwd_s": "float64",
    "params": "int64",
    "activation_bytes": "int64",
    "output_bytes": "int64",
    "measured": "bool_",
    "regime": "string",
    "source": "string",
    "update_s_per_param": "float64",
    "update_fixed_s": "float64",
    "update_measured": "bool_",
}


def user_profiles_dir() -> Path:
    """Where ``sailor profiles import`` and ``sailor profile`` write: $SAILOR_HOME/profiles or ~/.sailor/profiles."""
    return sailor_home() / "profiles"


def _rows(profiles: Iterable[ModelProfile]) -> dict[str, list]:
    cols: dict[str, list] = {name: [] for name in _COLUMNS}
    for p in profiles:
        for index, layer in enumerate(p.layers):
            row = {
                "model": p.model,
                "gpu": p.gpu,
                "tp_degree": p.tp_degree,
                "micro_batch_size": p.micro_batch_size,
                "seq_len": p.seq_len,
                "layer": index,
                "fwd_s": layer.fwd_s,
                "bwd_s": layer.bwd_s,
                "params": layer.params,
                "activation_bytes": layer.activation_bytes,
                "output_bytes": layer.output_bytes,
                "measured": layer.measured,
                "regime": p.regime,
                "source": p.source,
                "update_s_per_param": p.update_s_per_param,
                "update_fixed_s": p.update_fixed_s,
                "update_measured": p.update_measured,
            }
            for name, value in row.items():
                cols[name].append(value)
    return cols


def write_profiles(path: str | Path, profiles: Iterable[ModelProfile]) -> Path:
    """Write profiles to one parquet file (atomically: a reader never sees half a file)."""
    import pyarrow as pa  # lazy: pyarrow (~0.2 s) only when a file is read or written
    import pyarrow.parquet as pq  # lazy: pyarrow (~0.2 s) only when a file is read or written

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = _rows(sorted(profiles, key=lambda p: p.key))
    schema = pa.schema(
        [pa.field(name, getattr(pa, kind)()) for name, kind in _COLUMNS.items()],
        metadata={"sailor_profile_format": FORMAT_VERSION},
    )
    table = pa.table(cols, schema=schema)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def _finite_nonneg(value: float, what: str, where: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{where}: {what} must be a finite non-negative number, got {value!r}")
    return float(value)


def _read_table(path: Path):
    """The parquet file as a pyarrow Table.

    ``pyarrow.parquet`` imports ``pyarrow.dataset`` and with it pandas (about a second); the
    reader underneath it does not, and every ``sailor`` command loads the profiles.
    """
    try:
        from pyarrow._parquet import ParquetReader  # lazy: pyarrow (~0.2 s) only when a file is read
    except ImportError:  # another pyarrow layout: take the public, slower path
        import pyarrow.parquet as pq  # lazy: pyarrow (~0.2 s) only when a file is read or written

        return pq.read_table(path)
    reader = ParquetReader()
    reader.open(str(path))
    return reader.read_all()


def read_profiles(path: str | Path) -> list[ModelProfile]:
    """Read a profile parquet file; any defect raises ProfileError naming the file."""
    import pyarrow as pa  # lazy: pyarrow (~0.2 s) only when a file is read or written

    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"profile file {path} does not exist")
    try:
        table = _read_table(path)
    except FileNotFoundError:
        raise ProfileError(f"profile file {path} does not exist") from None
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProfileError(f"{path} is not a readable profile file (parquet): {first}") from None
    missing = [c for c in _COLUMNS if c not in table.column_names]
    if missing:
        raise ProfileError(f"{path}: not a Sailor profile file, missing columns {', '.join(missing)}")
    try:
        data = table.select(list(_COLUMNS)).to_pydict()
    except pa.ArrowException as exc:
        raise ProfileError(f"{path}: unreadable columns ({exc})") from None
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in range(table.num_rows):
        key = tuple(data[c][i] for c in _KEY_COLUMNS)
        if any(v is None for v in key):
            raise ProfileError(f"{path}: row {i} has an empty key column")
        groups[key].append(i)
    profiles = []
    for key, rows in groups.items():
        where = f"{path} ({'/'.join(str(k) for k in key)})"
        rows.sort(key=lambda i: data["layer"][i])
        indices = [data["layer"][i] for i in rows]
        if indices != list(range(len(rows))):
            raise ProfileError(f"{where}: layer indices must be 0..{len(rows) - 1} once each, got {indices[:8]}...")
        model, gpu, tp, mbs, seq = key
        if min(tp, mbs, seq) < 1:
            raise ProfileError(f"{where}: tp_degree, micro_batch_size and seq_len must be >= 1")
        first = rows[0]
        layers = tuple(
            LayerProfile(
                fwd_s=_finite_nonneg(data["fwd_s"][i], "fwd_s", where),
                bwd_s=_finite_nonneg(data["bwd_s"][i], "bwd_s", where),
                params=int(_finite_nonneg(data["params"][i], "params", where)),
                activation_bytes=int(_finite_nonneg(data["activation_bytes"][i], "activation_bytes", where)),
                output_bytes=int(_finite_nonneg(data["output_bytes"][i], "output_bytes", where)),
                measured=bool(data["measured"][i]),
            )
            for i in rows
        )
        profiles.append(
            ModelProfile(
                model=str(model),
                gpu=str(gpu),
                tp_degree=int(tp),
                micro_batch_size=int(mbs),
                seq_len=int(seq),
                layers=layers,
                regime=str(data["regime"][first]),
                source=str(data["source"][first]),
                update_s_per_param=_finite_nonneg(data["update_s_per_param"][first], "update_s_per_param", where),
                update_fixed_s=_finite_nonneg(data["update_fixed_s"][first], "update_fixed_s", where),
                update_measured=bool(data["update_measured"][first]),
            )
        )
    return profiles


def profile_files(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(directory.glob("*.parquet"))
