"""What a job rents in the clouds besides instances: the network rules opening its ports among
its own instances, and the identity its instances run as (allowed the job's bucket prefixes
only).  Opened with the job's session, deleted with it (or by a hook after a crash), and looked
for afterwards.  Each provider declares whether it has them (``infra.provider.Feature``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from infra import config
from infra.provider import CloudProvider, Feature
from sailor_core.catalog.clouds import cloud_facts
from sailor_core.job.spec import JobSpec
from tasks.cloud_session import CloudSession


def open_job_resources(session: CloudSession, spec: JobSpec) -> None:
    """The job's rules (its ports among its own instances) and the identity its instances run as,
    made by each cloud that has them and registered with the session, which deletes them when it
    closes.  An identity is made by each cloud whose object store holds one of the job's URLs, and
    trusts the accounts the job's instances run as in the session's other clouds (GCP instances
    run as the job's own service account, which assumes the job's AWS role by web identity when
    the bucket is S3); GCP makes the job's account even with no gs:// URL to grant."""
    for provider in session.providers.values():
        if provider.supports(Feature.JOB_NETWORK):
            provider.open_job_network(session.job_id)
            session._closers.append(lambda p=provider: p.delete_job_network(session.job_id))
    trusted = {c: a for c, p in session.providers.items() if (a := p.job_instance_account(session.job_id))}
    for provider in _identity_providers(session):
        scheme = f"{cloud_facts(provider.cloud).storage_scheme}://"
        rw = [u for u in {session.jobs_url, session.checkpoint_url(spec.checkpoint_url)} if u.startswith(scheme)]
        # a cloud whose instances run as the job's own account makes it even with none of its URLs to grant
        runs_as_it = provider.cloud in session.providers and provider.job_instance_account(session.job_id) is not None
        if rw or runs_as_it:
            # registered first: a create that fails half-way (an account made, a bucket refused) is undone too
            session._closers.append(lambda p=provider: p.delete_job_identity(session.job_id))
            provider.create_job_identity(session.job_id, read_write=sorted(rw), trusted_accounts=trusted,
                                         **job_reads(spec, scheme))


def job_reads(spec: JobSpec, scheme: str) -> dict[str, list[str]]:
    """What the job's instances read besides their own prefixes, in the object store of ``scheme``
    (``s3://``, ``gs://``): the ``--init-from`` folder (a prefix) and the ``--data`` token file
    (one object, not a folder)."""
    return {"read_only": [u for u in (spec.init_from,) if u.startswith(scheme)],
            "read_objects": [u for u in (spec.dataset,) if u.startswith(scheme)]}


def _identity_providers(session: CloudSession) -> list[CloudProvider]:
    own = [p for p in session.providers.values() if p.supports(Feature.JOB_IDENTITY)]
    scheme = session.jobs_url.split("://", 1)[0]
    if session.mode != "embedded" or any(cloud_facts(p.cloud).storage_scheme == scheme for p in own):
        return own
    # The embedded jobs bucket is S3 (moto's) whichever cloud the job rents: a GCP-only job's
    # instances still read it through the identity of the bucket's cloud, which they may assume.
    from infra.local.cloud import providers_for  # lazy: the SDKs, only for the embedded cloud

    ends = config.embedded_endpoints()
    return own + [p for p in providers_for(ends["aws_endpoint"], ends["gce_endpoint"],
                                            aws_keys=tuple(ends["aws_keys"])).values()
                  if p.supports(Feature.JOB_IDENTITY) and cloud_facts(p.cloud).storage_scheme == scheme]


def job_leftovers(job_id: str, providers: Mapping[str, CloudProvider] | None = None) -> list[str]:
    """The job's network rules and identities still in the clouds (none after the job)."""
    found: list[str] = []
    for provider in (providers or config.get_providers()).values():
        if provider.supports(Feature.JOB_NETWORK):
            found += provider.job_network_leftovers(job_id)
        if provider.supports(Feature.JOB_IDENTITY):
            found += provider.job_identity_leftovers(job_id)
    return found


def delete_job_resources(providers: Mapping[str, CloudProvider], job_id: str, *, reason: str) -> None:
    """From a hook: delete the rules and identity the job's instances held; never raises (says
    on stderr what could not be deleted)."""
    for cloud, provider in providers.items():
        verbs = ((Feature.JOB_NETWORK, provider.delete_job_network), (Feature.JOB_IDENTITY, provider.delete_job_identity))
        for feature, delete in verbs:
            if not provider.supports(feature):
                continue
            try:
                delete(job_id)
            except Exception as exc:  # noqa: BLE001 - a hook must not raise
                sys.stderr.write(f"sailor: could not clean up {job_id} on {cloud} "
                                 f"({delete.__name__}, {reason}): {exc}\n")
