"""How well the analytic estimator predicts profiles it has not seen.

    .venv/bin/python benchmarks/bench_estimator.py

1. H200 (data/measurements, bf16 autocast): calibrate on two OPT models, predict the third,
   each way round; error of the whole-model forward+backward time of one micro-batch per mbs.
1b. The H200 with none of its data, from Sailor's GPUs (another regime: Megatron fp32).
1c. A model family never profiled (OPT -> Llama and GPT-Neo, etc.): calibrated on the others
    (profiles measured with TF32 off under the TF32 regime are marked and summarized apart).
2. GPU never profiled: drop every profile of one Sailor GPU, predict its OPT-350 profiles from
   the other GPUs (the database picks the closest as reference); error of fwd+bwd per (tp, mbs).
3. Other micro-batch sizes on a profiled GPU: drop one (tp, mbs) of a (model, GPU) and predict it
   by scaling that GPU's other measurements.
4. A100-80 from A100-40 in detail (the brief's example), against Sailor's real A100-80 profile.
5. First-principles activation bytes per block (sailor_core.catalog.layers) against the H200
   peak-memory differences and Sailor's llm_info.json.
6. Speed of ProfileDB.get (cached answers, and first-time estimates).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sailor_core.profiles import ProfileDB, default_profile_db, reset_default_profile_db  # noqa: E402


def _err(pred: float, true: float) -> float:
    return (pred - true) / true


def _summary(errors: list[float]) -> str:
    a = [abs(e) for e in errors]
    return f"median |err| {statistics.median(a):.1%}, max |err| {max(a):.1%} over {len(a)}"


def cross_model_h200(profiles) -> list[float]:
    h200 = [p for p in profiles if p.gpu == "H200"]
    models = sorted({p.model for p in h200})
    print("\n## 1. H200: calibrate on two OPT models, predict the third (fwd+bwd of one micro-batch)\n")
    print("| predicted | calibrated on | mbs | measured ms | predicted ms | error |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    errors = []
    for held in models:
        db = ProfileDB([p for p in h200 if p.model != held])
        for true in sorted((p for p in h200 if p.model == held), key=lambda p: p.micro_batch_size):
            pred = db.get(held, "H200", 1, true.micro_batch_size, true.seq_len)
            assert not pred.measured
            e = _err(pred.fwd_bwd_s(), true.fwd_bwd_s())
            errors.append(e)
            others = "+".join(m for m in models if m != held)
            print(
                f"| {held} | {others} | {true.micro_batch_size} | {true.fwd_bwd_s() * 1e3:.1f} | "
                f"{pred.fwd_bwd_s() * 1e3:.1f} | {e:+.1%} |"
            )
    print(f"\nH200 cross-model: {_summary(errors)}")
    return errors


def h200_without_h200(profiles) -> list[float]:
    """The H200 as a GPU never profiled: only Sailor's GPUs (Megatron fp32) are known."""
    db = ProfileDB([p for p in profiles if p.gpu != "H200"])
    print("\n## 1b. H200 with no H200 data at all: bf16 requested, calibration borrowed from Sailor's GPUs\n")
    print("| model | mbs | measured ms | predicted ms | error | source |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    errors = []
    for true in sorted((p for p in profiles if p.gpu == "H200"), key=lambda p: (p.model, p.micro_batch_size)):
        pred = db.get(true.model, "H200", 1, true.micro_batch_size, regime="torch-bf16-autocast-adamw")
        e = _err(pred.fwd_bwd_s(), true.fwd_bwd_s())
        errors.append(e)
        print(
            f"| {true.model} | {true.micro_batch_size} | {true.fwd_bwd_s() * 1e3:.1f} | {pred.fwd_bwd_s() * 1e3:.1f} | "
            f"{e:+.1%} | {pred.source.removeprefix('estimated: ')} |"
        )
    print(f"\nH200 from Sailor's GPUs: {_summary(errors)}")
    return errors


def unprofiled_gpu(profiles, model: str = "opt-350m") -> list[float]:
    sailor = [p for p in profiles if p.regime == "megatron-fp32-adamw"]
    gpus = sorted({p.gpu for p in sailor if p.model == model})
    print(f"\n## 2. A GPU never profiled: {model} predicted from the other GPUs' profiles\n")
    print("| predicted GPU | reference | points | median abs err | max abs err | worst (tp, mbs) |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    all_errors = []
    for gpu in gpus:
        db = ProfileDB([p for p in sailor if p.gpu != gpu])
        errors = []
        ref = ""
        worst = (0.0, None)
        for true in (p for p in sailor if p.gpu == gpu and p.model == model):
            pred = db.get(model, gpu, true.tp_degree, true.micro_batch_size, true.seq_len)
            ref = pred.source.split(",")[0].removeprefix("estimated: from ")
            e = _err(pred.fwd_bwd_s(), true.fwd_bwd_s())
            errors.append(e)
            if abs(e) > abs(worst[0]):
                worst = (e, (true.tp_degree, true.micro_batch_size))
        all_errors += errors
        a = [abs(e) for e in errors]
        print(
            f"| {gpu} | {ref} | {len(a)} | {statistics.median(a):.1%} | {max(a):.1%} | "
            f"{worst[1]} {worst[0]:+.1%} |"
        )
    print(f"\nunprofiled GPU ({model}): {_summary(all_errors)}")
    return all_errors


def _family(model: str) -> str:
    return model.split("-")[0]


def _off_datapath(profiles) -> set[tuple[str, str]]:
    """(model, GPU) pairs measured on the plain fp32 path under a TF32 regime, as the estimator
    finds them from all the profiles (``estimator.off_datapath_models``)."""
    from sailor_core.profiles import estimator as est

    return {
        (model, gpu)
        for gpu, regime in {(p.gpu, p.regime) for p in profiles}
        for model in est.off_datapath_models(profiles, gpu, regime)
    }


def cross_family(profiles) -> dict[str, list[float]]:
    """Calibrate without any model of a family (OPT, GPT-Neo, Llama), predict that family's
    profiles on every GPU and regime it was measured on.  Profiles measured with TF32 off
    under a TF32 regime (marked) cannot be predicted from the regime: summarized apart too."""
    families = sorted({_family(p.model) for p in profiles})
    off = _off_datapath(profiles)
    print("\n## 1c. A model family never profiled: calibrated on the other families\n")
    print("| family | model | GPU | points | median abs err | max abs err | median signed |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    out: dict[str, list[float]] = {}
    on_path: dict[str, list[float]] = {}
    for held in families:
        db = ProfileDB([p for p in profiles if _family(p.model) != held])
        per: dict[tuple[str, str], list[float]] = {}
        for true in profiles:
            if _family(true.model) != held:
                continue
            pred = db.get(true.model, true.gpu, true.tp_degree, true.micro_batch_size, true.seq_len,
                          regime=true.regime)
            per.setdefault((true.model, true.gpu), []).append(_err(pred.fwd_bwd_s(), true.fwd_bwd_s()))
        for (model, gpu), errors in sorted(per.items()):
            a = [abs(e) for e in errors]
            mark = " (TF32 off)" if (model, gpu) in off else ""
            print(f"| {held} | {model} | {gpu}{mark} | {len(a)} | {statistics.median(a):.1%} | {max(a):.1%} | "
                  f"{statistics.median(errors):+.1%} |")
        out[held] = [e for errors in per.values() for e in errors]
        on_path[held] = [e for key, errors in per.items() if key not in off for e in errors]
    for held, errors in out.items():
        print(f"\nfamily {held} from the others: {_summary(errors)}")
        if len(on_path[held]) < len(errors):
            print(f"  without the profiles measured with TF32 off: {_summary(on_path[held])}")
    return out


def other_mbs(profiles) -> list[float]:
    print("\n## 3. Same GPU, one (tp, mbs) left out, predicted by scaling the GPU's other measurements\n")
    print("| model | GPU | points | median abs err | max abs err |")
    print("| --- | --- | ---: | ---: | ---: |")
    groups: dict[tuple[str, str], list] = {}
    for p in profiles:
        groups.setdefault((p.model, p.gpu), []).append(p)
    all_errors = []
    for (model, gpu), ps in sorted(groups.items()):
        if len(ps) < 2:
            continue
        errors = []
        for true in ps:
            db = ProfileDB([p for p in profiles if p.key != true.key])
            pred = db.get(model, gpu, true.tp_degree, true.micro_batch_size, true.seq_len)
            errors.append(_err(pred.fwd_bwd_s(), true.fwd_bwd_s()))
        all_errors += errors
        a = [abs(e) for e in errors]
        print(f"| {model} | {gpu} | {len(a)} | {statistics.median(a):.1%} | {max(a):.1%} |")
    print(f"\nleave-one-out within a GPU: {_summary(all_errors)}")
    return all_errors


def a100_80_from_a100_40(profiles) -> list[float]:
    sailor = [p for p in profiles if p.regime == "megatron-fp32-adamw"]
    db = ProfileDB([p for p in sailor if p.gpu != "A100-80"])
    print("\n## 4. OPT-350 on A100-80 predicted from A100-40 (no A100-80 data), vs Sailor's A100-80 profile\n")
    print("| tp | mbs | measured ms | predicted ms | error |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    errors = []
    for true in sorted(
        (p for p in sailor if p.gpu == "A100-80" and p.model == "opt-350m"), key=lambda p: (p.tp_degree, p.micro_batch_size)
    ):
        pred = db.get("opt-350m", "A100-80", true.tp_degree, true.micro_batch_size)
        assert "from A100-40" in pred.source
        e = _err(pred.fwd_bwd_s(), true.fwd_bwd_s())
        errors.append(e)
        print(f"| {true.tp_degree} | {true.micro_batch_size} | {true.fwd_bwd_s() * 1e3:.1f} | {pred.fwd_bwd_s() * 1e3:.1f} | {e:+.1%} |")
    print(f"\nA100-80 from A100-40: {_summary(errors)}")
    return errors


def activation_bytes() -> None:
    import json

    from sailor_core.catalog.layers import layer_shapes

    from sailor_core.source_data import MEASUREMENTS_FILE, SAILOR_DATA_DIR

    print("\n## 5. Activation bytes kept per block and sequence: first principles vs measured\n")
    print("| model | regime | tp | source | measured MB | predicted MB | error |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    rows = [json.loads(line) for line in MEASUREMENTS_FILE.read_text().splitlines()[1:]]
    rec = {(r["model"], r["layers"], r["mbs"]): r for r in rows}
    for model, depth in (("opt-350m", 24), ("opt-1.3b", 24), ("opt-2.7b", 32)):
        for mbs in (1, 8):
            full, short = rec[(model, depth, mbs)], rec[(model, 2, mbs)]
            measured = ((full["peak_alloc_bytes"] - full["static_bytes"]) - (short["peak_alloc_bytes"] - short["static_bytes"])) / (depth - 2)
            pred = layer_shapes(model)[1].activation_bytes(mbs)
            print(f"| {model} mbs {mbs} | bf16 autocast | 1 | H200 peak difference | {measured / 1e6:.1f} | {pred / 1e6:.1f} | {_err(pred, measured):+.1%} |")
    info = json.loads((SAILOR_DATA_DIR / "planner" / "llm_info.json").read_text())
    for sailor, model in (("OPT-350", "opt-350m"), ("GPT-Neo-2.7", "gpt-neo-2.7b"), ("OPT-30", "opt-30b")):
        for tp in ("1", "2", "4"):
            measured = info[sailor][tp]["2"]["act_mem_bytes"]
            pred = layer_shapes(model, tp_degree=int(tp), regime="megatron-fp32-adamw")[2].activation_bytes(1)
            print(f"| {model} | megatron fp32 | {tp} | Sailor llm_info | {measured / 1e6:.1f} | {pred / 1e6:.1f} | {_err(pred, measured):+.1%} |")


def speed() -> None:
    reset_default_profile_db()
    t0 = time.perf_counter()
    db = default_profile_db()
    load_s = time.perf_counter() - t0
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        db.get("opt-350m", "A100-40", 1, 2)
    hit_s = (time.perf_counter() - t0) / n
    keys = [(m, g, 1, b) for m in ("opt-350m", "opt-1.3b") for g in ("H100-80", "L4", "A10G", "T4") for b in (1, 2, 3, 5, 6, 7)]
    t0 = time.perf_counter()
    for k in keys:
        db.get(*k)
    miss_s = (time.perf_counter() - t0) / len(keys)
    print("\n## 6. Speed\n")
    print(f"default_profile_db() load: {load_s * 1e3:.0f} ms ({len(db)} profiles)")
    print(f"get, cached answer: {hit_s * 1e6:.2f} us/call")
    print(f"get, first estimate of a key: {miss_s * 1e3:.2f} ms/call")


def main() -> None:
    profiles = default_profile_db().profiles()
    cross_model_h200(profiles)
    h200_without_h200(profiles)
    cross_family(profiles)
    unprofiled_gpu(profiles)
    other_mbs(profiles)
    a100_80_from_a100_40(profiles)
    activation_bytes()
    speed()


if __name__ == "__main__":
    main()
