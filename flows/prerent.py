"""The checks before renting (``sailor_core.job.prerent``) where the job will run: in ``sailor
train`` before the flow is submitted (no Prefect loaded, no job or flow run made), and at the
train-job flow's start, where a deployment run or one from the UI is checked the same way.

In the CLI the GPUs offered are the catalog's (a superset of any cloud's offers, at the embedded
cloud's own prices); real clouds' live spot prices may be lower, so their budget is checked by
the flow on the offers it gets.  Object storage is reached as the flow will reach it: on the
embedded cloud, its buckets on disk (S3 and GCS, ``infra.config.use_embedded_storage``).
"""

from __future__ import annotations

from infra import config
from sailor_core.catalog.clouds import rented_clouds
from sailor_core.catalog.instances import catalog_offers
from sailor_core.job.prerent import check_inputs, check_reach, local_checkpoint_problem
from sailor_core.job.spec import JobSpec, JobSpecError


def check_before_renting(spec: JobSpec, *, cloud: str, max_gpus_per_zone: int) -> None:
    """JobSpecError (one line naming the field) for an input the job's workers would refuse, a
    floor no plan reaches or a budget that buys no checkpoint; nothing is started."""
    problem = local_checkpoint_problem(spec.checkpoint_url)
    if problem:  # on every cloud, as the flow's session refuses it
        raise JobSpecError("checkpoint_url", f"{spec.checkpoint_url}: {problem}")
    _refuse_gcs_beyond_gcp(spec)
    embedded = not (cloud == "real" or (cloud == "auto" and config.real_clouds()))
    check_inputs(_reach_embedded_storage(spec) if embedded else spec)
    offers = catalog_offers(gpus=spec.gpus or None, zones=spec.zones or None, clouds=spec.clouds or None)
    check_reach(spec, offers, max_gpus_per_zone=max_gpus_per_zone, prices_are_live=embedded)


def _reach_embedded_storage(spec: JobSpec) -> JobSpec:
    """Reach the embedded cloud's buckets (on disk under the Sailor home, S3 and GCS) as the flow
    will, when the job names any."""
    if any(u.startswith(("s3://", "gs://")) for u in (spec.dataset, spec.init_from, spec.checkpoint_url)):
        config.use_embedded_storage()
    return spec


def _refuse_gcs_beyond_gcp(spec: JobSpec) -> None:
    """A gs:// location is reached by a GCE instance's service account; an AWS instance has no GCP
    identity (its boot would fail with 403 after renting), so such a job runs on GCP alone."""
    gcs = [(f, u) for f, u in (("data", spec.dataset), ("init_from", spec.init_from),
                               ("checkpoint_url", spec.checkpoint_url)) if u.startswith("gs://")]
    others = [c for c in (spec.clouds or rented_clouds()) if c != "gcp"]
    if gcs and others:
        field, url = gcs[0]
        flag = "--" + field.replace("_", "-")
        raise JobSpecError("clouds", f"must be gcp alone for a job with gs:// locations ({flag} {url}): "
                                     f"{', '.join(others)} instances have no GCP identity; give --clouds gcp")
