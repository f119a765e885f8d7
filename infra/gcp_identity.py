"""A GCP job's identity: its own service account, granted the job's Cloud Storage URLs by bucket IAM.

As on real GCP: the account ``sailor-<job>@PROJECT.iam.gserviceaccount.com`` (IAM's
``projects.serviceAccounts.create``), and in each bucket the job uses, bindings of its account
(``setIamPolicy`` of the JSON API, policy version 3) with IAM Conditions:

- a prefix the job writes (its own prefixes): ``roles/storage.objectAdmin`` on the objects under
  ``PREFIX/`` and on listings of that prefix (the API attribute ``objectListPrefix``: a listing is
  checked on the bucket, where ``resource.name`` names no object);
- a prefix it reads (``--init-from``): ``roles/storage.objectViewer``, the same condition;
- an object it reads (``--data``): ``roles/storage.objectViewer`` on that one object, ``==`` not
  ``startsWith`` (an object is not a folder);
- a bucket's root: the role without a condition.

The buckets it was granted are written in the account's description, so deleting the identity
(also from a hook in another process) finds and removes its bindings before the account.  The
caller needs ``roles/iam.serviceAccountAdmin``, ``iam.serviceAccounts.actAs`` on the accounts
and ``storage.buckets.setIamPolicy`` on the buckets (uniform bucket-level access on, which
conditions need).  On the embedded cloud the same calls reach ``infra/local/gcp_iam.py``.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections.abc import Sequence

from google.auth.transport.requests import AuthorizedSession

from infra.errors import CloudConfigError, CloudError, TransientCloudError
from infra.records import job_resource_name

IAM_URL, STORAGE_URL = "https://iam.googleapis.com", "https://storage.googleapis.com"
OBJECT_ADMIN, OBJECT_VIEWER = "roles/storage.objectAdmin", "roles/storage.objectViewer"
_LIST_PREFIX = 'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
_BUCKETS_NOTE = "buckets: "
_ETAG_TRIES = 5


def job_account_id(job_id: str) -> str:
    """The job's service account id: ``sailor-<job>``, 6 to 30 characters of ``[a-z0-9-]`` (a
    longer one cut, with a hash of the job id so two long ids stay apart)."""
    name = re.sub(r"[^a-z0-9-]", "-", job_resource_name(job_id).lower()).strip("-")
    if len(name) <= 30:
        return name
    return f"{name[:23].rstrip('-')}-{hashlib.sha256(job_id.encode()).hexdigest()[:6]}"


def job_account_email(job_id: str, project: str) -> str:
    return f"{job_account_id(job_id)}@{project}.iam.gserviceaccount.com"


def _bucket_and_key(url: str) -> tuple[str, str]:
    if not url.startswith("gs://"):
        raise ValueError(f"{url}: not a gs:// URL")
    bucket, _, key = url[len("gs://"):].partition("/")
    return bucket, key


def _prefix_condition(bucket: str, prefix: str, title: str) -> dict:
    expression = (f'(resource.type == "storage.googleapis.com/Object" && '
                  f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}/")) || '
                  f'(resource.type == "storage.googleapis.com/Bucket" && {_LIST_PREFIX}.startsWith("{prefix}/"))')
    return {"title": title, "expression": expression}


def job_bindings(member: str, job_id: str, *, read_write: Sequence[str] = (), read_only: Sequence[str] = (),
                 read_objects: Sequence[str] = ()) -> dict[str, list[dict]]:
    """Per bucket, the bindings that grant ``member`` exactly the job's gs:// URLs (module doc)."""
    out: dict[str, list[dict]] = {}
    title = job_resource_name(job_id)[:80]
    for urls, role, kind in ((read_write, OBJECT_ADMIN, "rw"), (read_only, OBJECT_VIEWER, "read")):
        for url in urls:
            bucket, prefix = _bucket_and_key(url)
            binding = {"role": role, "members": [member]}
            if prefix.strip("/"):
                binding["condition"] = _prefix_condition(bucket, prefix.strip("/"), f"{title} {kind}")
            out.setdefault(bucket, []).append(binding)
    for url in read_objects:
        bucket, key = _bucket_and_key(url)
        if not key or url.endswith("/"):
            raise ValueError(f"{url}: an object's URL names a key, not a bucket or folder")
        out.setdefault(bucket, []).append({"role": OBJECT_VIEWER, "members": [member], "condition": {
            "title": f"{title} object", "expression": f'resource.name == "projects/_/buckets/{bucket}/objects/{key}"'}})
    return out


class GcpJobIdentities:
    """The IAM and Cloud Storage calls behind ``GCPProvider``'s ``Feature.JOB_IDENTITY``."""

    def __init__(self, *, credentials, project: str, endpoint: str | None = None, timeout_s: float = 30.0) -> None:
        self.project = project
        self._iam, self._storage = (endpoint, endpoint) if endpoint else (IAM_URL, STORAGE_URL)
        self._http = AuthorizedSession(credentials)
        self.timeout_s = timeout_s

    def _request(self, method: str, url: str, *, body: dict | None = None, ok_missing: bool = False) -> dict | None:
        resp = self._http.request(method, url, json=body, timeout=self.timeout_s)
        if resp.status_code == 404 and ok_missing:
            return None
        if resp.status_code < 300:
            return resp.json() if resp.content else {}
        what = f"gcp {method} {url.split('?')[0]}: {resp.status_code} {resp.text[:300]}"
        if resp.status_code in (429, 500, 502, 503, 504):
            raise TransientCloudError(what, cloud="gcp", code=str(resp.status_code))
        if resp.status_code in (401, 403):
            raise CloudConfigError(f"{what} (a job's identity needs roles/iam.serviceAccountAdmin and "
                                   "storage.buckets.setIamPolicy on its buckets)", cloud="gcp", code="forbidden")
        raise CloudError(what, cloud="gcp", code=str(resp.status_code))

    def _account_url(self, email: str = "") -> str:
        base = f"{self._iam}/v1/projects/{self.project}/serviceAccounts"
        return f"{base}/{urllib.parse.quote(email)}" if email else base

    def _policy_url(self, bucket: str) -> str:
        return f"{self._storage}/storage/v1/b/{urllib.parse.quote(bucket)}/iam"

    def create(self, job_id: str, *, read_write: Sequence[str], read_only: Sequence[str] = (),
               read_objects: Sequence[str] = ()) -> str:
        """The job's account (made, or kept when it exists) and its bindings; its email."""
        email = job_account_email(job_id, self.project)
        grants = job_bindings(f"serviceAccount:{email}", job_id, read_write=read_write, read_only=read_only,
                              read_objects=read_objects)
        if self._request("GET", self._account_url(email), ok_missing=True) is None:
            self._request("POST", self._account_url(), body={
                "accountId": job_account_id(job_id),
                "serviceAccount": {"displayName": job_resource_name(job_id)[:100],
                                   "description": f"Sailor job {job_id}; {_BUCKETS_NOTE}{','.join(sorted(grants))}"[:256]}})
        for bucket, bindings in grants.items():
            self._update_policy(bucket, lambda old, b=bindings, m=f"serviceAccount:{email}": _without(old, m) + b)
        return email

    def delete(self, job_id: str) -> list[str]:
        """The job's bindings in the buckets its account's description names, then the account."""
        email = job_account_email(job_id, self.project)
        account = self._request("GET", self._account_url(email), ok_missing=True)
        if account is None:
            return []
        note = (account.get("description") or "").partition(_BUCKETS_NOTE)[2]
        for bucket in filter(None, note.split(",")):
            self._update_policy(bucket, lambda old: _without(old, f"serviceAccount:{email}"), ok_missing=True)
        self._request("DELETE", self._account_url(email), ok_missing=True)
        return [email]

    def accounts_readable(self) -> None:
        """Raises unless these credentials may list the project's service accounts (``sailor doctor``)."""
        self._request("GET", f"{self._account_url()}?pageSize=1")

    def leftovers(self, job_id: str) -> list[str]:
        email = job_account_email(job_id, self.project)
        return [email] if self._request("GET", self._account_url(email), ok_missing=True) is not None else []

    def _update_policy(self, bucket: str, change, *, ok_missing: bool = False) -> None:
        """Read, change and write the bucket's policy; again when another writer came between (etag)."""
        url = self._policy_url(bucket)
        for attempt in range(_ETAG_TRIES):
            policy = self._request("GET", f"{url}?optionsRequestedPolicyVersion=3", ok_missing=ok_missing)
            if policy is None:
                return
            bindings = change(policy.get("bindings") or [])
            body = {"bindings": bindings, "etag": policy.get("etag"), "version": 3}
            try:
                self._request("PUT", url, body=body)
                return
            except CloudError as exc:
                if exc.code != "412" or attempt == _ETAG_TRIES - 1:
                    raise


def _without(bindings: list[dict], member: str) -> list[dict]:
    """The bindings less ``member`` (a binding left without members goes)."""
    out = []
    for binding in bindings:
        members = [m for m in binding.get("members", []) if m != member]
        if members:
            out.append({**binding, "members": members})
    return out
