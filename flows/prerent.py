"""The checks before renting (``sailor_core.job.prerent``) where the job will run: in ``sailor
train`` before the flow is submitted (no Prefect loaded, no job or flow run made), and at the
train-job flow's start, where a deployment run or one from the UI is checked the same way.

In the CLI the GPUs offered are the catalog's (a superset of any cloud's offers, at the embedded
cloud's own prices); real clouds' live spot prices may be lower, so their budget is checked by
the flow on the offers it gets.  Object storage is reached as the flow will reach it: on the
embedded cloud, its S3 (of the embedded cloud running; with none running its buckets are not
there yet), and no GCS (the embedded cloud has no GCS endpoint).
"""

from __future__ import annotations

import dataclasses
import os

from infra import config
from sailor_core.catalog.instances import catalog_offers
from sailor_core.job.prerent import check_inputs, check_reach
from sailor_core.job.spec import JobSpec, JobSpecError
from tasks.embedded_bucket import use_embedded_s3

# obstore's GCSStore reaches an emulator at this base URL (tests/gcs_fake.py); the embedded cloud has none
GCS_ENDPOINT_ENV = "GOOGLE_BASE_URL"


def check_before_renting(spec: JobSpec, *, cloud: str, max_gpus_per_zone: int) -> None:
    """JobSpecError (one line naming the field) for an input the job's workers would refuse, a
    floor no plan reaches or a budget that buys no checkpoint; nothing is started."""
    embedded = not (cloud == "real" or (cloud == "auto" and config.real_clouds()))
    check_inputs(_reach_embedded_storage(spec) if embedded else spec)
    offers = catalog_offers(gpus=spec.gpus or None, zones=spec.zones or None, clouds=spec.clouds or None)
    check_reach(spec, offers, max_gpus_per_zone=max_gpus_per_zone, prices_are_live=embedded)



def _reach_embedded_storage(spec: JobSpec) -> JobSpec:
    """Reach the embedded cloud's S3 as the flow will; ``spec`` as it can be checked now.  With
    no embedded cloud running, the one the flow starts has no bucket but those the flow makes
    (the jobs bucket, an ``s3://`` checkpoint URL's): data or weights in S3 cannot be there, which
    is said at once rather than after starting that cloud (seconds), and the checkpoint URL is
    left to the flow."""
    gcs = [(f, u) for f, u in (("dataset", spec.dataset), ("init_from", spec.init_from),
                               ("checkpoint_url", spec.checkpoint_url)) if u.startswith("gs://")]
    if gcs and not os.environ.get(GCS_ENDPOINT_ENV):
        field, url = gcs[0]
        raise JobSpecError(field, f"{url}: the embedded cloud has no GCS endpoint (use s3:// or a path there, "
                                  "or gs:// on GCP)")
    reads = [u for u in (spec.dataset, spec.init_from) if u.startswith("s3://")]
    if not reads and not spec.checkpoint_url.startswith("s3://"):
        return spec
    running = config.running_embedded_endpoints()
    if running is not None:
        use_embedded_s3(running["aws_endpoint"])
        return spec
    if reads:
        field = "dataset" if reads[0] == spec.dataset else "init_from"
        bucket = reads[0][len("s3://"):].split("/", 1)[0]
        raise JobSpecError(field, f"{reads[0]}: no bucket {bucket!r} in the embedded cloud's S3 (none is "
                                  "running: `sailor cloud up` starts one that keeps its buckets while it runs)")
    return dataclasses.replace(spec, checkpoint_url="")
