"""Hand-made profiles with round numbers, so expected times can be computed by hand."""

from __future__ import annotations

from sailor_core.network import LinkDefault, LinkClass, NetworkModel
from sailor_core.plan.types import plan_from_dict
from sailor_core.profiles import LayerProfile, ModelProfile, ProfileDB

REGIME = "torch-bf16-autocast-adamw"


def hand_profile(
    gpu: str,
    *,
    model: str = "tiny",
    tp: int = 1,
    mbs: int = 1,
    seq: int = 64,
    fwd_s=(0.001, 0.002, 0.002, 0.003),
    bwd_s=(0.0, 0.004, 0.004, 0.003),
    params=(1000, 2000, 2000, 1000),
    activation_bytes=(100, 1000, 1000, 500),
    output_bytes=(4096, 4096, 4096, 0),
    update_s_per_param=1e-6,
    update_fixed_s=0.0,
) -> ModelProfile:
    layers = tuple(
        LayerProfile(fwd_s=f, bwd_s=b, params=p, activation_bytes=a, output_bytes=o, measured=True)
        for f, b, p, a, o in zip(fwd_s, bwd_s, params, activation_bytes, output_bytes, strict=True)
    )
    return ModelProfile(
        model=model, gpu=gpu, tp_degree=tp, micro_batch_size=mbs, seq_len=seq, layers=layers,
        regime=REGIME, source="hand", update_s_per_param=update_s_per_param, update_fixed_s=update_fixed_s,
    )


def db_of(*profiles: ModelProfile) -> ProfileDB:
    db = ProfileDB()
    for p in profiles:
        db.add(p)
    return db


def flat_network(bw_bytes_per_s: float = 1e9, latency_s: float = 0.0) -> NetworkModel:
    """A network with no fits: every link of every class moves ``bw`` bytes/s after ``latency``."""
    d = LinkDefault(bw_1gpu_bytes_per_s=bw_bytes_per_s, latency_s=latency_s)
    return NetworkModel(defaults={cls: d for cls in LinkClass if cls is not LinkClass.INTRA_NODE})


def plan(stages, *, model="tiny", gbs=4, mbs=1, validate=True, **extra):
    return plan_from_dict({"model": model, "global_batch_size": gbs, "micro_batch_size": mbs,
                           "stages": stages, **extra}, validate=validate)
