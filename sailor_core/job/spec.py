"""What the user asked of a training job: its one description, fixed for the life of the job.

Every user-facing option of a job is a ``JobSpec`` field, declared once with ``option``
(``sailor_core/specs/fields.py``): its default, help text, unit and ``sailor train`` spelling
sit next to the field, and ``JobSpec`` validates them all.  The command line
(``flows/cli/train.py``) and the train-job flow's parameters (``flows/spec_parameters.py``)
are generated from these fields, so a new option is one new field here.  An option marked
``worker=True`` also reaches the engine's workers: as its ``sailor train`` flag on their command
line (``sailor_core/job/worker_args.py``) and, in the workers, as the attribute of the same name
of their ``Recipe`` (``sailor_core/runtime/recipe.py``), checked by ``check_worker_options`` on
both sides; so such an option is its field here (and its check) plus the code that uses it.
Plain dataclasses only: the CLI reads this module at start-up.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from sailor_core.catalog.gpus import gpu_names, normalize_gpu_name
from sailor_core.catalog.clouds import rented_clouds
from sailor_core.catalog.instances import catalog_zones, rentable_gpus
from sailor_core.catalog.hf_config import is_model_url, resolve_model
from sailor_core.catalog.models import model_names
from sailor_core.errors import InputError, UnknownNameError
from sailor_core.network.storage_egress import region_problem
from sailor_core.objective import JobTerms, Objective, TermsError
from sailor_core.specs.fields import SpecField, option, spec_fields


class JobSpecError(TermsError):
    """A bad value of one JobSpec field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What the user asked for; fixed for the life of the job."""

    model: str = option("tiny", help="a catalog model (see `sailor catalog models`) or a Hugging Face model folder: "
                                     "its config.json is the model (an absolute path, file://, s3:// or gs:// URL)",
                        cli=("--model", "-m"))
    budget_usd: float = option(help="total budget; never crossed", unit="USD")
    steps: int = option(30, help="training steps (iterations) to run", unit="steps")
    min_throughput_samples_per_s: float | None = option(None, help="throughput floor, counting the restarts of "
                                                                   "preemptions", unit="samples/s",
                                                        cli=("--min-throughput",))
    max_usd_per_hr: float | None = option(None, help="cap on the cost per hour", unit="USD/h",
                                          aliases=("--max-usd-per-hour",))
    objective: Objective = option(Objective.THROUGHPUT,
                                  help=f"what every (re-)plan optimises over the job's life: {Objective.described()}, "
                                       "counting the restarts each pool's preemptions cost")
    deadline_h: float | None = option(None, help="finish within this many hours of the job's start; with "
                                                 "--objective cost: the cheapest plans that still make it",
                                      unit="h")
    gpus: tuple[str, ...] = option((), help="allowed GPU types")
    zones: tuple[str, ...] = option((), help="allowed zones")
    clouds: tuple[str, ...] = option((), help="allowed clouds: aws, gcp")
    max_gpus: int | None = option(2, help="most GPUs the job may rent at once", unit="GPUs")
    spot: bool = option(True, help="rent spot instances (else on demand)", cli=("--spot/--no-spot",))
    on_demand_gpus: int = option(0, help="of each pool's GPUs (a GPU type in a zone), how many the controller may "
                                         "rent on demand instead of spot: never preempted, at the on-demand price; "
                                         "a re-plan moves the pools that keep preempting the job there when the "
                                         "restarts saved are worth the premium (a mixed plan); 0: spot only",
                                 unit="GPUs")
    dataset: str = option("synthetic", help="training tokens: a .bin/.u32.bin/.npy token file (a path, s3:// or gs:// "
                                            "URL; `sailor data prepare` makes one), or synthetic",
                          cli=("--data",), aliases=("--dataset",))
    init_from: str = option("", help="start from pretrained weights: a Hugging Face model folder of the job's model "
                                     "(config.json + *.safetensors; an absolute path, s3:// or gs:// URL); "
                                     "a resumed job continues from its checkpoints", cli=("--init-from",), worker=True)
    tokenizer: str = option("", help="the tokenizer of the data: a folder (absolute path, s3:// or gs:// URL) whose "
                                     "tokenizer files `sailor export` puts with the model; default: the --init-from "
                                     "or --model folder's, when it has them")
    validation_fraction: float = option(0.01, help="the last fraction of the samples, held out for the validation "
                                                   "loss (at least one global batch); 0: none", cli=("--val-fraction",),
                                        worker=True)
    validate_every_steps: int = option(50, help="validation loss every K steps and at the last step; 0: never",
                                       unit="steps", cli=("--validate-every",), worker=True)
    validation_batches: int = option(2, help="held-out global batches each validation runs", unit="batches",
                                     cli=("--val-batches",), worker=True)
    learning_rate: float = option(1e-3, help="peak learning rate: linear warm-up to it, cosine decay after",
                                  cli=("--lr",), aliases=("--learning-rate",), worker=True)
    warmup_steps: int | None = option(None, help="warm-up steps (default: 5 % of the steps, rounded up)",
                                      unit="steps", worker=True)
    min_lr_ratio: float = option(0.1, help="the cosine decay's floor at the last step, as a fraction of the peak",
                                 worker=True)
    weight_decay: float = option(0.1, help="AdamW weight decay of weight matrices (not biases, norms, embeddings)",
                                 worker=True)
    grad_clip_norm: float = option(1.0, help="clip the global gradient norm to this; 0: no clipping", worker=True)
    global_batch_size: int | None = option(8, help="samples per step", unit="samples",
                                           aliases=("--global-batch",))
    seed: int = option(0, help="seed of the initial weights and the synthetic data")
    checkpoint_url: str = option("", help="where checkpoints go (path, s3://, gs://); default: the job's folder")
    checkpoint_every_steps: int = option(5, help="steps between checkpoints", unit="steps",
                                         cli=("--checkpoint-every",))
    checkpoint_region: str = option("", help="the checkpoint bucket's region (e.g. us-west-2), whose bytes to and "
                                            "from workers in other regions are charged as egress; default: asked of "
                                            "the cloud for s3://, else priced as the farthest region", worker=True)
    preempt_at_steps: tuple[int, ...] = option((), help="inject preemptions at these steps (embedded cloud)",
                                               unit="steps", cli=("--preempt-at",))
    tensorboard: bool = option(True, help="rank 0 writes TensorBoard event files to the job's <url>/tensorboard "
                                          "(`tensorboard --logdir` on it); W&B and MLflow follow WANDB_PROJECT / "
                                          "WANDB_MODE and MLFLOW_TRACKING_URI", cli=("--tensorboard/--no-tb",))
    wandb_project: str = option("", help="rank 0 logs to this Weights & Biases project (the `wandb` extra; "
                                         "WANDB_PROJECT does the same)", cli=("--wandb",), worker=True)
    mlflow_tracking_uri: str = option("", help="rank 0 logs to this MLflow tracking server or file:// store (the "
                                               "`mlflow` extra; MLFLOW_TRACKING_URI does the same)",
                                      cli=("--mlflow",), worker=True)

    def __post_init__(self) -> None:
        # Sequences arrive as lists from JSON (job states, flow parameters); the spec keeps tuples.
        for name in ("gpus", "zones", "clouds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "preempt_at_steps", tuple(sorted(set(self.preempt_at_steps))))
        try:  # the terms the controller and the replay share are validated (and parsed) there
            terms = self.terms
        except TermsError as exc:
            raise JobSpecError(exc.field, exc.problem) from None
        object.__setattr__(self, "objective", terms.objective)
        _check(self)

    @property
    def terms(self) -> JobTerms:
        """The job's objective and constraints, as the controller takes them."""
        return JobTerms.of(self)

    def for_job(self, job_url: str) -> JobSpec:
        """The spec as the job keeps it: checkpoints under the job's folder unless the user named a place."""
        return self if self.checkpoint_url else dataclasses.replace(self, checkpoint_url=f"{job_url}/checkpoints")


def _check(spec: JobSpec) -> None:
    def positive(name: str, value: float | None, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if value is None or not value > 0:  # NaN too
            raise JobSpecError(name, f"must be positive, got {value}")

    def at_least_one(name: str, value: int | None, *, optional: bool = False) -> None:
        if not (optional and value is None) and (value is None or value < 1):
            raise JobSpecError(name, f"must be at least 1, got {value}")

    positive("budget_usd", spec.budget_usd)
    at_least_one("steps", spec.steps)
    positive("max_usd_per_hr", spec.max_usd_per_hr, optional=True)
    at_least_one("max_gpus", spec.max_gpus, optional=True)
    if spec.on_demand_gpus and not spec.spot:  # a job off spot rents every GPU on demand already
        raise JobSpecError("on_demand_gpus", "is for spot jobs; without spot every GPU is rented on demand")
    at_least_one("global_batch_size", spec.global_batch_size, optional=True)
    at_least_one("checkpoint_every_steps", spec.checkpoint_every_steps)
    check_dataset(spec.dataset)
    _check_url("tokenizer", spec.tokenizer)
    check_worker_options(spec)
    if any(s < 1 for s in spec.preempt_at_steps):
        raise JobSpecError("preempt_at_steps", f"must list steps of at least 1, got {list(spec.preempt_at_steps)}")


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def check_names(spec: JobSpec) -> None:
    """Names against the catalogs: a typo fails at once, with the likely spelling, not in the flow.

    Apart from the checks of every JobSpec: the front ends (``sailor train``, the train-job flow's
    parameters) call it on what users give, while a saved job state stays readable when a catalog
    changes, and other flows may keep their own records in a JobSpec (a network profile's)."""
    if is_model_url(spec.model):  # the flow and the workers start in other folders
        _check_url("model", spec.model)
    try:
        resolve_model(spec.model)
    except UnknownNameError:
        raise JobSpecError("model", f"{spec.model!r} is not in the model catalog; "
                                    f"{_did_you_mean(spec.model, model_names())}(`sailor catalog models`; "
                                    "or a Hugging Face model folder, by its path)") from None
    except InputError as exc:
        raise JobSpecError("model", str(exc)) from None
    for gpu in spec.gpus:
        _check_gpu_type(gpu)
    zones = catalog_zones()
    for zone in spec.zones:
        if zone not in zones:
            raise JobSpecError("zones", f"{zone!r}: no cloud of the catalog sells GPUs there; "
                                        f"{_did_you_mean(zone, zones)}(`sailor catalog instances`)")
    for cloud in spec.clouds:
        if cloud not in rented_clouds():
            raise JobSpecError("clouds", f"{cloud!r} is not a cloud Sailor rents from; "
                                         f"known: {', '.join(rented_clouds())}")


def _check_gpu_type(gpu: str) -> None:
    """A GPU type some cloud rents; ``sailor plan``'s TYPE@ZONE=N written here gets its translation."""
    if any(c in gpu for c in "@=:"):
        name, _, rest = gpu.replace(":", "@").partition("@")
        zone, _, count = rest.partition("=")
        if "=" in name:
            name, _, count = name.partition("=")
        hint = f"--gpus {name}" + (f" --zones {zone}" if zone else "") + (f" --max-gpus {count}" if count else "")
        raise JobSpecError("gpus", f"takes GPU types like T4,A100-40, not {gpu!r} (TYPE@ZONE=N is `sailor plan`'s "
                                   f"form); here write {hint}")
    try:
        canonical = normalize_gpu_name(gpu)
    except UnknownNameError:
        raise JobSpecError("gpus", f"{gpu!r} is not a GPU type in the catalog; "
                                   f"{_did_you_mean(gpu, gpu_names())}known: {', '.join(rentable_gpus())}") from None
    if canonical not in rentable_gpus():
        raise JobSpecError("gpus", f"{gpu!r}: no cloud of the catalog rents it; "
                                   f"rentable: {', '.join(rentable_gpus())}")


def check_dataset(dataset: str) -> None:
    """A token file's URL as jobs and `sailor engine run` take it (JobSpecError on field "dataset")."""
    if dataset == "synthetic":
        return
    scheme = dataset.split("://", 1)[0] if "://" in dataset else ""
    if scheme not in ("", "file", "s3", "gs"):
        raise JobSpecError("dataset", f"must be a path, file://, s3:// or gs:// URL, got {dataset!r}")
    if not dataset.endswith((".bin", ".npy")):
        raise JobSpecError("dataset", f"must name a .bin, .u32.bin or .npy token file, got {dataset!r}")


def check_worker_options(spec: Any) -> None:
    """The values of the options that reach the workers (``Option.worker``), on ``spec``: a JobSpec,
    or the workers' Recipe (the same attribute names); JobSpecError naming the field."""
    _check_init_from(spec.init_from)
    if not 0 <= spec.validation_fraction < 1:  # NaN too
        raise JobSpecError("validation_fraction", f"must be in [0, 1), got {spec.validation_fraction}")
    if spec.validate_every_steps < 0:
        raise JobSpecError("validate_every_steps", f"must be at least 0, got {spec.validate_every_steps}")
    if spec.validate_every_steps and not spec.validation_fraction:
        raise JobSpecError("validate_every_steps", "needs held-out samples (a validation_fraction above 0)")
    if spec.validation_batches < 1:
        raise JobSpecError("validation_batches", f"must be at least 1, got {spec.validation_batches}")
    if not spec.learning_rate > 0:
        raise JobSpecError("learning_rate", f"must be positive, got {spec.learning_rate}")
    if spec.warmup_steps is not None and spec.warmup_steps < 0:
        raise JobSpecError("warmup_steps", f"must be at least 0, got {spec.warmup_steps}")
    if not 0 <= spec.min_lr_ratio <= 1:
        raise JobSpecError("min_lr_ratio", f"must be in [0, 1], got {spec.min_lr_ratio}")
    for name in ("weight_decay", "grad_clip_norm"):
        if not getattr(spec, name) >= 0:
            raise JobSpecError(name, f"must be at least 0, got {getattr(spec, name)}")
    _check_trackers(spec.wandb_project, spec.mlflow_tracking_uri)
    if region_problem(spec.checkpoint_region):
        raise JobSpecError("checkpoint_region", region_problem(spec.checkpoint_region))


def _check_trackers(wandb_project: str, mlflow_uri: str) -> None:
    bad = sorted(set(wandb_project) & set(_WANDB_FORBIDDEN))
    if bad or len(wandb_project) > 128:  # W&B refuses these in project names
        raise JobSpecError("wandb_project", f"is not a W&B project name (no {' '.join(_WANDB_FORBIDDEN)}; "
                                            f"at most 128 characters), got {wandb_project!r}")
    scheme = mlflow_uri.split("://", 1)[0] if "://" in mlflow_uri else ""
    if mlflow_uri and scheme not in _MLFLOW_SCHEMES:
        raise JobSpecError("mlflow_tracking_uri", f"must be an http(s):// server, a file:// store or a "
                                                  f"databricks URI, got {mlflow_uri!r}")
    if "@" in mlflow_uri.split("://", 1)[-1].split("/", 1)[0]:  # it is written into checkpoints and logs
        raise JobSpecError("mlflow_tracking_uri", "must not carry credentials: set MLFLOW_TRACKING_USERNAME/"
                                                  "PASSWORD (or _TOKEN) on the instances")


_WANDB_FORBIDDEN = "/\\#?%:"
_MLFLOW_SCHEMES = ("http", "https", "file", "databricks")


def _check_init_from(url: str) -> None:
    _check_url("init_from", url)


def _check_url(field: str, url: str) -> None:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in ("", "file", "s3", "gs"):
        raise JobSpecError(field, f"must be a path, file://, s3:// or gs:// URL, got {url!r}")
    if url and not scheme and not url.startswith("/"):  # the workers start in other folders
        raise JobSpecError(field, f"must be an absolute path or a URL, got {url!r}")


def spec_field(name: str) -> SpecField:
    """The JobSpec field ``name`` (its default, its flag)."""
    return next(f for f in spec_fields(JobSpec) if f.name == name)


def worker_fields() -> tuple[SpecField, ...]:
    """The fields that reach the engine's workers (``Option.worker``), in declaration order."""
    return tuple(f for f in spec_fields(JobSpec) if f.option.worker)


# What a continued job (``sailor train --job-id`` of a job that exists) may change: raise these.
RAISABLE = ("budget_usd", "steps")


def continued_spec(recorded: JobSpec, given: dict[str, Any]) -> JobSpec:
    """The spec a continued job runs under: its ``recorded`` one, with the ``given`` values (field ->
    value, as a command line gave them) of ``RAISABLE`` fields raised; JobSpecError naming the field
    for a lower one or any other field that differs from the recorded (the job keeps its settings)."""
    changes: dict[str, Any] = {}
    for name, value in given.items():
        was = getattr(recorded, name)
        if value == was or (name in ("checkpoint_url", "checkpoint_region") and not value):
            continue
        if name not in RAISABLE:
            raise JobSpecError(name, f"is {value!r} for the job, which keeps the settings it started with "
                                     f"({was!r}); a continued job may only raise --budget-usd and --steps")
        if value < was:
            raise JobSpecError(name, f"{value} is below the job's {was}: a continued job may only raise it")
        changes[name] = value
    return dataclasses.replace(recorded, **changes) if changes else recorded


def raised_limits(recorded: JobSpec, asked: JobSpec) -> JobSpec | None:
    """``asked`` when it is ``recorded`` with only ``RAISABLE`` fields raised (a continued job's flow
    run), else None."""
    same = dataclasses.replace(asked, **{n: getattr(recorded, n) for n in RAISABLE})
    if same != recorded or any(getattr(asked, n) < getattr(recorded, n) for n in RAISABLE):
        return None
    return asked


def raised_words(recorded: JobSpec, spec: JobSpec) -> str:
    """``budget 0.5 -> 1 USD, steps 200 -> 400``: what a continued job raised ("" when nothing)."""
    parts = []
    if spec.budget_usd != recorded.budget_usd:
        parts.append(f"budget {recorded.budget_usd:g} -> {spec.budget_usd:g} USD")
    if spec.steps != recorded.steps:
        parts.append(f"steps {recorded.steps} -> {spec.steps}")
    return ", ".join(parts)
