"""Checkpoints that do not stop training: a save is staged in CPU memory at its step, then written
in the background (as torchtitan's asynchronous checkpointing: a staging copy, then a writer thread).

Staging (``stage``) runs on the training thread, with the collectives a synchronous save runs:
replica 0 of each stage TP-gathers its layers' full tensors and AdamW moments (under ZeRO every DP
rank first all-gathers the moments), copies that ``stage_checkpoint.layer_states`` already makes, and
moves them to the CPU; the meta is taken at the same step.  A writer thread then serializes and
stores this rank's layer files, and the ranks commit together over a gloo group of their own (the
files' checksums all-gathered, rank 0 writes meta and manifest, a barrier), so the writer's
collectives never interleave with the training thread's.  The files are a synchronous save's,
bit for bit (``tests/runtime/test_async_checkpoint.py``).

At most one save is in flight: a new save first waits for the previous one.  When writing takes
longer than the checkpoint interval, training slows to the storage's pace instead of skipping
checkpoints, so one exists every ``--ckpt-every`` steps as the replay and the controller assume.
``save_now`` (the emergency save on a preemption notice, the agent's stop, the run's last step)
waits for the one in flight, then saves on the training thread: both are complete when it returns.
A stop lets the write in flight commit first (``wait``; it holds the newest state no older than
one interval) and only then writes its own, so a stop cut short still loses at most one interval;
``on_write`` is told of every piece of every write (``runtime/save_note.py``: the agent waits
while a stopping worker's saves progress).

A checkpoint counts when its manifest is written, as before; the worker reports it (its
``checkpoint`` metrics line, which the job records) only once ``committed`` returns its step.  A
writer's failure is raised on the training thread by the next ``committed``, ``wait`` or save:
an ``OSError`` there is this rank's checkpoint I/O, as in a synchronous save.
Memory: until written, the rank's share of the checkpoint (its full layers' parameters and both
moments) is held a second time, in CPU memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime import faults
from sailor_core.runtime.save_note import COMMITTED, FILE, STAGED
from sailor_core.runtime.stage_checkpoint import checkpoint_meta, layer_states, save_layers
from sailor_core.runtime.trainer import StageTrainer
from sailor_core.storage import Storage


@dataclass(frozen=True, slots=True, kw_only=True)
class StagedCheckpoint:
    """A rank's share of the checkpoint of ``step``, in CPU memory, detached from training."""

    step: int
    layers: tuple[tuple[int, dict[str, dict[str, torch.Tensor]]], ...]  # (layer index, its state)
    meta: dict[str, Any]


def stage(trainer: StageTrainer) -> StagedCheckpoint:
    """The trainer's state at its step, copied to the CPU (a collective, as a save is)."""
    layers = tuple((i, {k: {n: t.detach().cpu() for n, t in v.items()} for k, v in state.items()})
                   for i, state in layer_states(trainer))
    return StagedCheckpoint(step=trainer.step, layers=layers, meta=checkpoint_meta(trainer))


def _ignore(what: str) -> None:
    pass


def save_sync(trainer: StageTrainer, storage: Storage, keep: int, rank: int,
              on_write: Callable[[str], None] = _ignore) -> None:
    """Write the checkpoint of the trainer's step on this thread; committed when it returns
    (``on_write``: told ``STAGED``, each ``FILE``, ``COMMITTED``, as ``save_note.SaveProgress`` takes them)."""
    on_write(STAGED)
    files = save_layers(trainer, storage, on_file=lambda: on_write(FILE))
    commit_together(storage, trainer.step, files, checkpoint_meta(trainer), keep=keep, rank=rank)
    on_write(COMMITTED)


def write_staged(storage: Storage, staged: StagedCheckpoint,
                 on_write: Callable[[str], None] = _ignore) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for layer_index, state in staged.layers:
        files.update(ckpt.write_layer(storage, staged.step, layer_index, state))
        on_write(FILE)
    return files


def commit_together(storage: Storage, step: int, files: dict, meta: dict, *, keep: int, rank: int,
                    group: dist.ProcessGroup | None = None) -> None:
    """Every rank's files written: rank 0 commits the checkpoint (meta, then the manifest), and
    every rank returns once it is committed (``group``: the ranks' group to agree over)."""
    faults.at(faults.BEFORE_COMMIT, rank=rank, step=step)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, files, group=group)
    if rank == 0:
        merged: dict = {}
        for f in gathered:
            merged.update(f)
        ckpt.commit(storage, step, merged, meta, keep=keep)
    dist.barrier(group=group)


class CheckpointWriter:
    """A rank's checkpoints: written in the background (``save_async``) or now (``save_now``), at
    most one in flight.  Every rank makes the same calls at the same steps (they are collectives).

    ``on_wait(step)`` is told when a save or ``wait`` has to wait for the write of ``step``;
    ``on_write(what)`` of every piece of every write, from the thread that did it."""

    def __init__(self, storage: Storage, *, keep: int, rank: int,
                 on_wait: Callable[[int], None] | None = None, on_write: Callable[[str], None] = _ignore) -> None:
        self.storage, self.keep, self.rank, self.on_wait, self.on_write = storage, keep, rank, on_wait, on_write
        self._group: dist.ProcessGroup | None = None  # the writers' own, made at the first background save
        self._thread: threading.Thread | None = None
        self._in_flight: int | None = None
        self._error: BaseException | None = None
        self._committed: list[int] = []

    @property
    def in_flight(self) -> int | None:
        """The step whose write is under way (or done but not yet collected), if any."""
        return self._in_flight

    def save_async(self, trainer: StageTrainer) -> None:
        """Stage the trainer's state and write it in the background (after the previous write)."""
        self.wait()
        self.on_write(STAGED)
        staged = stage(trainer)
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        self._in_flight = staged.step
        self._thread = threading.Thread(target=self._write, args=(staged,), daemon=True,
                                        name=f"checkpoint-step-{staged.step}")
        self._thread.start()

    def save_now(self, trainer: StageTrainer) -> None:
        """Wait for the write in flight, then save the trainer's step on this thread."""
        self.wait()
        save_sync(trainer, self.storage, self.keep, self.rank, self.on_write)
        self._committed.append(trainer.step)

    def wait(self) -> None:
        """Until no write is in flight; raises the writer's error if it failed."""
        if self._thread is None:
            return
        if self._thread.is_alive() and self.on_wait is not None:
            self.on_wait(self._in_flight)
        self._collect()

    def committed(self) -> list[int]:
        """The steps committed since the last call, oldest first (without waiting); raises the
        writer's error if it failed."""
        if self._thread is not None and not self._thread.is_alive():
            self._collect()
        out, self._committed = self._committed, []
        return out

    def _collect(self) -> None:
        self._thread.join()
        step, self._thread, self._in_flight = self._in_flight, None, None
        error, self._error = self._error, None
        if error is not None:
            raise error
        self._committed.append(step)

    def _write(self, staged: StagedCheckpoint) -> None:
        try:
            files = write_staged(self.storage, staged, self.on_write)
            commit_together(self.storage, staged.step, files, staged.meta, keep=self.keep, rank=self.rank,
                            group=self._group)
            self.on_write(COMMITTED)
        except BaseException as exc:  # raised again on the training thread (_collect)
            self._error = exc
