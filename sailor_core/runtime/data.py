"""A deterministic, resumable token dataset addressed by global sample index.

Sample ``p`` of a flat token file is tokens ``[p*seq, p*seq + seq + 1)`` (inputs and
next-token labels); the file holds ``(num_tokens - 1) // seq`` samples.  The last ones
(``validation_fraction`` of them, at least one global batch) are held out for the
validation loss; training sample ``i`` is position ``i mod num_train_samples`` (epochs wrap
around before the held-out part, which training never sees).  Which samples a micro-batch
holds is a pure function of the global sample index, so a resumed or re-planned run sees
exactly the samples an uninterrupted run would: iteration ``t`` (counted from
``first_sample``) holds samples ``first_sample + t*global_batch + m*micro_batch + b`` for
micro-batch ``m``, row ``b``.  Validation batch ``v`` holds held-out positions
``num_train + (v*global_batch + m*micro_batch + b) mod num_val``.

Files: ``.bin`` (raw little-endian uint16, nanoGPT style), ``.u32.bin`` (uint32) or
``.npy`` (any integer dtype, 1-D), as a local path, ``file://``, ``s3://`` or ``gs://`` URL.
A local file is memory-mapped.  Object storage is read with range requests of exactly the
bytes a micro-batch needs (its samples are consecutive: one span of
``n*seq + 1`` tokens) through ``sailor_core.storage``, and the spans are kept in a bounded
on-disk cache (``SpanCache``), so a resumed generation on the same instance reads its
redone steps and the validation batches without downloading them again.
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import io
import math
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sailor_core.errors import InputError
from sailor_core.storage import open_storage

DEFAULT_CACHE_MAX_BYTES = 2 << 30
_NPY_HEADER_PROBE_BYTES = 4096
_SPAN_FILE = re.compile(r"^(\d+)-(\d+)$")


def is_remote(url: str | Path) -> bool:
    return urllib.parse.urlsplit(str(url)).scheme in ("s3", "gs")


def _local_path(url: str | Path) -> Path:
    parsed = urllib.parse.urlsplit(str(url))
    return Path(parsed.path) if parsed.scheme == "file" else Path(url)


def _bin_dtype(name: str) -> np.dtype | None:
    if name.endswith(".u32.bin"):
        return np.dtype("<u4")
    if name.endswith(".bin"):
        return np.dtype("<u2")
    return None


# ---- where the tokens come from ------------------------------------------------------------


class _LocalTokens:
    """A memory-mapped local token file."""

    def __init__(self, url: str | Path) -> None:
        path = _local_path(url)
        if not path.exists():
            raise InputError(f"data file {str(path)!r} does not exist")
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r")
        elif (dtype := _bin_dtype(path.name)) is not None:
            tokens = np.memmap(path, dtype=dtype, mode="r")
        else:
            raise InputError(f"data file {str(path)!r}: expected a .bin, .u32.bin or .npy token file")
        _check_tokens_array(str(path), tokens.ndim, tokens.dtype)
        self.tokens = tokens
        self.num_tokens = len(tokens)

    def read(self, start: int, end: int) -> np.ndarray:
        return np.asarray(self.tokens[start:end], dtype=np.int64)


def _check_tokens_array(where: str, ndim: int, dtype: np.dtype) -> None:
    if ndim != 1 or not np.issubdtype(dtype, np.integer):
        raise InputError(f"data file {where!r} is not a 1-D array of token ids")


class _RemoteTokens:
    """A token file in object storage, read by byte ranges (through the span cache when given)."""

    def __init__(self, url: str, cache: SpanCache | None) -> None:
        root, _, key = str(url).rpartition("/")
        if "://" not in root or not key:
            raise InputError(f"data URL {url!r} names no object")
        self.url, self.key = str(url), key
        try:
            self.storage = open_storage(root)
            size = self.storage.size(key)
        except InputError:
            raise
        except Exception as exc:  # the store's own errors (not found, denied, unreachable)
            raise InputError(f"data {url!r} cannot be read: {_first_line(exc)}") from None
        if key.endswith(".npy"):
            self.dtype, self.offset_bytes = self._npy_header(size)
        elif (dtype := _bin_dtype(key)) is not None:
            self.dtype, self.offset_bytes = dtype, 0
        else:
            raise InputError(f"data {url!r}: expected a .bin, .u32.bin or .npy token file")
        self.num_tokens = (size - self.offset_bytes) // self.dtype.itemsize
        self.cache = cache.for_source(f"{url}#{size}") if cache is not None else None

    def _npy_header(self, size: int) -> tuple[np.dtype, int]:
        """The array's dtype and where its data starts, from the header (read once)."""
        head = self._get(0, min(size, _NPY_HEADER_PROBE_BYTES))
        try:
            fh = io.BytesIO(head)
            version = np.lib.format.read_magic(fh)
            header_len_bytes = 2 if version == (1, 0) else 4
            header_len = int.from_bytes(head[8: 8 + header_len_bytes], "little")
            if 8 + header_len_bytes + header_len > len(head):
                head = self._get(0, 8 + header_len_bytes + header_len)
                fh = io.BytesIO(head)
                np.lib.format.read_magic(fh)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(fh)
        except ValueError as exc:
            raise InputError(f"data {self.url!r} is not a .npy file: {_first_line(exc)}") from None
        _check_tokens_array(self.url, len(shape), dtype)
        return np.dtype(dtype), fh.tell()

    def _get(self, start: int, end: int) -> bytes:
        try:
            return bytes(self.storage.get_range(self.key, start, end))
        except Exception as exc:  # the store's own errors: a data read that fails is bad input
            raise InputError(f"data {self.url!r}: reading bytes {start}-{end} failed: {_first_line(exc)}") from None

    def read(self, start: int, end: int) -> np.ndarray:
        lo = self.offset_bytes + start * self.dtype.itemsize
        hi = self.offset_bytes + end * self.dtype.itemsize
        data = self.cache.get(lo, hi) if self.cache is not None else None
        if data is None:
            data = self._get(lo, hi)
            if self.cache is not None:
                self.cache.put(lo, hi, data)
        return np.frombuffer(data, dtype=self.dtype).astype(np.int64)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# ---- the span cache ------------------------------------------------------------------------------


class SpanCache:
    """Byte spans of remote files kept on local disk within ``max_bytes`` (least recently used go first).

    One directory per source (URL and size); a span is a file named ``<start>-<end>``,
    written aside and renamed, so the ranks of one instance can share the cache (each evicts
    by its own count of what is there, so the sum can pass the bound by what the others added
    since they last counted).  A span is served from any cached span that contains it.
    """

    def __init__(self, root: str | Path, max_bytes: int = DEFAULT_CACHE_MAX_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._estimate_bytes: int | None = None  # what is there, as this process last counted it plus its puts

    def for_source(self, source_id: str) -> _SourceCache:
        name = hashlib.sha256(source_id.encode()).hexdigest()[:20]
        return _SourceCache(self, self.root / name)

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._files())

    def _files(self) -> list[tuple[float, int, Path]]:
        out = []
        for path in self.root.glob("*/*"):
            if _SPAN_FILE.match(path.name):
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime, st.st_size, path))
        return out

    def added(self, num_bytes: int) -> None:
        """Note a new span; past the bound, evict (the ranks sharing the cache each evict by their count)."""
        if self._estimate_bytes is None:
            self._estimate_bytes = self.total_bytes()
        else:
            self._estimate_bytes += num_bytes
        if self._estimate_bytes > self.max_bytes:
            self.evict()

    def evict(self) -> None:
        """Delete the least recently used spans until the cache is within 90 % of its bound."""
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= 0.9 * self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
        self._estimate_bytes = total


class _SourceCache:
    def __init__(self, cache: SpanCache, directory: Path) -> None:
        self.cache, self.dir = cache, directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spans = sorted((int(m.group(1)), int(m.group(2))) for name in os.listdir(self.dir)
                            if (m := _SPAN_FILE.match(name)))

    def get(self, start: int, end: int) -> bytes | None:
        i = bisect.bisect_right(self.spans, (start, math.inf))
        for s, e in reversed(self.spans[max(0, i - 4): i]):  # spans barely overlap: a few suffice
            if e < end:
                continue
            path = self.dir / f"{s}-{e}"
            try:
                with open(path, "rb") as fh:
                    fh.seek(start - s)
                    data = fh.read(end - start)
                os.utime(path)  # recently used: evicted last
            except FileNotFoundError:  # evicted by another rank meanwhile
                self.spans.remove((s, e))
                continue
            if len(data) == end - start:
                return data
        return None

    def put(self, start: int, end: int, data: bytes) -> None:
        if len(data) > self.cache.max_bytes:
            return
        path = self.dir / f"{start}-{end}"
        tmp = self.dir / f".{start}-{end}.{os.getpid()}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError:  # a full disk costs the cache, not the job
            tmp.unlink(missing_ok=True)
            return
        bisect.insort(self.spans, (start, end))
        self.cache.added(len(data))


# ---- samples -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Training positions ``[0, num_train_samples)``, held-out ``[num_train_samples, num_samples)``."""

    num_samples: int
    num_val_samples: int

    @property
    def num_train_samples(self) -> int:
        return self.num_samples - self.num_val_samples


def held_out_samples(num_samples: int, fraction: float, min_samples: int) -> int:
    """How many of the last samples are held out: ``fraction`` of them, at least ``min_samples``."""
    if fraction <= 0:
        return 0
    return max(math.ceil(fraction * num_samples), min_samples)


def split_samples(url: str, num_tokens: int, seq_len: int, *, validation_fraction: float,
                  min_val_samples: int) -> Split:
    """How a file of ``num_tokens`` tokens splits into samples of ``seq_len`` (+1 label) tokens:
    ``validation_fraction`` of them held out, at least ``min_val_samples`` (the worker's: one
    global batch).  InputError naming ``url`` when nothing is left to train on."""
    num_samples = (num_tokens - 1) // seq_len
    if num_samples < 1:
        raise InputError(f"data {url!r} holds fewer than {seq_len + 1} tokens")
    return _held_out_split(url, seq_len, num_samples,
                           held_out_samples(num_samples, validation_fraction, min_val_samples))


def _held_out_split(url: str, seq_len: int, num_samples: int, num_val_samples: int) -> Split:
    if num_val_samples >= num_samples:
        raise InputError(f"data {url!r} holds {num_samples} samples of {seq_len + 1} tokens; "
                         f"holding out {num_val_samples} for validation leaves none to train on")
    return Split(num_samples=num_samples, num_val_samples=num_val_samples)


def local_num_tokens(url: str | Path) -> int:
    """The tokens of a local token file (a path or ``file://``), read from its header or size."""
    return _LocalTokens(url).num_tokens


class TokenDataset:
    """Training and held-out samples of a token file (a path or URL), read by global sample index."""

    def __init__(self, url: str | Path, seq_len: int, vocab_size: int | None = None, *,
                 validation_fraction: float = 0.0, min_val_samples: int = 1,
                 cache: SpanCache | None = None) -> None:
        self.url = str(url)
        self.source = _RemoteTokens(self.url, cache) if is_remote(url) else _LocalTokens(url)
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.split = split_samples(self.url, self.source.num_tokens, seq_len, validation_fraction=validation_fraction,
                                   min_val_samples=min_val_samples)
        if vocab_size is not None and isinstance(self.source, _LocalTokens):
            self._check_ids(self.source.read(0, min(self.source.num_tokens, 1 << 16)), "its first tokens")

    def with_held_out(self, num_val_samples: int) -> TokenDataset:
        """The same file split another way (a checkpoint's split, kept for the rest of the job)."""
        if num_val_samples == self.split.num_val_samples:
            return self
        other = copy.copy(self)
        other.split = _held_out_split(self.url, self.seq_len, self.split.num_samples, num_val_samples)
        return other

    @property
    def num_samples(self) -> int:
        return self.split.num_samples

    def _check_ids(self, tokens: np.ndarray, where: str) -> None:
        if len(tokens) and (int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0):
            raise InputError(f"data {self.url!r} has token ids outside the model's vocabulary "
                             f"[0, {self.vocab_size}) in {where}")

    def _rows(self, positions: list[int]) -> torch.Tensor:
        """Samples at these file positions, int64 [n, seq + 1]; consecutive ones are one read."""
        seq, rows, i = self.seq_len, [], 0
        while i < len(positions):
            j = i + 1
            while j < len(positions) and positions[j] == positions[j - 1] + 1:
                j += 1
            run = self.source.read(positions[i] * seq, positions[j - 1] * seq + seq + 1)
            if self.vocab_size is not None:
                self._check_ids(run, f"samples {positions[i]}..{positions[j - 1]}")
            rows += [run[k * seq: k * seq + seq + 1] for k in range(j - i)]
            i = j
        return torch.from_numpy(np.stack(rows))

    def samples(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Training samples (inputs, labels), each int64 [len(indices), seq_len]."""
        batch = self._rows([i % self.split.num_train_samples for i in indices])
        return batch[:, :-1], batch[:, 1:]

    def microbatch(self, first_sample: int, iteration: int, microbatch: int,
                   global_batch_size: int, micro_batch_size: int):
        base = first_sample + iteration * global_batch_size + microbatch * micro_batch_size
        return self.samples(list(range(base, base + micro_batch_size)))

    def num_val_batches(self, max_batches: int, global_batch_size: int) -> int:
        """Global batches one validation runs: at most ``max_batches``, no more than the held-out
        samples fill (at least one, when any are held out)."""
        if not self.split.num_val_samples:
            return 0
        return max(1, min(max_batches, self.split.num_val_samples // global_batch_size))

    def val_microbatch(self, batch: int, microbatch: int, global_batch_size: int, micro_batch_size: int):
        """Held-out samples (inputs, labels) of micro-batch ``microbatch`` of validation batch ``batch``."""
        split = self.split
        base = batch * global_batch_size + microbatch * micro_batch_size
        rows = self._rows([split.num_train_samples + (base + b) % split.num_val_samples
                           for b in range(micro_batch_size)])
        return rows[:, :-1], rows[:, 1:]


def generate_corpus(path: str | Path, *, vocab_size: int, num_tokens: int, seed: int = 0) -> Path:
    """A small synthetic corpus with learnable structure (a noisy fixed Markov chain)."""
    rng = np.random.default_rng(seed)
    successor = rng.integers(0, vocab_size, size=vocab_size)
    noise = rng.random(num_tokens) < 0.2
    random_tokens = rng.integers(0, vocab_size, size=num_tokens)
    tokens = np.empty(num_tokens, dtype=np.int32)
    tokens[0] = random_tokens[0]
    for i in range(1, num_tokens):
        tokens[i] = random_tokens[i] if noise[i] else successor[tokens[i - 1]]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, tokens)
    return path
