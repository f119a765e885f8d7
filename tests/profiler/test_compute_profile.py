"""Profiling the engine's own layers on CPU: plausible times, activation and output sizes, TP shards."""

import pytest

from sailor_core.catalog.layers import layer_shapes
from sailor_core.catalog.models import get_model
from sailor_core.profiler.compute import CPU_REGIME, fit_update_line


def _by_mbs(run):
    return {p.micro_batch_size: p for p in run.profiles}


def test_times_are_positive_and_plausible(tiny_run):
    for p in tiny_run.profiles:
        assert p.gpu == "cpu" and p.regime == CPU_REGIME and p.measured
        assert len(p.layers) == get_model("tiny").num_layer_indices
        for layer in p.layers:
            # a layer of a 64-wide model on a few hundred tokens: well above a microsecond, well below a second
            assert 1e-6 < layer.fwd_s < 1.0 and 1e-6 < layer.bwd_s < 1.0
        # (which layer measures slower is the machine's load as much as the arithmetic on a model
        # this small: seen inverted under a parallel test run; not asserted here)
        assert p.update_s_per_param > 0 and p.update_fixed_s >= 0
    assert "torch 2." in tiny_run.profiles[0].source and tiny_run.torch_version.startswith("2.")


def test_activation_bytes_grow_with_mbs_and_match_first_principles(tiny_run):
    one, four = _by_mbs(tiny_run)[1], _by_mbs(tiny_run)[4]
    spec = get_model("tiny")
    for a, b in zip(one.layers, four.layers):
        assert b.activation_bytes > a.activation_bytes > 0
        # everything saved scales with the tokens, nothing is per micro-batch in fp32
        assert b.activation_bytes == pytest.approx(4 * a.activation_bytes, rel=0.02)
    # a block's saved tensors counted by the hooks = the analytic count for this regime
    shapes = layer_shapes("tiny", tp_degree=1, seq_len=spec.seq_len, regime=CPU_REGIME)
    assert four.layers[1].activation_bytes == pytest.approx(shapes[1].activation_bytes(4), rel=0.05)
    # the embedding keeps only the token ids (int64)
    assert four.layers[0].activation_bytes == 8 * 4 * spec.seq_len


def test_output_bytes_and_params_are_the_engines(tiny_run):
    spec = get_model("tiny")
    p = _by_mbs(tiny_run)[4]
    for layer in p.layers[:-1]:
        assert layer.output_bytes == 4 * spec.seq_len * spec.hidden_size * 4  # fp32 residual stream
    assert p.layers[-1].output_bytes == 0
    import torch  # noqa: F401  (the engine's modules)

    from sailor_core.runtime.model import build_layer

    for i, layer in enumerate(p.layers):
        assert layer.params == sum(t.numel() for _, t in build_layer(spec, i).own_parameters())


def test_tp2_profile_runs_two_gloo_processes_and_halves_block_params(tiny_run):
    from sailor_core.profiler.compute import profile_model
    from sailor_core.profiler.stats import Repetitions

    run = profile_model("tiny", micro_batch_sizes=[2], tp_degrees=[2], repeat=Repetitions(warmups=1, reps=2))
    (tp2,) = run.profiles
    tp1 = _by_mbs(tiny_run)[1]
    assert tp2.tp_degree == 2 and tp2.measured
    block1, block2 = tp1.layers[1], tp2.layers[1]
    # the sharded matmuls halve; norms and the row-parallel output biases stay whole on each rank
    spec = get_model("tiny")
    h = spec.hidden_size
    replicated = 4 * h + 2 * h
    assert block2.params == (block1.params - replicated) // 2 + replicated
    assert block2.params < 0.55 * block1.params
    # vocabulary-parallel embedding and head: the catalog's per-GPU counts (a tied head counts no matrix)
    shapes = layer_shapes("tiny", tp_degree=2)
    assert (tp2.layers[0].params, tp2.layers[-1].params) == (shapes[0].params, shapes[-1].params)
    assert tp2.layers[0].params < 0.65 * tp1.layers[0].params
    assert all(layer.fwd_s > 0 and layer.bwd_s > 0 for layer in tp2.layers)


def test_update_line_fit_recovers_a_known_line():
    pts = [(n, 2e-3 + 5e-9 * n) for n in (1_000, 50_000, 400_000, 3_000_000)]
    rate, fixed = fit_update_line(pts)
    assert rate == pytest.approx(5e-9, rel=1e-6) and fixed == pytest.approx(2e-3, rel=1e-6)
    # a negative intercept is not physical: the fit goes through the origin instead
    rate, fixed = fit_update_line([(1_000, 1e-6), (1_000_000, 1e-2)])
    assert fixed == 0.0 and rate > 0


def test_cpu_sharing_from_first_principles(tiny_run):
    """4 ranks on 2 idle cores: the iteration is the ranks' summed work over 2 cores when that
    exceeds the one-core-per-rank pipeline; other jobs' load shrinks the cores we get."""
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.profiler.cpu_sharing import effective_cores, rank_work_s, shared_cpu_time
    from sailor_core.profiles import ProfileDB
    from sailor_core.simulator import simulate

    prof = next(p for p in tiny_run.profiles if p.micro_batch_size == 4)
    reps = [{"gpu": "cpu", "tp": 1}] * 2
    plan = plan_from_dict({"model": "tiny", "global_batch_size": 32, "micro_batch_size": 4,
                           "stages": [{"layers": [0, 2], "replicas": reps}, {"layers": [2, 4], "replicas": reps}]})
    sim = simulate(plan, profiles=ProfileDB([prof]))
    work = rank_work_s(sim)
    per_mb = [sum(layer.fwd_s + layer.bwd_s for layer in prof.layers[a:b]) for a, b in ((0, 2), (2, 4))]
    assert work >= 2 * 4 * sum(per_mb)  # every rank runs its 4 micro-batches
    idle = shared_cpu_time(plan, sim, num_cores=2)
    assert idle.effective_cores == 2
    assert idle.iteration_time_s == pytest.approx(max(sim.iteration_time_s, work / 2), rel=1e-12)
    assert shared_cpu_time(plan, sim, num_cores=8).iteration_time_s == pytest.approx(
        max(sim.iteration_time_s, work / 4), rel=1e-12)
    assert effective_cores(2, 4, other_load=4) == pytest.approx(1.0)
    loaded = shared_cpu_time(plan, sim, num_cores=2, other_load=4)
    assert loaded.iteration_time_s == pytest.approx(max(sim.iteration_time_s, work))


def test_measuring_a_layer_frees_it_without_the_cyclic_gc(monkeypatch):
    # On an H200 the profiler ran out of memory after ~100 GB: the activation-size hook returned
    # the saved tensor itself, so a node saving its own output held its own grad_fn, a cycle that
    # nothing frees. Reference counting alone must free every layer and its parameters.
    import gc
    import weakref

    import torch

    from sailor_core.catalog.models import get_model
    import sailor_core.profiler.measure as measure

    spec = get_model("tiny")
    cpu = torch.device("cpu")
    # torch's first embedding call in a process keeps its arguments once; not what is checked here
    once = measure.Repetitions(warmups=1, reps=1, update_reps=1)
    measure.measure_layer(spec, 0, micro_batch_size=1, seq_len=32, device=cpu, repeat=once)
    params = []
    build = measure.build_layer

    def watched_build(*args, **kwargs):
        layer = build(*args, **kwargs)
        params.extend(weakref.ref(p) for p in layer.parameters())
        return layer

    monkeypatch.setattr(measure, "build_layer", watched_build)
    gc.disable()
    try:
        for index in range(spec.num_layer_indices):
            measure.measure_layer(spec, index, micro_batch_size=1, seq_len=32, device=cpu, repeat=once)
        alive = sum(ref() is not None for ref in params)
    finally:
        gc.enable()
    assert params and alive == 0, f"{alive} of {len(params)} parameters outlived their measurement"


def test_chained_layer_times_cover_a_whole_pass_in_layer_order(monkeypatch):
    """measure_chained's per-layer times come from one pass's events: each layer's forward ends
    where the next begins and its backward where the previous layer's begins, so the layers of
    a pass sum to the pass.  A clock that ticks once per event makes this exact and independent
    of the machine's load: every layer's forward and backward spans exactly one tick, in order."""
    import itertools

    import torch

    from sailor_core.profiler import measure

    ticks = itertools.count()
    recorded: list[int] = []

    class TickEvent(measure._HostEvent):
        def record(self) -> None:
            self.t = float(next(ticks))  # one tick = one second
            recorded.append(self.t)

    spec = get_model("tiny")
    real = measure.measure_chained(spec, micro_batch_size=2, seq_len=spec.seq_len, device=torch.device("cpu"),
                                   warmups=1, reps=3)
    assert len(real) == spec.num_layer_indices
    assert all(f.median_s > 0 and b.median_s > 0 for f, b in real)

    monkeypatch.setattr(measure, "_HostEvent", TickEvent)
    timings = measure.measure_chained(spec, micro_batch_size=2, seq_len=spec.seq_len,
                                      device=torch.device("cpu"), warmups=1, reps=3)
    n = spec.num_layer_indices
    # Per pass: n + 1 forward marks, n backward marks (one per layer, in reverse), one end mark.
    assert len(recorded) == (1 + 3) * (2 * n + 2)
    for f, b in timings:
        assert (f.median_s, f.p10_s, f.p90_s, f.num_samples) == (1.0, 1.0, 1.0, 3)
        assert (b.median_s, b.p10_s, b.p90_s, b.num_samples) == (1.0, 1.0, 1.0, 3)
    # The layers' times sum to the pass from the first forward mark to the end, less the one
    # tick between the last forward mark and the start of the backward.
    per_pass = recorded[-(2 * n + 2):]
    assert sum(f.median_s + b.median_s for f, b in timings) == per_pass[-1] - per_pass[0] - 1
