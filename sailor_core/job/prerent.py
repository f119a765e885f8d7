"""What is checked before anything is rented: the inputs a job's workers would refuse only after
their instances booted (and were paid for), each refused here in one line.

- ``check_inputs``: the ``--init-from`` folder (a readable ``config.json`` of a supported family
  that is the job's model, and weights whose safetensors headers parse and fit the model:
  ``catalog/hf_weights.check_weights``), the ``--data`` object in object storage (there and
  readable), and the ``--checkpoint-url`` (writable: a probe object written and deleted).
  Storage is reached with this process's credentials, the ones the flow hands the job: on the
  clouds the job's own identity is granted exactly these locations (``infra/aws.prefix_policy``).
- ``check_reach``: a throughput floor above what any plan on the GPUs offered reaches, and a
  budget that does not buy one checkpoint interval of the cheapest plan (its start-up the flow's
  controller's, ``economics.job_costs``: the checkpoint's reload included); both from the planner's
  own ideal bounds (``planner.ideal_bounds``: every GPU busy, no bubble, link or sync), so a
  refusal is certain while a floor or budget merely tight still goes to the planner and the
  controller (which wait for capacity that is really missing, as before).

Each raises ``JobSpecError`` naming the field, which the CLI spells as its option.  The CLI runs
them before it submits the flow (no job, no flow run); the train-job flow runs them again at its
start (a deployment run or one from the UI), before anything is rented.
"""

from __future__ import annotations

import secrets

from sailor_core.catalog.hf_config import (check_hf_config, read_hf_config, refuse_unsupported, resolve_model,
                                          spec_from_hf_config)
from sailor_core.catalog.hf_weights import check_weights
from sailor_core.catalog.instances import Offer
from sailor_core.catalog.models import get_model
from sailor_core.controller.economics import job_costs
from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpec, JobSpecError
from sailor_core.storage import StorageError, open_storage

OBJECT_SCHEMES = ("s3://", "gs://")
_PROBE = ".sailor-write-check-"


def local_checkpoint_problem(url: str) -> str | None:
    """Why ``url`` (a ``--checkpoint-url``) cannot hold a job's checkpoints, or None: a folder of
    this machine is out of the instances' reach (on the embedded cloud too, whose instances are
    confined as VMs)."""
    if not url or ("://" in url and not url.startswith("file://")):
        return None
    return ("a folder on this machine is out of the instances' reach; give an s3:// or gs:// URL, "
            "or leave it out for the job's bucket")


def check_inputs(spec: JobSpec) -> None:
    """The job's model weights, data and checkpoint location, as its workers will use them."""
    if spec.init_from:
        _check_init_from(spec)
    if spec.dataset.startswith(OBJECT_SCHEMES):
        _check_readable_object("dataset", spec.dataset)
    if spec.checkpoint_url:
        _check_writable("checkpoint_url", spec.checkpoint_url)


def _check_init_from(spec: JobSpec) -> None:
    url = spec.init_from.rstrip("/")
    try:
        model = get_model(resolve_model(spec.model))
        cfg = read_hf_config(url)
        refuse_unsupported(cfg)
        spec_from_hf_config(cfg)  # an unknown family is refused here
        check_hf_config(model, cfg, url)
        check_weights(url, model)
    except InputError as exc:
        raise JobSpecError("init_from", _one_line(exc)) from None


def _check_readable_object(field: str, url: str) -> None:
    folder, _, key = url.rpartition("/")
    try:
        open_storage(folder).size(key)
        return
    except FileNotFoundError:
        problem = _missing_bucket(url) or f"{url}: no such object"
    except StorageError as exc:
        problem = _missing_bucket(url) or _one_line(exc)
    raise JobSpecError(field, problem)


def _missing_bucket(url: str) -> str | None:
    """Why ``url``'s bucket cannot be listed (it does not exist, or these credentials may not see
    it), or None when it can be."""
    scheme, _, rest = url.partition("://")
    bucket = rest.split("/", 1)[0]
    try:
        open_storage(f"{scheme}://{bucket}").list_dirs()
        return None
    except FileNotFoundError:
        return f"{url}: no bucket {bucket!r}"
    except StorageError as exc:
        reason = _one_line(exc)
        if "404" in reason or "NoSuchBucket" in reason:
            return f"{url}: no bucket {bucket!r}"
        return f"{url}: bucket {bucket!r} cannot be listed ({reason.split(': ', 1)[-1]})"


def _check_writable(field: str, url: str) -> None:
    """A probe object written and deleted; an ``s3://`` bucket not there yet passes, since the
    flow creates it (``infra/buckets.py``, public access blocked) when it opens its session."""
    probe = f"{_PROBE}{secrets.token_hex(4)}"
    try:
        storage = open_storage(url)
        storage.put(probe, b"")
        storage.delete(probe)
    except (StorageError, OSError, InputError) as exc:
        reason = _one_line(exc).split(": ", 1)[-1]
        if url.startswith("s3://") and reason.endswith("no such bucket"):
            return
        raise JobSpecError(field, f"{url}: not writable ({reason})") from None


def check_reach(spec: JobSpec, offers: list[Offer], *, max_gpus_per_zone: int, prices_are_live: bool = True) -> None:
    """The floor and the budget against what any plan on ``offers`` could do at best.
    ``prices_are_live``: the offers' prices are the ones the job will pay (a catalog's list
    prices for a real cloud are not: its budget is then left to the controller)."""
    usable_offers = [o for o in offers if (not spec.gpus or o.gpu in spec.gpus)
                     and (not spec.zones or o.zone in spec.zones)]
    if not usable_offers:
        return  # nothing offered: the planner and the controller say so, and wait
    cheapest = min(usable_offers, key=lambda o: _node_usd_per_hr(o, spec.spot))
    # The controller starts a plan only when the budget pays its start-up: the flow's own
    # (``economics.job_costs``, as ``tasks.control.flow_costs``), the checkpoint's reload included.
    start_s = job_costs(spec.model).restart_s
    start_usd = _node_usd_per_hr(cheapest, spec.spot) * start_s / 3600.0
    if prices_are_live and spec.budget_usd <= start_usd:
        raise JobSpecError("budget_usd", _budget_words(spec, start_usd, cheapest))
    if spec.min_throughput_samples_per_s is None and not prices_are_live:
        return
    # lazy: the planner and the plan types load numpy, and the bound the layer profiles (~1 s on a
    # quiet machine), only when the floor or the budget is not settled by the prices alone
    from sailor_core.job.nodes import availability_from_offers
    from sailor_core.planner import ideal_bounds
    from sailor_core.planner.request import PlanQuery

    usable = availability_from_offers(usable_offers, max_gpus_per_type_zone=max_gpus_per_zone)
    per_gpu = {(o.gpu, o.zone): o.usd_per_gpu_hr(spot=spec.spot) for o in offers}
    request = PlanQuery(model=spec.model, global_batch_size=spec.global_batch_size, spot=spec.spot).on(usable)
    bounds = ideal_bounds(request, max_gpus=spec.max_gpus, usd_per_gpu_hr=per_gpu)
    if bounds is None:
        return
    floor = spec.min_throughput_samples_per_s
    if floor is not None and floor > bounds.throughput_samples_per_s:
        raise JobSpecError("min_throughput_samples_per_s",
                           f"{floor:g} samples/s is above what any plan on the GPUs offered reaches: at most "
                           f"{bounds.throughput_samples_per_s:.4g} samples/s on {bounds.num_gpus} GPUs "
                           "(every GPU busy, no bubble or sync)")
    least_usd = start_usd + min(spec.checkpoint_every_steps, spec.steps) * bounds.usd_per_iteration
    if prices_are_live and spec.budget_usd < least_usd:
        raise JobSpecError("budget_usd", _budget_words(spec, least_usd, cheapest))


def _node_usd_per_hr(offer: Offer, spot: bool) -> float:
    return offer.spot_usd_per_hr if spot else offer.on_demand_usd_per_hr


def _budget_words(spec: JobSpec, least_usd: float, cheapest: Offer) -> str:
    interval = min(spec.checkpoint_every_steps, spec.steps)
    costs = job_costs(spec.model)
    reload_s = costs.state_load.storage_load_s if costs.state_load is not None else 0.0
    return (f"{spec.budget_usd:g} USD does not buy one checkpoint interval ({interval} steps) of the cheapest "
            f"plan: that takes at least {least_usd:.4g} USD (its start-up of {costs.restart_s:.3g} s, "
            f"{reload_s:.3g} s of it the checkpoint's reload, on "
            f"{cheapest.instance_type} in {cheapest.zone} at {_node_usd_per_hr(cheapest, spec.spot):g} USD/h, "
            "then the steps)")


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
