"""The checks before renting (``sailor_core.job.prerent``): what a job's workers would refuse only
after their instances booted, refused first in one line naming the field; what can run passes."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from sailor_core.catalog.hf_config import resolve_model
from sailor_core.catalog.hf_weights import WEIGHTS, check_weights
from sailor_core.catalog.instances import catalog_offers
from sailor_core.catalog.models import get_model
from sailor_core.controller.economics import CHANGE_COST_S, job_costs
from sailor_core.controller.state_load import DEFAULT_STORAGE_BW_BYTES_PER_S, checkpoint_bytes_for
from sailor_core.errors import InputError
from sailor_core.job.prerent import check_inputs, check_reach
from sailor_core.job.spec import JobSpec, JobSpecError


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Hugging Face folders saved by transformers: a Llama and a Qwen2 (tests/hf_tiny.py)."""
    import transformers  # lazy: transformers and torch, the yardstick, only for these folders

    from tests.hf_tiny import tiny_configs

    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name in ("llama-3-like", "qwen2"):
        out[name] = str(root / name)
        transformers.AutoModelForCausalLM.from_config(tiny_configs()[name]).save_pretrained(out[name])
    return out


def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def _refused(spec: JobSpec, field: str) -> str:
    with pytest.raises(JobSpecError) as info:
        check_inputs(spec)
    assert info.value.field == field and "\n" not in str(info.value)
    return info.value.problem


def test_a_matching_init_from_folder_passes(folders):
    model = folders["llama-3-like"]
    check_inputs(JobSpec(model=model, budget_usd=1, init_from=model))


def test_init_from_missing_mismatched_or_unsupported_is_refused(folders, tmp_path):
    model = folders["llama-3-like"]
    assert "no readable config.json" in _refused(JobSpec(model=model, budget_usd=1, init_from=str(tmp_path / "no")),
                                                 "init_from")
    problem = _refused(JobSpec(model=model, budget_usd=1, init_from=folders["qwen2"]), "init_from")
    assert f"is not a {model}" in problem and "family 'qwen2'" in problem
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    assert "model_type 'bert' is not one of" in _refused(JobSpec(model=model, budget_usd=1, init_from=str(bert)),
                                                         "init_from")


def test_corrupt_or_misshapen_weights_are_refused_naming_the_file(folders, tmp_path):
    model = folders["llama-3-like"]
    spec = get_model(resolve_model(model))
    truncated = _copy(model, tmp_path / "truncated")
    data = open(os.path.join(truncated, WEIGHTS), "rb").read()
    open(os.path.join(truncated, WEIGHTS), "wb").write(data[: len(data) // 2])
    problem = _refused(JobSpec(model=model, budget_usd=1, init_from=truncated), "init_from")
    assert f"{truncated}/{WEIGHTS}" in problem and "truncated or corrupt" in problem
    garbage = _copy(model, tmp_path / "garbage")
    open(os.path.join(garbage, WEIGHTS), "wb").write(b"\xff" * 64)
    assert "not a safetensors file" in _refused(JobSpec(model=model, budget_usd=1, init_from=garbage), "init_from")
    # A tensor of another shape (its bytes consistent): the embedding, then the parameter count.
    reshaped = _copy(model, tmp_path / "reshaped")
    _rewrite_header(os.path.join(reshaped, WEIGHTS), "model.embed_tokens.weight",
                    [spec.hidden_size, spec.vocab_size])
    with pytest.raises(InputError, match=r"embed_tokens.weight has shape \[32, 101\], not the model's \[101, 32\]"):
        check_weights(reshaped, spec)
    missing = _copy(model, tmp_path / "missing")
    _rewrite_header(os.path.join(missing, WEIGHTS), "model.norm.weight", None)
    assert "no tensor model.norm.weight" in _refused(JobSpec(model=model, budget_usd=1, init_from=missing),
                                                     "init_from")


def _rewrite_header(path: str, name: str, shape: list[int] | None) -> None:
    """The file with one tensor's header entry given another shape of as many elements (None:
    the entry renamed away), its data left as it was."""
    raw = open(path, "rb").read()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    if shape is None:
        header["unused." + name] = header.pop(name)
    else:
        header[name]["shape"] = shape
    text = json.dumps(header).encode()
    text += b" " * (size - len(text)) if len(text) <= size else b""
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + size:])


def test_data_and_checkpoints_in_storage(tmp_path):
    ckpt = tmp_path / "ckpt"
    check_inputs(JobSpec(budget_usd=1, checkpoint_url=str(ckpt)))
    assert ckpt.is_dir() and not list(ckpt.iterdir())  # the probe is gone
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    assert "not writable" in _refused(JobSpec(budget_usd=1, checkpoint_url=str(blocked / "ckpt")),
                                      "checkpoint_url")


def test_data_in_object_storage_must_be_there(moto_s3):
    import boto3  # lazy: the test's own client to the moto server

    s3 = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1")
    s3.create_bucket(Bucket="corpora")
    s3.put_object(Bucket="corpora", Key="web/tokens.bin", Body=b"\0" * 64)
    check_inputs(JobSpec(budget_usd=1, dataset="s3://corpora/web/tokens.bin"))
    assert _refused(JobSpec(budget_usd=1, dataset="s3://corpora/web/other.bin"), "dataset") == \
        "s3://corpora/web/other.bin: no such object"
    assert _refused(JobSpec(budget_usd=1, dataset="s3://no-corpora/web/tokens.bin"), "dataset") == \
        "s3://no-corpora/web/tokens.bin: no bucket 'no-corpora'"
    # A checkpoint prefix is probed and left empty; a bucket not there yet is the flow's to create.
    check_inputs(JobSpec(budget_usd=1, checkpoint_url="s3://corpora/runs/job-a"))
    assert "Contents" not in s3.list_objects_v2(Bucket="corpora", Prefix="runs/")
    check_inputs(JobSpec(budget_usd=1, checkpoint_url="s3://checkpoints-to-be/job-a"))


OFFERS = catalog_offers()


def test_a_floor_no_plan_reaches_is_refused_saying_the_best():
    with pytest.raises(JobSpecError) as info:
        check_reach(JobSpec(budget_usd=1, min_throughput_samples_per_s=1e9), OFFERS, max_gpus_per_zone=2)
    assert info.value.field == "min_throughput_samples_per_s"
    best = float(info.value.problem.split("at most ")[1].split(" ")[0])
    assert 0 < best < 1e9
    # A floor at that bound passes here; the planner and the controller decide the rest, as before.
    check_reach(JobSpec(budget_usd=1, min_throughput_samples_per_s=best * 0.999), OFFERS, max_gpus_per_zone=2)


def test_a_budget_that_buys_no_checkpoint_interval_is_refused_saying_what_would():
    with pytest.raises(JobSpecError) as info:
        check_reach(JobSpec(budget_usd=1e-6), OFFERS, max_gpus_per_zone=2)
    assert info.value.field == "budget_usd"
    least = float(info.value.problem.split("at least ")[1].split(" ")[0])
    cheapest = min(o.spot_usd_per_hr for o in OFFERS)
    assert least >= cheapest * 30 / 3600 and "one checkpoint interval (5 steps)" in info.value.problem
    check_reach(JobSpec(budget_usd=least * 1.5), OFFERS, max_gpus_per_zone=2)
    # A real cloud's list prices are not its live ones: the budget is left to the flow there.
    check_reach(JobSpec(budget_usd=1e-6), OFFERS, max_gpus_per_zone=2, prices_are_live=False)


def test_capacity_that_is_missing_is_not_refused_here():
    check_reach(JobSpec(budget_usd=1e-6, min_throughput_samples_per_s=1e9), [], max_gpus_per_zone=2)


def _least_usd(spec: JobSpec) -> tuple[float, str]:
    """What ``check_reach`` says ``spec``'s first checkpoint interval takes at least, and its line."""
    with pytest.raises(JobSpecError) as info:
        check_reach(spec, OFFERS, max_gpus_per_zone=2)
    assert info.value.field == "budget_usd" and "\n" not in str(info.value)
    return float(info.value.problem.split("at least ")[1].split(" ")[0]), info.value.problem


def test_the_budget_check_counts_the_checkpoint_reload_as_the_flows_controller_does():
    # lazy: the flow's tasks load Prefect, only to compare with what the flow's controller weighs
    from tasks.control import flow_costs

    model = "opt-1.3b"  # about 18 GB of weights and AdamW state: a reload of seconds, not milliseconds
    costs = flow_costs(JobSpec(model=model, budget_usd=1))
    assert costs == job_costs(model)
    reload_s = costs.state_load.storage_load_s
    assert reload_s == pytest.approx(checkpoint_bytes_for(model) / DEFAULT_STORAGE_BW_BYTES_PER_S) and reload_s > 10
    assert costs.restart_s == pytest.approx(CHANGE_COST_S + reload_s)
    usd_per_hr = min(o.spot_usd_per_hr for o in OFFERS)
    # A budget below the start-up alone is refused saying the start-up the flow's controller weighs.
    start_usd = usd_per_hr * costs.restart_s / 3600
    least, line = _least_usd(JobSpec(model=model, budget_usd=start_usd * 0.999))
    assert least == pytest.approx(start_usd, rel=1e-3)
    assert f"its start-up of {costs.restart_s:.3g} s, {reload_s:.3g} s of it the checkpoint's reload" in line
    # Past the start-up, the first interval's steps: a budget that pays them and a start-up
    # without the reload (what the check counted before) is refused; one that pays it all passes.
    least, line = _least_usd(JobSpec(model=model, budget_usd=start_usd * 1.001))
    reload_usd = usd_per_hr * reload_s / 3600
    assert least > start_usd and "then the steps" in line
    _least_usd(JobSpec(model=model, budget_usd=least - reload_usd / 2))
    check_reach(JobSpec(model=model, budget_usd=least * 1.001), OFFERS, max_gpus_per_zone=2)
