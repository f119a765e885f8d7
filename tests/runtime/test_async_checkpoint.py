"""Checkpoints written in the background (runtime/checkpoint_writer.py): the same bytes as a
synchronous save, training on while the write is under way, atomic when the write fails, and a
save that must be complete (a preemption's) waiting for the write in flight.

A real crash (SIGKILL) in the middle of a background write is ``test_resume_and_faults``'
``test_crash_during_save_leaves_previous_checkpoint_usable`` (its workers save in the background).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.launch import launch_local
from sailor_core.runtime.recipe import Recipe
from sailor_core.storage import open_storage

from .conftest import make_plan

GATE_WAIT_S = 120.0  # a bound against a hang only: every wait below is released by an event


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trainer(corpus):
    import torch

    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.process_groups import make_groups
    from sailor_core.runtime.trainer import StageTrainer

    plan = make_plan("tiny", [(0, 4, [1])], gbs=4)
    spec = get_model(plan.model)
    data = TokenDataset(str(corpus), plan.effective_seq_len(), spec.vocab_size, validation_fraction=0.0,
                        min_val_samples=0)
    return StageTrainer(plan=plan, spec=spec, rank=0, data=data, recipe=Recipe(total_steps=20), seed=3,
                        device=torch.device("cpu"), groups=make_groups(plan, 0))


class _Watched:
    """A real storage that notes every put in ``events``; a put of step ``gated_step``'s files
    first says so (``blocked``) and then waits for ``gate``; ``fail_key`` raises as a dying disk."""

    def __init__(self, url: str, events: list[str], *, gated_step: int | None = None, fail_key: str = "") -> None:
        self.inner = open_storage(url)
        self.events, self.gated_step, self.fail_key = events, gated_step, fail_key
        self.gate, self.blocked = threading.Event(), threading.Event()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def put(self, key: str, data: bytes) -> None:
        self._note(key)
        self.inner.put(key, data)

    def put_atomic(self, key: str, data: bytes) -> None:
        self._note(key)
        self.inner.put_atomic(key, data)

    def _note(self, key: str) -> None:
        if key == self.fail_key:
            raise OSError(f"injected: the disk went away writing {key}")
        if self.gated_step is not None and key.startswith(ckpt.step_dirname(self.gated_step)):
            self.blocked.set()
            assert self.gate.wait(GATE_WAIT_S), "never released"
        self.events.append(f"put {key}")


def _train(trainer, steps: int, events: list[str]) -> None:
    for _ in range(steps):
        trainer.train_step()
        events.append(f"trained {trainer.step}")


def _files(url: str, step: int) -> dict[str, bytes]:
    d = Path(url) / ckpt.step_dirname(step)
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_an_async_save_is_the_sync_save_bit_for_bit(corpus, tmp_path, one_rank_group):
    from sailor_core.runtime.checkpoint_writer import CheckpointWriter, save_sync

    trainer = _trainer(corpus)
    _train(trainer, 2, [])
    sync_url, async_url = str(tmp_path / "sync"), str(tmp_path / "async")
    save_sync(trainer, open_storage(sync_url), keep=2, rank=0)
    writer = CheckpointWriter(open_storage(async_url), keep=2, rank=0)
    writer.save_async(trainer)
    writer.wait()
    assert writer.committed() == [2]
    assert _files(async_url, 2) == _files(sync_url, 2)
    assert ckpt.latest_valid_checkpoint(async_url).step == 2


def test_training_goes_on_while_a_slow_write_is_in_flight(corpus, tmp_path, one_rank_group):
    import torch

    from sailor_core.runtime.checkpoint_writer import CheckpointWriter

    url, events = str(tmp_path / "ck"), []
    storage = _Watched(url, events, gated_step=2)
    trainer = _trainer(corpus)
    _train(trainer, 2, events)
    at_2 = {(layer.layer_index, n): p.detach().clone() for layer in trainer.model.layers
            for n, p in layer.own_parameters()}
    writer = CheckpointWriter(storage, keep=2, rank=0)
    writer.save_async(trainer)
    assert storage.blocked.wait(GATE_WAIT_S)  # the writer holds step 2's first file
    _train(trainer, 3, events)  # ... and training goes on meanwhile
    assert writer.in_flight == 2 and writer.committed() == []
    assert ckpt.latest_valid_checkpoint(url) is None  # not visible before it is whole
    events.append("released")
    storage.gate.set()
    writer.wait()
    assert writer.committed() == [2]
    manifest = f"put {ckpt.step_dirname(2)}/{ckpt.MANIFEST}"
    assert events.index("trained 5") < events.index("released") < events.index(manifest)
    assert events[-1] == manifest  # the manifest last: the commit point
    info = ckpt.latest_valid_checkpoint(url)
    assert info.step == 2 and info.meta["next_sample"] == 2 * trainer.plan.global_batch_size
    for (i, name), values in at_2.items():  # the state of step 2, not the live one of step 5
        assert torch.equal(ckpt.read_layer(storage, info, i)["params"][name], values), (i, name)
    assert any(not torch.equal(p, at_2[(layer.layer_index, n)])
               for layer in trainer.model.layers for n, p in layer.own_parameters())


def test_a_write_that_dies_midway_leaves_the_previous_checkpoint_the_newest(corpus, tmp_path, one_rank_group):
    from sailor_core.runtime.checkpoint_writer import CheckpointWriter

    url, events = str(tmp_path / "ck"), []
    storage = _Watched(url, events, fail_key=f"{ckpt.step_dirname(2)}/{ckpt.layer_filename(1)}")
    trainer = _trainer(corpus)
    writer = CheckpointWriter(storage, keep=2, rank=0)
    _train(trainer, 1, events)
    writer.save_async(trainer)
    _train(trainer, 1, events)
    writer.save_async(trainer)  # waits for step 1's, then step 2's dies after its first file
    _train(trainer, 1, events)
    with pytest.raises(OSError, match="disk went away"):  # raised on the training thread
        writer.wait()
    assert writer.committed() == [1]
    assert (tmp_path / "ck" / ckpt.step_dirname(2) / ckpt.layer_filename(0)).exists()
    assert not (tmp_path / "ck" / ckpt.step_dirname(2) / ckpt.MANIFEST).exists()
    assert ckpt.latest_valid_checkpoint(url).step == 1


def test_the_emergency_save_waits_for_the_write_in_flight(corpus, tmp_path, one_rank_group):
    from sailor_core.runtime.checkpoint_writer import CheckpointWriter

    url, events = str(tmp_path / "ck"), []
    storage = _Watched(url, events, gated_step=2)

    def on_wait(step: int) -> None:  # the worker logs this; here it lets the write go on
        events.append(f"waiting for {step}")
        storage.gate.set()

    trainer = _trainer(corpus)
    writer = CheckpointWriter(storage, keep=2, rank=0, on_wait=on_wait)
    _train(trainer, 2, events)
    writer.save_async(trainer)
    assert storage.blocked.wait(GATE_WAIT_S)
    _train(trainer, 1, events)  # the notice comes after step 3
    writer.save_now(trainer)
    assert writer.in_flight is None and writer.committed() == [2, 3]
    manifest = {s: f"put {ckpt.step_dirname(s)}/{ckpt.MANIFEST}" for s in (2, 3)}
    first_of_3 = f"put {ckpt.step_dirname(3)}/{ckpt.layer_filename(0)}"
    order = ["trained 3", "waiting for 2", manifest[2], first_of_3, manifest[3]]
    assert [events.index(e) for e in order] == sorted(events.index(e) for e in order)
    assert ckpt.latest_valid_checkpoint(url).step == 3
    assert ckpt.read_checkpoint(storage, ckpt.step_dirname(2)).step == 2  # both whole (keep 2)


def _zero_plan():
    """Stage 0 at TP 2, stage 1 two replicas under ZeRO-1: TP gathers and ZeRO's all-gather."""
    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2, "stages": [
        {"layers": [0, 2], "replicas": [{"gpu": "cpu", "tp": 2}]},
        {"layers": [2, 4], "replicas": [{"gpu": "cpu", "tp": 1}, {"gpu": "cpu", "tp": 1}], "zero": 1}]})


# two launches of four ranks (~30 s on 2 busy cores); the default run's workers save in the
# background in test_resume_and_faults and the flows' tests
@pytest.mark.slow
def test_workers_saving_in_the_background_write_the_sync_bytes(corpus, tmp_path):
    """Four ranks, a checkpoint every step: in the background (the default) and with --ckpt-sync,
    the same files; each checkpoint reported once it is committed."""
    plan, runs = _zero_plan(), {}
    for mode, extra in (("sync", ("--ckpt-sync",)), ("async", ())):
        url = str(tmp_path / f"ck-{mode}")
        res = launch_local(plan, 3, data=corpus, ckpt_dir=url, ckpt_every=1, keep=3, workdir=tmp_path / mode,
                           timeout_s=240, worker_args=("--validate-every", "0", *extra))
        assert res.status == "ok", (res.message, res.stderr_tails)
        (metrics,) = (tmp_path / mode).glob("metrics-*.jsonl")
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        assert [r["step"] for r in lines if r.get("event") == "checkpoint"] == [1, 2, 3]
        runs[mode] = (url, res.losses)
    assert runs["async"][1] == runs["sync"][1]
    for step in (1, 2, 3):
        assert _files(runs["async"][0], step) == _files(runs["sync"][0], step), step


@pytest.mark.slow
def test_a_notice_during_a_slow_background_write_still_ends_with_both_checkpoints(corpus, tmp_path):
    """A checkpoint every 2 steps whose first file takes 3 s more; SIGTERM after step 3: the
    workers wait for it, write the stop's checkpoint and exit 75, both reported in order."""
    from sailor_core.job.protocol import EXIT_PREEMPTED
    from sailor_core.runtime import faults

    from .conftest import sigterm_rank_after_step

    url, fault = str(tmp_path / "ck"), tmp_path / "upload-fault.json"
    faults.arm_upload(fault, delay_s=3.0)
    res = launch_local(make_plan("tiny", [(0, 2, [1]), (2, 4, [1])]), 40, data=corpus, ckpt_dir=url,
                       ckpt_every=2, workdir=tmp_path / "a", timeout_s=240,
                       on_started=sigterm_rank_after_step(1, 3),
                       faults=faults.FaultConfig(upload_file=str(fault)),
                       worker_args=("--validate-every", "0"))
    assert res.status == "preempted", (res.message, res.stderr_tails)
    assert set(res.exit_codes.values()) == {EXIT_PREEMPTED}
    stop = res.steps[-1]
    (metrics,) = (tmp_path / "a").glob("metrics-*.jsonl")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    reported = [r["step"] for r in lines if r.get("event") == "checkpoint"]
    assert reported[-1] == stop and reported == sorted(set(reported)) and 2 in reported
    assert ckpt.latest_valid_checkpoint(url).step == stop
