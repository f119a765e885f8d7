"""Time and size one layer of the engine (``sailor_core.runtime.model.build_layer``) on one device.

What the engine does with a layer is what is measured: the same module (TP shard included, with
its TP all-reduces when a group is given), bf16 autocast on CUDA and fp32 on CPU as in
``StageTrainer``, an input that requires grad (a block's input is the previous layer's output or
a received activation), and the engine's AdamW (``make_optimizer``) for the update.

* forward / backward: CUDA events on GPU; ``perf_counter`` on CPU; warm-ups discarded, the
  median of the repetitions kept with its spread.  Gradients accumulate across repetitions as
  they do across micro-batches.
* activation bytes: the unique storages autograd saves for backward during one forward
  (``saved_tensors_hooks``), parameters excluded (they are state, not activations).  On GPU the
  allocator's growth over a forward (minus the output) is also taken and the larger one kept,
  since a kernel may hold workspace the hooks do not see.
* output bytes: what ``StageTrainer`` sends to the next stage (``out.float()``); 0 for the head.
* chained (CUDA, TP 1, ``measure_chained``): forward and backward of each layer timed inside
  whole-model passes, with CUDA events between layers and no host sync in between, as the
  engine runs them. A layer timed alone starts from an idle GPU after a sync; at small sizes the
  host then launches its kernels no faster than the GPU runs them, and the sum over layers
  overstated a whole pass by 9-33 % on an H200 (opt-350m mbs 4: 81.8 against 61.5 ms; opt-1.3b
  mbs 4: 164.6 against 150.6 ms), where the chained times sum to the pass.

Every rank of a TP group must call these with the same arguments (the collectives run in lockstep).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_core.catalog.models import ModelSpec
from sailor_core.profiler.stats import Repetitions, Timing, summarize
from sailor_core.runtime.optimizer import make_optimizer
from sailor_core.runtime.model import Head, StageModel, build_layer


@dataclass(frozen=True, slots=True, kw_only=True)
class TpRank:
    """This process's place in its TP group (``group``: the torch process group; None at TP 1)."""

    degree: int = 1
    rank: int = 0
    group: object = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerMeasurement:
    index: int
    kind: str  # "embedding" | "block" | "head"
    fwd: Timing
    bwd: Timing
    update: Timing
    # CPU only: the process's CPU seconds over the same repetitions (the layer's own work; wall
    # clock also holds what other jobs on a shared machine took from us)
    fwd_cpu: Timing | None = None
    bwd_cpu: Timing | None = None
    update_cpu: Timing | None = None
    params: int  # held by this rank (its TP shard)
    activation_bytes: int  # saved for backward by one micro-batch
    output_bytes: int  # sent to the next stage by one micro-batch

    def to_dict(self) -> dict:
        out = {"index": self.index, "kind": self.kind, "fwd": self.fwd.to_dict(), "bwd": self.bwd.to_dict(),
               "update": self.update.to_dict(), "params": self.params,
               "activation_bytes": self.activation_bytes, "output_bytes": self.output_bytes}
        if self.fwd_cpu is not None:
            out["fwd_cpu"], out["bwd_cpu"] = self.fwd_cpu.to_dict(), self.bwd_cpu.to_dict()
            out["update_cpu"] = self.update_cpu.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "LayerMeasurement":
        return cls(index=d["index"], kind=d["kind"], fwd=Timing.from_dict(d["fwd"]),
                   bwd=Timing.from_dict(d["bwd"]), update=Timing.from_dict(d["update"]),
                   params=d["params"], activation_bytes=d["activation_bytes"], output_bytes=d["output_bytes"],
                   fwd_cpu=Timing.from_dict(d["fwd_cpu"]) if "fwd_cpu" in d else None,
                   bwd_cpu=Timing.from_dict(d["bwd_cpu"]) if "bwd_cpu" in d else None,
                   update_cpu=Timing.from_dict(d["update_cpu"]) if "update_cpu" in d else None)


class Stopwatch:
    """Seconds of a callable: CUDA events on a GPU (the host does not wait per op), wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.last_cpu_s = 0.0  # process CPU seconds of the last call (CPU devices)

    def __call__(self, fn) -> tuple[float, object]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3, out
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        self.last_cpu_s = time.process_time() - c0
        return t1 - t0, out


def _kind(spec: ModelSpec, index: int) -> str:
    return "embedding" if index == 0 else "head" if index == spec.num_layers + 1 else "block"


def _autocast(device: torch.device):
    # the engine's choice (StageTrainer.autocast)
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def saved_activation_bytes(fn, exclude: set[int]) -> tuple[int, object]:
    """Bytes of the unique storages autograd saves while ``fn`` runs, storages in ``exclude`` left out."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in exclude and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        # Not `t` itself: a node that saves its own output would then hold its grad_fn, a cycle
        # outside Python's GC that kept every profiled layer and its activations alive (on CUDA
        # the profiler ran out of memory on an H200 after ~100 GB of layers).
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def measure_layer(spec: ModelSpec, index: int, *, micro_batch_size: int, seq_len: int, device: torch.device,
                  repeat: Repetitions = Repetitions(), tp: TpRank = TpRank(), seed: int = 0) -> LayerMeasurement:
    """Forward, backward and update time and the sizes of layer ``index`` (see the module doc)."""
    warmups, reps, update_reps = repeat.warmups, repeat.reps, repeat.update_reps
    layer = build_layer(spec, index, tp.degree, tp.group, tp_rank=tp.rank, seed=seed).to(device)
    kind = _kind(spec, index)
    gen = torch.Generator().manual_seed(1234 + index)  # equal on every TP rank: a TP group sees one input
    b, s = micro_batch_size, seq_len
    labels = None
    if index == 0:
        inp = torch.randint(0, spec.vocab_size, (b, s), generator=gen).to(device)
    else:
        inp = torch.randn(b, s, spec.hidden_size, generator=gen).to(device).requires_grad_(True)
    if isinstance(layer, Head):
        labels = torch.randint(0, spec.vocab_size, (b, s), generator=gen).to(device)
    autocast = _autocast(device)

    def forward():
        with autocast:
            return layer(inp, labels) if labels is not None else layer(inp)

    param_ptrs = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    act_bytes, out = saved_activation_bytes(forward, param_ptrs)
    output_bytes = 0 if labels is not None else out.numel() * 4  # the engine sends out.float()
    if cuda:
        torch.cuda.synchronize()
        grown = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
        act_bytes = max(act_bytes, grown)
    grad_out = None if labels is not None else torch.randn(out.shape, generator=gen).to(device, out.dtype)
    del out

    watch = Stopwatch(device)
    fwd_s, bwd_s, fwd_c, bwd_c = [], [], [], []
    for i in range(warmups + reps):
        if index:
            inp.grad = None
        tf, out = watch(forward)
        cf = watch.last_cpu_s
        tb, _ = watch(lambda: out.backward(grad_out) if grad_out is not None else out.backward())
        del out
        if i >= warmups:
            fwd_s.append(tf)
            bwd_s.append(tb)
            fwd_c.append(cf)
            bwd_c.append(watch.last_cpu_s)

    opt = make_optimizer(layer.parameters(), lr=1e-3)
    upd_s, upd_c = [], []
    for i in range(1 + update_reps):  # the first step creates the optimizer state: a warm-up
        t, _ = watch(opt.step)
        if i:
            upd_s.append(t)
            upd_c.append(watch.last_cpu_s)
    # a tied head's copy of the embedding matrix is layer 0's parameter: the simulator adds it to a
    # last stage without layer 0 (simulator/memory.py), so a layer's count leaves it out
    params = sum(p.numel() for _, p in layer.own_parameters())
    return LayerMeasurement(index=index, kind=kind, fwd=summarize(fwd_s), bwd=summarize(bwd_s),
                            update=summarize(upd_s), params=params, activation_bytes=int(act_bytes),
                            output_bytes=int(output_bytes),
                            fwd_cpu=None if cuda else summarize(fwd_c), bwd_cpu=None if cuda else summarize(bwd_c),
                            update_cpu=None if cuda else summarize(upd_c))


def measure_model_update(spec: ModelSpec, *, device: torch.device, reps: int = 3, tp_degree: int = 1,
                         tp_rank: int = 0, tp_group=None, layers: range | None = None,
                         make=None) -> tuple[int, Timing, Timing | None]:
    """(params, AdamW step time) of one optimizer over ``layers`` (default: the whole model) with
    gradients present: a second point, besides single layers, for the update-time line.
    ``make(params)`` builds the optimizer (default: the engine's ``make_optimizer``)."""
    layers = layers if layers is not None else range(spec.num_layer_indices)
    mods = [build_layer(spec, i, tp_degree, tp_group, tp_rank=tp_rank).to(device) for i in layers]
    params = [p for m in mods for p in m.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make(params) if make is not None else make_optimizer(params, lr=1e-3)
    watch = Stopwatch(device)
    times, cpu = [], []
    for i in range(1 + reps):
        t, _ = watch(opt.step)
        if i:
            times.append(t)
            cpu.append(watch.last_cpu_s)
    return sum(p.numel() for p in params), summarize(times), None if watch.cuda else summarize(cpu)


def barrier(group) -> None:
    if group is not None:
        dist.barrier(group=group)


class _HostEvent:
    """A CUDA event's timing interface on the host clock (CPU devices run each op as it is called)."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1e3


def measure_chained(spec: ModelSpec, *, micro_batch_size: int, seq_len: int, device: torch.device,
                    warmups: int = 2, reps: int = 10, seed: int = 0) -> list[tuple[Timing, Timing]] | None:
    """(forward, backward) of every layer index inside whole-model passes of one micro-batch, as
    the engine runs a one-stage plan; None when the whole model and its activations do not fit
    (CUDA out of memory), where the layers alone are all that can be measured.

    Events are recorded before each layer's forward, and in backward when the gradient of a
    layer's output is ready (a tensor hook), which is where that layer's backward starts."""
    cuda = device.type == "cuda"
    event = torch.cuda.Event if cuda else _HostEvent
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = None
    try:
        model = StageModel(spec, 0, spec.num_layer_indices, seed=seed).to(device)
        gen = torch.Generator().manual_seed(4321)
        b, s = micro_batch_size, seq_len
        tokens = torch.randint(0, spec.vocab_size, (b, s), generator=gen).to(device)
        labels = torch.randint(0, spec.vocab_size, (b, s), generator=gen).to(device)
        n = len(model.layers)
        fwd: list[list[float]] = [[] for _ in range(n)]
        bwd: list[list[float]] = [[] for _ in range(n)]
        for rep in range(warmups + reps):
            ev_fwd = [event(enable_timing=True) for _ in range(n + 1)]
            ev_bwd: dict[int, object] = {n - 1: event(enable_timing=True)}
            end = event(enable_timing=True)
            sync()
            x = tokens
            with _autocast(device):
                for i, layer in enumerate(model.layers):
                    ev_fwd[i].record()
                    x = layer(x, labels) if isinstance(layer, Head) else layer(x)
                    if i < n - 1:
                        ev_bwd[i] = event(enable_timing=True)
                        x.register_hook(lambda _grad, e=ev_bwd[i]: e.record())
                ev_fwd[n].record()
            ev_bwd[n - 1].record()
            x.backward()
            end.record()
            sync()
            model.zero_grad(set_to_none=True)
            if rep < warmups:
                continue
            for i in range(n):
                fwd[i].append(ev_fwd[i].elapsed_time(ev_fwd[i + 1]) / 1e3)
                bwd[i].append(ev_bwd[i].elapsed_time(ev_bwd[i - 1] if i else end) / 1e3)
        return [(summarize(f), summarize(b_)) for f, b_ in zip(fwd, bwd)]
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        del model
        if cuda:
            torch.cuda.empty_cache()
