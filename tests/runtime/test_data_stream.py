"""Token files in object storage: exact range reads, the span cache, the held-out split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sailor_core.errors import InputError
from sailor_core.runtime import data as data_mod
from sailor_core.runtime.data import SpanCache, TokenDataset

SEQ = 16
VOCAB = 512


def _tokens(n: int = 2000, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n)


class CountingStorage:
    """A local directory behind the storage interface the data path uses, counting what it reads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.reads: list[tuple[str, int, int]] = []

    def size(self, key: str) -> int:
        path = self.root / key
        if not path.exists():
            raise FileNotFoundError(f"no object {key}")
        return path.stat().st_size

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.reads.append((key, start, end))
        with open(self.root / key, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    store = CountingStorage(tmp_path / "bucket")
    store.root.mkdir()
    monkeypatch.setattr(data_mod, "open_storage", lambda url: store)
    return store


def _same(a, b) -> bool:
    return all(bool((x == y).all()) for x, y in zip(a, b))


def test_s3_stream_gives_the_local_samples(tmp_path, moto_s3):
    import boto3

    tokens = _tokens()
    local_bin, local_npy = tmp_path / "t.bin", tmp_path / "t.npy"
    tokens.astype("<u2").tofile(local_bin)
    np.save(local_npy, tokens.astype(np.int32))
    s3 = boto3.client("s3", endpoint_url=moto_s3)
    s3.create_bucket(Bucket="corpus")
    s3.upload_file(str(local_bin), "corpus", "tok/t.bin")
    s3.upload_file(str(local_npy), "corpus", "tok/t.npy")
    for local, url in ((local_bin, "s3://corpus/tok/t.bin"), (local_npy, "s3://corpus/tok/t.npy")):
        here = TokenDataset(local, SEQ, VOCAB, validation_fraction=0.05, min_val_samples=4)
        there = TokenDataset(url, SEQ, VOCAB, validation_fraction=0.05, min_val_samples=4,
                             cache=SpanCache(tmp_path / "cache"))
        assert here.split == there.split
        n = here.split.num_train_samples
        # several global sample indices, across the end of the training part (wrap-around) and epochs
        for indices in ([0], [1, 2, 3], [n - 2, n - 1, n, n + 1], [3 * n + 5], [7, 3, 7]):
            assert _same(here.samples(indices), there.samples(indices)), (url, indices)
        assert _same(here.microbatch(0, 10, 1, 8, 4), there.microbatch(0, 10, 1, 8, 4))
        assert _same(here.val_microbatch(1, 1, 8, 4), there.val_microbatch(1, 1, 8, 4))


def test_a_rank_reads_exactly_the_bytes_of_its_microbatches_once(tmp_path, bucket):
    tokens = _tokens()
    tokens.astype("<u2").tofile(bucket.root / "t.bin")
    cache = SpanCache(tmp_path / "cache")
    ds = TokenDataset("s3://b/t.bin", SEQ, VOCAB, cache=cache)
    assert bucket.reads == []  # opening reads the size only
    x, y = ds.microbatch(first_sample=3, iteration=2, microbatch=1, global_batch_size=8, micro_batch_size=4)
    first = 3 + 2 * 8 + 4  # sample 23: tokens [23*16, 27*16 + 1), one span of 2-byte ids
    assert bucket.reads == [("t.bin", first * SEQ * 2, (first + 4) * SEQ * 2 + 2)]
    assert (x.numpy() == np.stack([tokens[(first + b) * SEQ:(first + b + 1) * SEQ] for b in range(4)])).all()
    assert (y[:, -1].numpy() == [tokens[(first + b + 1) * SEQ] for b in range(4)]).all()

    # a resumed generation on the same instance: its redone micro-batch, and one inside it, come from the cache
    again = TokenDataset("s3://b/t.bin", SEQ, VOCAB, cache=SpanCache(tmp_path / "cache"))
    assert _same(again.microbatch(3, 2, 1, 8, 4), (x, y))
    assert _same(again.samples([first + 1, first + 2]), ds.samples([first + 1, first + 2]))
    assert len(bucket.reads) == 1

    # samples that wrap around the end of the file are two spans
    n = ds.split.num_train_samples
    ds.samples([n - 1, n, n + 1])
    assert bucket.reads[1:] == [("t.bin", (n - 1) * SEQ * 2, n * SEQ * 2 + 2), ("t.bin", 0, 2 * SEQ * 2 + 2)]


def test_npy_in_object_storage_reads_its_header_once(tmp_path, bucket):
    tokens = _tokens()
    np.save(bucket.root / "t.npy", tokens.astype(np.int32))
    ds = TokenDataset("gs://b/t.npy", SEQ, VOCAB, cache=None)
    assert len(bucket.reads) == 1 and bucket.reads[0][1] == 0  # the header
    offset = (bucket.root / "t.npy").stat().st_size - tokens.size * 4
    x, _ = ds.samples([5])
    assert bucket.reads[1] == ("t.npy", offset + 5 * SEQ * 4, offset + 6 * SEQ * 4 + 4)
    assert (x.numpy()[0] == tokens[5 * SEQ: 6 * SEQ]).all()


def test_the_cache_keeps_within_its_bound(tmp_path, bucket):
    _tokens(20_000).astype("<u2").tofile(bucket.root / "t.bin")
    bound = 8 * (4 * SEQ + 1) * 2  # room for about 8 micro-batches
    cache = SpanCache(tmp_path / "cache", max_bytes=bound)
    ds = TokenDataset("s3://b/t.bin", SEQ, VOCAB, cache=cache)
    for it in range(40):
        ds.microbatch(0, it, 0, 4, 4)
    assert cache.total_bytes() <= bound
    assert len(bucket.reads) == 40
    ds.microbatch(0, 39, 0, 4, 4)  # the most recent is still there
    assert len(bucket.reads) == 40


def test_held_out_samples_are_never_trained_on(tmp_path):
    path = tmp_path / "t.bin"
    _tokens(1601).astype("<u2").tofile(path)  # 100 samples of 16 + 1 tokens
    ds = TokenDataset(path, SEQ, VOCAB, validation_fraction=0.01, min_val_samples=8)
    assert (ds.split.num_samples, ds.split.num_val_samples, ds.split.num_train_samples) == (100, 8, 92)
    assert TokenDataset(path, SEQ, VOCAB, validation_fraction=0.2, min_val_samples=8).split.num_val_samples == 20
    assert TokenDataset(path, SEQ, VOCAB, validation_fraction=0.0).split.num_val_samples == 0
    val_rows = {tuple(r) for v in range(3) for m in range(2)
                for r in np.concatenate([t.numpy() for t in ds.val_microbatch(v, m, 8, 4)], axis=1)}
    train_rows = {tuple(r) for i in range(0, 400, 8)
                  for r in np.concatenate([t.numpy() for t in ds.samples(list(range(i, i + 8)))], axis=1)}
    assert len(val_rows) == 8 and not val_rows & train_rows  # epochs wrap before the held-out part
    assert ds.num_val_batches(2, 8) == 1 and ds.num_val_batches(2, 4) == 2
    assert ds.with_held_out(20).split.num_train_samples == 80
    with pytest.raises(InputError, match="leaves none to train on"):
        TokenDataset(path, SEQ, VOCAB, validation_fraction=0.5, min_val_samples=100)


def test_bad_data_is_one_clear_error(tmp_path, bucket):
    with pytest.raises(InputError, match="cannot be read: no object missing.bin"):
        TokenDataset("s3://b/missing.bin", SEQ, VOCAB)
    with pytest.raises(InputError, match="expected a .bin, .u32.bin or .npy"):
        (bucket.root / "t.txt").write_bytes(b"x" * 100)
        TokenDataset("s3://b/t.txt", SEQ, VOCAB)
    tokens = _tokens()
    tokens[40 * SEQ] = VOCAB + 3
    tokens.astype("<u2").tofile(bucket.root / "t.bin")
    ds = TokenDataset("s3://b/t.bin", SEQ, VOCAB)
    ds.samples([0])
    with pytest.raises(InputError, match=r"outside the model's vocabulary \[0, 512\) in samples 39..40"):
        ds.samples([39, 40])


@pytest.mark.slow  # two worker processes (~8 s); the sample equality above covers the data path by default
def test_workers_train_from_s3_as_from_the_local_file(corpus, tmp_path, moto_s3):
    import boto3

    from sailor_core.runtime.launch import launch_local

    from .conftest import make_plan

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="corpus")
    boto3.client("s3", endpoint_url=moto_s3).upload_file(str(corpus), "corpus", "c.npy")
    plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
    flags = ("--validate-every", "2")
    local = launch_local(plan, 2, data=corpus, workdir=tmp_path / "local", timeout_s=240, worker_args=flags)
    remote = launch_local(plan, 2, data="s3://corpus/c.npy", workdir=tmp_path / "s3", timeout_s=240, worker_args=flags)
    assert local.status == remote.status == "ok", (remote.message, remote.stderr_tails)
    assert remote.losses == local.losses and remote.val_losses == local.val_losses
    assert list((tmp_path / "s3" / "data-cache").glob("*/*"))  # the spans the ranks read, kept
