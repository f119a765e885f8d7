"""JobSpec drives `sailor train`'s options and the train-job flow's parameters (no flow runs here)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from sailor_core.job.spec import JobSpec, spec_field, worker_fields
from sailor_core.specs.fields import spec_fields

ROOT = Path(__file__).resolve().parents[2]
RUN_ONLY = ("job_id", "jobs_url", "cloud", "max_gpus_per_zone")


def test_every_field_is_an_option_of_sailor_train(sailor_cli):
    out = sailor_cli("train", "--help").stdout
    for f in spec_fields(JobSpec):
        assert f.cli_name in out, f.name
        for alias in f.option.aliases:
            assert not re.search(rf"{re.escape(alias)}(?![\w-])", out), f"{alias} is a hidden alias"


def test_the_flow_takes_jobspecs_fields_with_their_defaults_and_its_run_only_parameters():
    import inspect

    from flows.train_job import train_job

    params = inspect.signature(train_job).parameters
    assert list(params) == [f.name for f in spec_fields(JobSpec)] + list(RUN_ONLY)
    for f in spec_fields(JobSpec):
        assert params[f.name].default == (inspect.Parameter.empty if f.required else f.default), f.name


def test_prefect_yaml_gives_the_flow_valid_parameters():
    from flows.train_job import train_job

    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    (params,) = [d["parameters"] for d in deployments if d["name"] == "train-job"]
    validated = train_job.validate_parameters(params)
    spec = JobSpec(**{k: v for k, v in validated.items() if k not in RUN_ONLY})
    assert spec.checkpoint_every_steps == params["checkpoint_every_steps"] and spec.budget_usd == params["budget_usd"]


def test_flow_parameters_from_the_ui_are_type_checked():
    from prefect.exceptions import ParameterTypeError

    from flows.train_job import train_job

    with pytest.raises(ParameterTypeError):
        train_job.validate_parameters({"budget_usd": "a lot"})
    with pytest.raises(Exception, match="checkpoint_every"):  # a name the flow does not take
        train_job.validate_parameters({"budget_usd": 1.0, "checkpoint_every": 5})


def test_a_run_from_the_ui_with_an_unknown_name_fails_before_anything_starts(monkeypatch):
    from flows import train_job as module
    from sailor_core.job.spec import JobSpecError

    monkeypatch.setattr(module.js, "JobStore", lambda *a, **k: pytest.fail("the flow body started"))
    with pytest.raises(JobSpecError, match="model 'tinyy' is not in the model catalog; did you mean 'tiny'"):
        module.train_job.fn(model="tinyy", budget_usd=1.0)
    with pytest.raises(JobSpecError, match="gpus 'B200' is not a GPU type"):
        module.train_job.fn(budget_usd=1.0, gpus=["B200"])


def test_option_spellings_agree_across_commands(sailor_cli):
    """One spelling per option: `sailor plan` and `sailor replay` spell them as `sailor train` does;
    the older spellings still work, hidden."""
    for command, shared in (("plan", ("--max-usd-per-hr", "--global-batch-size", "--min-throughput", "--spot")),
                            ("replay", ("--global-batch-size", "--budget-usd"))):
        out = sailor_cli(command, "--help").stdout
        for name in shared:
            assert name in out, (command, name)
        for old in ("--max-usd-per-hour", "--global-batch", "--on-demand"):
            assert not re.search(rf"{old}(?![\w-])", out), (command, old)
    train = sailor_cli("train", "--help").stdout
    for name in ("--max-usd-per-hr", "--global-batch-size", "--min-throughput", "--spot", "--budget-usd"):
        assert name in train


def test_the_cli_hands_the_flow_the_spec_it_validated(sailor_cli, monkeypatch):
    import flows.cli.prefect_server as prefect_server
    import flows.cli.train as cli_train
    from flows.train_job import train_job

    seen = {}

    def run_local(params, display):
        seen.update(params)
        return {"status": "succeeded"}

    monkeypatch.setattr(prefect_server, "configure_prefect_env",
                        lambda **kw: prefect_server.ApiChoice(api_url="http://127.0.0.1:9/api", source="env"))
    monkeypatch.setattr(cli_train, "_run_local", run_local)
    r = sailor_cli("train", "--budget-usd", "0.5", "--steps", "12", "--preempt-at", "9,3", "--gpus", "T4, L4",
                   "--max-usd-per-hour", "2.5", "--global-batch", "16", "--no-spot", "--seed", "7",
                   "--checkpoint-every", "3", "--max-gpus-per-zone", "1", "--job-id", "j-1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "succeeded"
    validated = train_job.validate_parameters(json.loads(json.dumps(seen)))  # as a deployment would send them
    spec = JobSpec(**{k: v for k, v in validated.items() if k not in RUN_ONLY})
    assert spec == JobSpec(budget_usd=0.5, steps=12, preempt_at_steps=(3, 9), gpus=("T4", "L4"), max_usd_per_hr=2.5,
                           global_batch_size=16, spot=False, seed=7, checkpoint_every_steps=3)
    assert {k: validated[k] for k in RUN_ONLY} == {"job_id": "j-1", "jobs_url": None, "cloud": "auto",
                                                  "max_gpus_per_zone": 1}


def test_a_spec_normalises_what_json_gives_it():
    spec = JobSpec(budget_usd=1.0, gpus=["T4"], preempt_at_steps=[9, 3, 9])
    assert spec.gpus == ("T4",) and spec.preempt_at_steps == (3, 9)
    assert dataclasses.replace(spec) == spec
    assert spec.for_job("/jobs/j").checkpoint_url == "/jobs/j/checkpoints"
    assert JobSpec(budget_usd=1.0, checkpoint_url="s3://b/c").for_job("/jobs/j").checkpoint_url == "s3://b/c"


def test_data_and_the_recipe_reach_the_flow_and_the_workers(sailor_cli, monkeypatch, tmp_path):
    import flows.cli.prefect_server as prefect_server
    import flows.cli.train as cli_train
    from sailor_core.job.worker_args import worker_argv

    seen = {}
    monkeypatch.setattr(prefect_server, "configure_prefect_env",
                        lambda **kw: prefect_server.ApiChoice(api_url="http://127.0.0.1:9/api", source="env"))
    monkeypatch.setattr(cli_train, "_run_local", lambda params, display: seen.update(params) or {"status": "succeeded"})
    # the checks before renting would look for s3://b/llama (tests/flows/test_prerent_cli.py checks them)
    monkeypatch.setattr(cli_train, "_check_before_renting", lambda spec, **kw: None)
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(b"\0" * 64)
    r = sailor_cli("train", "--budget-usd", "1", "--dataset", str(tokens), "--lr", "3e-4", "--warmup-steps", "4",
                   "--min-lr-ratio", "0.05", "--weight-decay", "0.01", "--grad-clip-norm", "0.5",
                   "--val-fraction", "0.02", "--validate-every", "7", "--val-batches", "3",
                   "--init-from", "s3://b/llama", "--json")
    assert r.returncode == 0, r.stderr
    spec = JobSpec(**{k: v for k, v in seen.items() if k not in RUN_ONLY})
    assert spec.dataset == str(tokens.resolve())  # --dataset: the hidden alias of --data
    args = worker_argv(spec)
    flags = dict(zip(args[::2], args[1::2]))
    assert flags == {"--lr": "0.0003", "--warmup-steps": "4", "--min-lr-ratio": "0.05", "--weight-decay": "0.01",
                     "--grad-clip-norm": "0.5", "--val-fraction": "0.02", "--validate-every": "7",
                     "--val-batches": "3", "--init-from": "s3://b/llama", "--checkpoint-region": "", "--wandb": "",
                     "--mlflow": ""}
    # the worker understands every flag the flow passes
    from sailor_core.runtime.worker import parse_args

    worker = parse_args(["--plan", "p", "--steps", "9", "--data", "d", *args])
    assert (worker.learning_rate, worker.warmup_steps, worker.validate_every_steps) == (3e-4, 4, 7)
    assert "--warmup-steps" not in worker_argv(JobSpec(budget_usd=1))  # the worker's default: 5 % of steps


def test_the_workers_defaults_are_the_jobs():
    from sailor_core.job.worker_args import worker_argv
    from sailor_core.runtime.worker import parse_args

    spec = JobSpec(budget_usd=1)
    default = parse_args(["--plan", "p", "--steps", "9", "--data", "d"])
    given = parse_args(["--plan", "p", "--steps", "9", "--data", "d", *worker_argv(spec)])
    assert vars(default) == vars(given)


def test_the_plan_flow_takes_plan_terms_and_sailor_plan_takes_plan_spec(sailor_cli):
    import inspect

    from flows.plan_flow import plan_flow
    from sailor_core.specs.plan import PlanSpec, PlanTerms

    params = inspect.signature(plan_flow).parameters
    assert list(params)[:len(spec_fields(PlanTerms))] == [f.name for f in spec_fields(PlanTerms)]
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    (given,) = [d["parameters"] for d in deployments if d["name"] == "plan"]
    assert plan_flow.validate_parameters(given)["model"] == given["model"]
    out = sailor_cli("plan", "--help").stdout
    for f in spec_fields(PlanSpec):
        assert f.cli_name in out, f.name
    r = sailor_cli("plan", "--model", "tiny", "--gpus", "T4@us-central1-a=2", "--max-stages", "0")
    assert r.returncode != 0 and r.stderr.strip() == "error: --max-stages must be at least 1, got 0"


def _unlike_the_default(f) -> object:
    """A valid value of worker option ``f`` other than its default (by its type and its check's
    bounds: fractions below 1, counts above 0)."""
    if isinstance(f.default, str):  # a new text option names its own here
        return {"wandb_project": "team-runs", "mlflow_tracking_uri": "file:///tmp/mlruns",
                "checkpoint_region": "us-west-2"}.get(
            f.name, "s3://bucket/model")  # init_from's and tokenizer's form
    if isinstance(f.default, float):
        return f.default / 2
    return (f.default or 0) + 3  # counts, and None's (warm-up steps)


@pytest.mark.parametrize("name", [f.name for f in worker_fields()])
def test_every_worker_option_round_trips_from_the_spec_to_the_workers_recipe(name):
    """JobSpec -> the worker's flags (as the flow writes them) -> the worker's parser -> its Recipe:
    each option marked ``worker`` arrives with the value the job asked, under its own name."""
    from sailor_core.job.worker_args import worker_argv, worker_values
    from sailor_core.runtime.recipe import make_recipe
    from sailor_core.runtime.worker import parse_args

    value = _unlike_the_default(spec_field(name))
    spec = JobSpec(budget_usd=1, **{name: value})
    parsed = parse_args(["--plan", "p", "--steps", str(spec.steps), "--data", "d", *worker_argv(spec)])
    recipe = make_recipe(parsed.steps, worker_values(parsed))
    assert getattr(recipe, name) == value and type(getattr(recipe, name)) is type(value)
    assert recipe == make_recipe(spec.steps, worker_values(spec))  # every other option too
    assert recipe.total_steps == spec.steps


def test_a_worker_option_is_a_recipe_field_and_nothing_else_lists_them():
    from sailor_core.runtime.recipe import Recipe

    fields = dataclasses.fields(Recipe)
    assert [f.name for f in fields] == ["total_steps", *(f.name for f in worker_fields())]
    assert [f.default for f in fields[1:]] == [f.default for f in worker_fields()]  # one default each
