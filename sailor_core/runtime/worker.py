"""The worker process: ``python -m sailor_core.runtime.worker --plan PLAN.json --steps N ...``.

Rendezvous is torch's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), so the same command runs
as local processes or on cloud VMs.  ``--steps`` is the TOTAL number of optimizer steps of the
job: a resumed worker continues from the checkpoint's step up to it.

Exit codes (the orchestrator acts on them; ``sailor_core/job/protocol.py`` names them):
  0   finished all steps
  2   bad input (plan, data, checkpoint)
  75  stopped on SIGTERM / preemption notice after an emergency checkpoint
  76  stopped on SIGTERM / preemption notice without a checkpoint (no --ckpt-dir or save failed)
  77  a peer died or a collective timed out, or this rank's checkpoint I/O failed
      (the job must be restarted from the latest valid checkpoint)

Started by the agent with ``--park-dir``, a worker the agent stops (``park.SIGNAL``) checkpoints
with the others and parks: it keeps its process and state for the agent's next generation
(``sailor_core/runtime/park.py``).  Its exit code in the stopped generation counts as 75.
``--standby --park-dir DIR``: the agent's standby workers, started at boot, park at once without
state (``runtime/standby.py``).

A preemption notice is SIGTERM to any worker, the file named by
``SAILOR_PREEMPT_FILE`` appearing, or the URL in ``SAILOR_PREEMPT_URL`` (polled
every second, e.g. a spot instance-action metadata endpoint) answering 200.  Every step all ranks agree (one small
all-reduce that also carries the loss) on whether any rank was told to stop,
so they checkpoint the same step together.

Faults for tests and chaos trials strike at ``runtime/faults.py``' points; none in a real run.

Rank 0 appends one JSON line per step to ``--metrics-file``:
``{"step", "loss", "step_time_s", "cpu_time_s", "samples_per_s", "tokens_per_s", "lr",
"grad_norm", "grad_norm_clipped", "clipped", "model_flops_per_s", "peak_memory_bytes_by_rank"}``,
on CUDA ``"peak_memory_bytes"`` (rank 0's ``torch.cuda.max_memory_allocated``), and ``"mfu"``
(``"mfu_nominal"`` on a CPU device) where the
plan's GPUs have a catalog peak (``cpu_time_s``: rank 0's process CPU time in the step, all
threads; memory: each rank's high-water mark, ``runtime/metrics.py`` says how each figure is
counted and what it costs); with ``--tensorboard-url`` and the trackers' environment rank 0
logs them there too (``runtime/trackers.py``), and a last
line ``{"event": "done" | "preempted" | "peer_lost" | "error", ...}``; after every checkpoint
committed ``{"event": "checkpoint", "step", "url", "unix_s"}`` (``runtime/checkpoint_writer.py``
says when each is written and reported; ``runtime/save_note.py`` what the agent sees); ``peer_lost``
carries ``dead_ranks`` (from heartbeats through the rendezvous store).  Any rank appends its
own ``{"event": "error", "rank", "message"}`` line (bad input, its checkpoint I/O failing), and
on a plan across zones, as its generation ends, ``{"event": "egress", "rank", "egress_bytes"}``
with the bytes it sent across zones that no step line carried (``_report_unsent_egress``).
A step after which the held-out samples were evaluated (every ``--validate-every`` steps and
after the run's last step) also carries ``val_loss`` and ``val_perplexity``.

The job's options that reach the workers take their ``sailor train`` flags (``--lr``,
``--warmup-steps``, ``--val-fraction``, ``--init-from``, ...: ``sailor_core/job/worker_args.py``)
and make the ``Recipe`` (``runtime/recipe.py``); it and the held-out split are written into every
checkpoint, and ``--resume`` continues the checkpoint's, whatever these flags say.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import gc
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from sailor_core import settings
from sailor_core.catalog.models import get_model
from sailor_core.errors import SailorError
from sailor_core.job.protocol import EXIT_BAD_INPUT, EXIT_OK, EXIT_PEER_LOST, EXIT_PREEMPTED, EXIT_PREEMPTED_NO_CKPT
from sailor_core.job.worker_args import add_worker_arguments, worker_values
from sailor_core.network.storage_egress import bucket_place
from sailor_core.plan.layout import rank_layout, world_size
from sailor_core.plan.types import load_plan
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime import faults, links, park, save_note, standby, storage_meter
from sailor_core.runtime import handover as state_handover
from sailor_core.runtime.checkpoint_writer import CheckpointWriter
from sailor_core.runtime.data import DEFAULT_CACHE_MAX_BYTES, SpanCache, TokenDataset
from sailor_core.runtime.egress_meter import EgressSlots
from sailor_core.runtime.heartbeat import Heartbeat, watch_preempt_url
from sailor_core.runtime.hf import load_pretrained
from sailor_core.runtime.metrics import model_flops_per_step, peak_flops, peak_memory_bytes
from sailor_core.runtime.metrics_file import MetricsFile
from sailor_core.runtime.model import check_plan_for_engine
from sailor_core.runtime.recipe import Recipe, make_recipe
from sailor_core.runtime.process_groups import make_groups
from sailor_core.runtime.rendezvous import private_store, uses_agent_store
from sailor_core.runtime.stage_checkpoint import kept_state
from sailor_core.runtime.trackers import Trackers
from sailor_core.runtime.trainer import StageTrainer

_PARKED = -1  # not an exit: the generation ended and this worker waits for the next
_STATE_SAID = {state_handover.FROM_MEMORY: "kept in memory", state_handover.FROM_PEERS: "handed over by its peers",
               state_handover.FROM_CHECKPOINT: "read"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sailor_core.runtime.worker")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, required=True, help="total optimizer steps of the job")
    ap.add_argument("--data", required=True, help=".bin/.u32.bin/.npy token file: a path, file://, s3:// or gs:// URL")
    ap.add_argument("--data-cache-dir", default=None, help="keep the spans read from object storage here")
    ap.add_argument("--data-cache-max-bytes", type=int, default=None, help="bound of the cache (default 2 GiB)")
    ap.add_argument("--ckpt-dir", default=None, help="local path, file:// or s3:// URL")
    ap.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every K steps (0: only at the end)")
    ap.add_argument("--keep", type=int, default=2, help="keep the latest K checkpoints")
    ap.add_argument("--ckpt-sync", action="store_true",
                    help="write every checkpoint on the training thread (default: staged in CPU memory "
                         "and written in the background; the stop's and the last one are written at once)")
    ap.add_argument("--resume", action="store_true", help="start from the latest valid checkpoint")
    ap.add_argument("--seed", type=int, default=0)
    # The job's options that reach the workers, as `sailor train` spells them: the Recipe's
    # (runtime/recipe.py); a resumed run continues its checkpoint's instead.
    add_worker_arguments(ap)
    ap.add_argument("--metrics-file", default=None)
    ap.add_argument("--tensorboard-url", default=None,
                    help="rank 0 writes TensorBoard event files here (the job's <url>/tensorboard)")
    ap.add_argument("--job-id", default=None,
                    help="the job's W&B run id and MLflow job_id tag, which every attempt continues "
                         "(none: a new run each launch)")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="collective / rendezvous timeout")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep default)")
    ap.add_argument("--park-dir", default=None,
                    help="(the agent's) park here when stopped, keeping the state for the next generation")
    return ap.parse_args(argv)


@dataclass(slots=True, kw_only=True)
class _Run:
    """What one worker's training loop works with (built by ``_load_inputs`` and ``_connect``)."""

    args: argparse.Namespace
    rank: int
    plan: object
    spec: object
    data: object
    recipe: Recipe
    storage: object | None
    metrics: MetricsFile
    stop: dict
    device: object = None
    trainer: object = None
    heartbeat: object = None
    saved_step: int = -1
    flops_per_step: float = 0.0  # the model FLOPs of one step (runtime/metrics.py)
    peak_flops: float | None = None  # the plan's GPUs' summed peak; None on cpu
    trackers: Trackers | None = None  # rank 0's TensorBoard, W&B, MLflow (runtime/trackers.py)
    state_from: str = "init"  # where the trainer's state came from: init, pretrained, checkpoint, memory, peers
    egress: EgressSlots | None = None  # the status vector's egress slots (runtime/egress_meter.py)
    writer: CheckpointWriter | None = None  # the checkpoints' (runtime/checkpoint_writer.py)
    saves: save_note.SaveProgress | None = None  # the stop saves' progress, noted for the agent


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # requested: a preemption notice for this worker (exit after the checkpoint);
    # park: the agent stops the generation (checkpoint, then wait for the next one)
    stop = {"requested": False, "park": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("requested", True))
    signal.signal(park.SIGNAL, lambda *_: stop.__setitem__("park", True))
    # the agent's pid from the agent itself: one that died while this process started is noticed too
    agent_pid = settings.agent_pid() or os.getppid()
    carry = _Carry()
    args = _take_handover(standby.ready(argv), stop, agent_pid) if standby.FLAG in argv else parse_args(argv)
    while args is not None:
        code = _generation(args, stop, carry)
        if code != _PARKED:
            return code
        args = _take_handover(args.park_dir, stop, agent_pid)
    return EXIT_PREEMPTED


def _take_handover(park_dir: str, stop: dict, agent_pid: int) -> argparse.Namespace | None:
    """Wait parked for the agent's handover: the next generation's arguments, its environment and
    log file taken on; None when told to exit, on a preemption notice or without the agent."""
    handover = park.wait_handover(park_dir, os.getpid(), stopped=lambda: stop["requested"], parent_pid=agent_pid)
    if handover is None:
        return None
    os.environ.update(handover.env)
    threads = handover.env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # read by torch at import: a standby worker imported it without
        torch.set_num_threads(int(threads))
    _move_output(handover.log_path)
    stop["park"] = False
    return parse_args(list(handover.argv))


@dataclass(slots=True)
class _Carry:
    """What a parked worker carries from one generation to the next."""

    kept: object = None  # stage_checkpoint.KeptState: the state, until the next trainer takes it over
    # The rendezvous stores this process hosted, by (address, port): torch cannot be relied on to
    # close a store's port, so a parked rank 0 hosts the next generation's store on the same one.
    stores: dict = field(default_factory=dict)


def _generation(args, stop: dict, carry: _Carry) -> int:
    """One generation of training: its exit code, or ``_PARKED`` with the state the next
    generation may keep in ``carry``."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    metrics = MetricsFile(args.metrics_file, rank == 0)

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        run = _load_inputs(args, rank, world, metrics, stop)
    except SailorError as exc:
        return _bad_input(rank, metrics, exc)
    try:
        _connect(run, world, carry)
        carry.kept = None  # taken over or not, freed before training allocates
        _report_started(run)
        _start_trackers(run)
        code = _train(run)
        if code == _PARKED:
            carry.kept = kept_state(run.trainer)
            run.trainer = None  # its gradients and process groups go; the kept tensors stay
            gc.collect()
            _note_parked(run, carry.kept.step)
        return code
    except SailorError as exc:
        _report_unsent_egress(run)
        return _bad_input(rank, metrics, exc)
    except Exception as exc:  # a peer vanished or a collective timed out: never hang
        _die_on_failure(run, exc)


def _move_output(log_path: str | None) -> None:
    """Write stdout and stderr to the new generation's log file from here on."""
    if not log_path:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _report_started(run: _Run) -> None:
    """Rank 0's metrics line (and every rank's log line) on how long the generation took to be
    ready to train, from when the agent started or handed over the worker, and from where its
    state came."""
    since = settings.started_unix_s()
    ready_s = None if since is None else max(0.0, time.time() - since)
    run.metrics.write({"event": "started", "step": run.trainer.step, "state_from": run.state_from,
                       "ready_s": ready_s})
    if ready_s is not None:
        _log(run.rank, f"ready to train in {ready_s:.2f} s (state from {run.state_from})")


def _start_trackers(run: _Run) -> None:
    """Rank 0's trackers, the attempt marked at the step it starts from."""
    if run.rank != 0:
        return
    args = run.args
    config = {"model": run.plan.model, "global_batch_size": run.plan.global_batch_size,
              "num_gpus": run.plan.num_gpus, **run.trainer.recipe.to_dict()}
    recipe = run.trainer.recipe
    run.trackers = Trackers(job_id=args.job_id, tensorboard_url=args.tensorboard_url,
                            attempt=settings.attempt(), config=config,
                            wandb_project=recipe.wandb_project, mlflow_uri=recipe.mlflow_tracking_uri)
    run.trackers.started(run.trainer.step, plan_text=run.plan.to_json(), state_from=run.state_from)


def _close_trackers(run: _Run, preempted: bool = False) -> None:
    if run.trackers is not None:
        if preempted:
            run.trackers.preempted(run.trainer.step)
        run.trackers.close()


def _load_inputs(args, rank: int, world: int, metrics: MetricsFile, stop: dict) -> _Run:
    """The plan, model, data and checkpoint storage; SailorError when any is unusable."""
    plan = load_plan(args.plan)
    if world_size(plan) != world:
        raise SailorError(f"plan needs {world_size(plan)} ranks but WORLD_SIZE is {world}")
    spec = get_model(plan.model)
    check_plan_for_engine(plan)
    recipe = make_recipe(args.steps, worker_values(args))
    cache = (SpanCache(args.data_cache_dir, args.data_cache_max_bytes or DEFAULT_CACHE_MAX_BYTES)
             if args.data_cache_dir else None)
    data = TokenDataset(args.data, plan.effective_seq_len(), spec.vocab_size,
                        validation_fraction=recipe.validation_fraction, min_val_samples=plan.global_batch_size,
                        cache=cache)
    return _Run(args=args, rank=rank, plan=plan, spec=spec, data=data, recipe=recipe, metrics=metrics, stop=stop,
                storage=storage_meter.open_checkpoints(args.ckpt_dir, args.checkpoint_region,
                                                       zone=rank_layout(plan)[rank].zone) if args.ckpt_dir else None,
                flops_per_step=model_flops_per_step(plan), peak_flops=peak_flops(plan))


def _device(plan, rank: int):
    use_cuda = all(r.gpu != "cpu" for s in plan.stages for r in s.replicas) and torch.cuda.is_available()
    if not use_cuda:
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def _connect(run: _Run, world: int, carry: _Carry) -> None:
    """Join the job's process group, start heartbeats and the preemption watch, build the trainer
    (resumed from the checkpoint every rank agrees on, when asked: from the state this worker
    parked with, where it holds the same shard at that checkpoint's step)."""
    args, rank, plan = run.args, run.rank, run.plan
    run.device = _device(plan, rank)
    timeout = _dt.timedelta(seconds=args.timeout_s)
    if settings.preempt_url() and not run.stop.get("watching"):  # one watch for all generations
        watch_preempt_url(settings.preempt_url(), lambda: run.stop.__setitem__("requested", True))
        run.stop["watching"] = True
    # Our own store rather than env://'s: its server listens on MASTER_ADDR only, not every interface.
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    hosts = rank == 0 and not uses_agent_store()
    store = carry.stores.get((addr, port)) if hosts else None
    if store is None:
        try:
            store = private_store(addr, port, world, is_master=hosts, timeout=timeout)
        except OSError as exc:  # not this rank's checkpoint I/O, which an OSError means later on
            raise RuntimeError(f"rendezvous at {addr}:{port} failed: {exc}") from None
        if hosts:
            carry.stores[(addr, port)] = store
    prefix = f"sailor/gen{settings.generation()}/"
    dist.init_process_group("nccl" if run.device.type == "cuda" else "gloo", store=dist.PrefixStore(prefix, store),
                            rank=rank, world_size=world, timeout=timeout)
    run.heartbeat = Heartbeat(rank, world, addr, port, prefix=prefix).start()
    run.trainer = StageTrainer(plan=plan, spec=run.spec, rank=rank, data=run.data, recipe=run.recipe,
                               seed=args.seed, device=run.device, groups=make_groups(plan, rank))
    info = _agreed_checkpoint(run.storage, args.ckpt_dir, rank) if args.resume and run.storage is not None else None
    run.egress = EgressSlots.of(plan, _MEMORY_SLOT + world, rank,  # metered from the handover on: see _one_step
                                bucket=bucket_place(args.ckpt_dir, args.checkpoint_region) if args.ckpt_dir else None)
    links.meter_zones([r.zone for r in rank_layout(plan)] if run.egress.num_slots else ())
    if info is not None:
        # its own kept state, its peers' (runtime/handover.py) or the checkpoint's files
        run.state_from = state_handover.resume(run.trainer, carry.kept, info, run.storage)
        _log(rank, f"resumed from {info.dirname} (next sample {run.trainer.next_sample}; "
                   f"state {_STATE_SAID[run.state_from]})")
        if run.trainer.recipe != run.recipe:
            _log(rank, f"continuing the checkpoint's recipe {run.trainer.recipe} (asked: {run.recipe})")
    elif run.recipe.init_from:
        load_pretrained(run.trainer.model, run.recipe.init_from)
        run.trainer.init_from = run.recipe.init_from
        run.state_from = "pretrained"
        _log(rank, f"started from the pretrained weights at {run.recipe.init_from}")
    run.saved_step = run.trainer.step if args.resume else -1
    if run.storage is not None:
        run.saves = save_note.SaveProgress(settings.save_note_file())
        run.writer = CheckpointWriter(run.storage, keep=args.keep, rank=rank, on_wait=functools.partial(_waiting, rank),
                                      on_write=run.saves.on_write)


def _waiting(rank: int, step: int) -> None:
    if rank == 0:
        _log(rank, f"waiting for the checkpoint of step {step} to be written")


def _save_once(run: _Run, now: bool = False) -> bool:
    """Checkpoint the current step unless it already is: in the background, or with ``now`` (or
    --ckpt-sync) complete when this returns, as is any write in flight (``runtime/checkpoint_writer.py``).
    With ``now`` (a stop, the last step) the write in flight commits and is reported first, so a stop
    cut short in its own save loses less than one interval; its agent sees the saves progress
    (``runtime/save_note.py``)."""
    if now:
        run.saves.begin()
        run.writer.wait()
        _note_checkpoints(run)
    if run.saved_step != run.trainer.step:
        if now or run.args.ckpt_sync:
            run.writer.save_now(run.trainer)
        else:
            run.writer.save_async(run.trainer)
        run.saved_step = run.trainer.step
    _note_checkpoints(run)
    if now:
        run.saves.end()
    return True


def _note_checkpoints(run: _Run) -> None:
    """Rank 0's ``checkpoint`` line for each checkpoint committed since (the job records it then)."""
    for step in run.writer.committed():
        run.metrics.write({"event": "checkpoint", "step": step, "unix_s": time.time(),
                           "url": f"{run.args.ckpt_dir.rstrip('/')}/{ckpt.step_dirname(step)}"})
        if run.trackers is not None:  # what the checkpoint keeps, the charts keep
            run.trackers.flush()


def _train(run: _Run) -> int:
    """Steps until the job's total, a preemption notice (checkpoint, exit 75/76) or a failure."""
    args, trainer, metrics = run.args, run.trainer, run.metrics
    preempt_file = settings.preempt_file()
    world = dist.get_world_size()
    status = _status_vector(run.device, world + run.egress.num_slots)
    while trainer.step < args.steps:
        stop_any = _one_step(run, status, preempt_file)
        if stop_any:
            saved = run.storage is not None and _save_once(run, now=True)
            parks = saved and args.park_dir is not None and not run.stop["requested"]
            _report_unsent_egress(run)
            metrics.write({"event": "preempted", "step": trainer.step, "checkpoint": saved, "parked": parks})
            _log(run.rank, f"stopping at step {trainer.step} on a stop notice (a preemption's or the agent's) "
                           f"({'checkpoint saved' if saved else 'no checkpoint'}"
                           f"{'; parked for the next generation' if parks else ''})")
            _stop_heartbeat(run, "preempted")
            _close_trackers(run, preempted=True)
            if parks:
                return _PARKED
            return EXIT_PREEMPTED if saved else EXIT_PREEMPTED_NO_CKPT
        if run.storage is not None and args.ckpt_every and trainer.step % args.ckpt_every == 0:
            _save_once(run)
        elif run.storage is not None:
            _note_checkpoints(run)  # a background write may have committed during the step
    if run.storage is not None:
        _save_once(run, now=True)
    _report_unsent_egress(run)
    metrics.write({"event": "done", "step": trainer.step})
    _stop_heartbeat(run, "done")
    _close_trackers(run)
    return EXIT_OK


def _one_step(run: _Run, status, preempt_file: str | None) -> bool:
    """One optimizer step, its metrics line, and whether any rank was told to stop."""
    trainer, plan, rank = run.trainer, run.plan, run.rank
    t0, c0 = time.perf_counter(), time.process_time()
    mid_step = (functools.partial(faults.at, faults.MID_STEP, rank=rank, step=trainer.step + 1)
                if faults.active() else None)
    loss_sum = trainer.train_step(on_first_forward=mid_step)
    if preempt_file and os.path.exists(preempt_file):
        run.stop["requested"] = True
    # One all-reduce agrees on the stop and carries the metrics: the loss, the gradient norm's
    # squared shares (when nothing clips) and each rank's memory high-water mark in its slot.
    status.zero_()
    status[0], status[1] = loss_sum, float(run.stop["requested"] or run.stop["park"])
    if trainer.grad_sq_share is not None:
        status[2] = trainer.grad_sq_share
    status[_MEMORY_SLOT + rank] = peak_memory_bytes(run.device)
    if run.egress.num_slots:
        run.egress.fill(status, links.take_sent_bytes(), storage_meter.take_moved_bytes())
    dist.all_reduce(status)
    # Reading the agreed status waits for the device, so the step time covers the GPU's
    # queued kernels too (CUDA runs ahead of the host until something is read back).
    values = status.tolist()
    loss_total, stop_any = values[0], values[1]
    dt = time.perf_counter() - t0
    gbs = plan.global_batch_size
    record = {"step": trainer.step, "loss": loss_total / plan.num_microbatches,
              "step_time_s": dt, "cpu_time_s": time.process_time() - c0,
              "samples_per_s": gbs / dt, "tokens_per_s": gbs * trainer.seq_len / dt,
              **_step_figures(run, values, dt)}
    if run.egress.num_slots:
        record["egress_bytes"] = run.egress.pairs(values)
    if not stop_any and _validation_due(run):
        val = trainer.validate(trainer.data.num_val_batches(trainer.recipe.validation_batches, gbs))
        record["val_loss"], record["val_perplexity"] = val, _perplexity(val)
    run.metrics.write(record)
    if run.trackers is not None:
        run.trackers.log(trainer.step, _tracked(record))
    return stop_any > 0


# the status vector: loss, stop, squared gradient norm, one slot per rank, then the egress slots
_MEMORY_SLOT = 3


def _status_vector(device, num_slots: int):
    return torch.zeros(_MEMORY_SLOT + num_slots, dtype=torch.float64, device=device)


def _step_figures(run: _Run, values: list[float], dt: float) -> dict:
    """The step's learning rate, gradient norm (before and after clipping), FLOPs utilisation and
    memory high-water marks, from what the step and its status all-reduce already hold."""
    trainer = run.trainer
    clip = trainer.recipe.grad_clip_norm
    norm_t = trainer.grad_norm_before_clip
    norm = float(norm_t) if norm_t is not None else values[2] ** 0.5  # reduced already: no extra wait
    memory = [int(v) for v in values[_MEMORY_SLOT:run.egress.offset if run.egress else None]]
    flops_per_s = run.flops_per_step / dt
    out = {"lr": trainer.recipe.lr_at(trainer.step - 1), "grad_norm": norm,
           "grad_norm_clipped": min(norm, clip) if clip else norm, "clipped": bool(clip and norm > clip),
           "model_flops_per_s": flops_per_s, "peak_memory_bytes_by_rank": memory}
    if run.device.type == "cuda":  # rank 0's allocator peak, as LaunchResult reads it (None on CPU)
        out["peak_memory_bytes"] = memory[0]
    if run.peak_flops:
        # against the plan's GPUs' catalog peak; on a CPU device (the embedded cloud) only nominal
        out["mfu" if run.device.type == "cuda" else "mfu_nominal"] = flops_per_s / run.peak_flops
    return out


def _perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))  # past exp's float range a loss is divergence anyway


def _tracked(record: dict) -> dict[str, float]:
    """A metrics line as the trackers' scalars, grouped as TensorBoard shows them."""
    tags = {"loss": "train/loss", "val_loss": "val/loss", "val_perplexity": "val/perplexity",
            "lr": "train/lr", "grad_norm": "train/grad_norm", "grad_norm_clipped": "train/grad_norm_clipped",
            "clipped": "train/clipped", "samples_per_s": "perf/samples_per_s", "tokens_per_s": "perf/tokens_per_s",
            "step_time_s": "perf/step_time_s", "model_flops_per_s": "perf/model_flops_per_s", "mfu": "perf/mfu",
            "mfu_nominal": "perf/mfu_nominal"}
    out = {tag: float(record[key]) for key, tag in tags.items() if key in record}
    for r, peak in enumerate(record["peak_memory_bytes_by_rank"]):
        out[f"memory/peak_bytes_rank{r}"] = float(peak)
    return out


def _validation_due(run: _Run) -> bool:
    """Every ``--validate-every`` steps (the recipe's in force) and after the run's last one, when
    samples are held out (a step that ends on a preemption notice skips it: the checkpoint comes first)."""
    every, step = run.trainer.recipe.validate_every_steps, run.trainer.step
    return (every > 0 and run.trainer.data.split.num_val_samples > 0
            and (step % every == 0 or step == run.args.steps))


def _report_unsent_egress(run: _Run) -> None:
    """This rank's metered bytes that no step's status all-reduce carried, in its own ``egress``
    line (any rank's, as an error line), which its agent adds to the generation's: a handover's when
    the generation ends before its first step, a validation's after the last step.  Taken from the
    meter, so a later line cannot count them again; bytes already put in a status vector whose
    all-reduce then failed are not (rank 0 may have reported them)."""
    if run.egress is None or not run.egress.num_slots:
        return
    pairs = run.egress.own_pairs(links.take_sent_bytes(), storage_meter.take_moved_bytes())
    if pairs:
        run.metrics.any_rank({"event": "egress", "rank": run.rank, "egress_bytes": pairs})


def _note_parked(run: _Run, step: int) -> None:
    park.write_parked(run.args.park_dir, park.Parked(pid=os.getpid(), rank=run.rank,
                                                     local_rank=int(os.environ.get("LOCAL_RANK", "0")), step=step))


def _stop_heartbeat(run: _Run, how: str) -> None:
    run.heartbeat.note_exit(how)
    run.heartbeat.close()
    _finish(dist)


def _bad_input(rank: int, metrics: MetricsFile, exc: Exception) -> int:
    _log(rank, f"error: {exc}")
    metrics.error(rank, str(exc))
    return EXIT_BAD_INPUT


def _die_on_failure(run: _Run, exc: Exception) -> None:
    """Exit 77 without waiting on anyone: a peer died, a collective timed out, or this rank's
    checkpoint I/O failed (the job must restart from the previous checkpoint)."""
    rank, metrics, heartbeat = run.rank, run.metrics, run.heartbeat
    _report_unsent_egress(run)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, OSError):  # this rank's checkpoint I/O failed: it is the one to blame
        _log(rank, f"checkpoint I/O failed: {type(exc).__name__}: {msg[:500]}")
        metrics.error(rank, f"checkpoint I/O: {msg}")
        sys.stderr.flush()
        os._exit(EXIT_PEER_LOST)
    dead = heartbeat.dead_ranks() if heartbeat is not None else None
    if heartbeat is not None:
        heartbeat.note_exit("peer_lost")
    _log(rank, f"{type(exc).__name__}: {msg[:500]}")
    _log(rank, f"peer lost: dead ranks {dead if dead is not None else 'unknown (store unreachable)'}")
    metrics.write({"event": "peer_lost", "rank": rank, "dead_ranks": dead, "message": msg})
    sys.stderr.flush()
    os._exit(EXIT_PEER_LOST)  # destroy_process_group could block on the dead peer


def _agreed_checkpoint(storage, url: str, rank: int):
    """Rank 0 picks the latest valid checkpoint (reading it all to verify); everyone loads that same one."""
    pick = [None]
    if rank == 0:
        info = ckpt.latest_valid_checkpoint(url, storage=storage)
        pick = [info.dirname if info else None]
    dist.broadcast_object_list(pick, src=0)
    if pick[0] is None:
        return None
    return ckpt.read_checkpoint(storage, pick[0], url, verify=ckpt.VERIFY_NONE)


def _finish(dist) -> None:
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _log(rank: int, msg: str) -> None:
    sys.stderr.write(f"[sailor worker rank {rank}] {msg}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
