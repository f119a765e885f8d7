"""A deterministic, resumable token dataset addressed by global sample index.

Sample ``i`` is tokens ``[i*seq, i*seq + seq + 1)`` of a flat token file
(inputs and next-token labels), wrapping around at the end (epochs).  Which
samples a micro-batch holds is a pure function of the global sample index, so
a resumed or re-planned run sees exactly the samples an uninterrupted run
would: iteration ``t`` (counted from ``first_sample``) holds samples
``first_sample + t*global_batch + m*micro_batch + b`` for micro-batch ``m``,
row ``b``.

Files: ``.npy`` (any integer dtype, 1-D) or ``.bin`` (raw little-endian
uint16, nanoGPT style; ``.u32.bin`` for uint32).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sailor_core.errors import InputError


class TokenDataset:
    def __init__(self, path: str | Path, seq_len: int, vocab_size: int | None = None) -> None:
        path = Path(path)
        if not path.exists():
            raise InputError(f"data file {str(path)!r} does not exist")
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r")
        elif path.suffix == ".bin":
            dtype = np.uint32 if path.name.endswith(".u32.bin") else np.uint16
            tokens = np.memmap(path, dtype=dtype, mode="r")
        else:
            raise InputError(f"data file {str(path)!r}: expected a .npy or .bin token file")
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise InputError(f"data file {str(path)!r} is not a 1-D array of token ids")
        self.tokens = tokens
        self.seq_len = seq_len
        self.num_samples = (len(tokens) - 1) // seq_len
        if self.num_samples < 1:
            raise InputError(f"data file {str(path)!r} holds fewer than {seq_len + 1} tokens")
        if vocab_size is not None and len(tokens) and int(tokens[: 1 << 16].max()) >= vocab_size:
            raise InputError(f"data file {str(path)!r} has token ids >= the model's vocabulary "
                             f"size {vocab_size}")

    def samples(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels), each int64 [len(indices), seq_len]."""
        rows = []
        for i in indices:
            start = (i % self.num_samples) * self.seq_len
            rows.append(np.asarray(self.tokens[start: start + self.seq_len + 1], dtype=np.int64))
        batch = torch.from_numpy(np.stack(rows))
        return batch[:, :-1], batch[:, 1:]

    def microbatch(self, first_sample: int, iteration: int, microbatch: int,
                   global_batch_size: int, micro_batch_size: int):
        base = first_sample + iteration * global_batch_size + microbatch * micro_batch_size
        return self.samples(list(range(base, base + micro_batch_size)))


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
