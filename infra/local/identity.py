"""What an embedded instance's metadata server says about who it is, and its role's credentials.

AWS instances: IMDSv2 (``PUT latest/api/token``), ``latest/meta-data/instance-id``,
``placement/availability-zone`` and ``iam/security-credentials/<role>``: temporary keys of the
role in the instance profile attached at launch (recorded by moto's EC2 and IAM).  GCE
instances: ``computeMetadata/v1/instance/{name,zone,service-accounts/default/email}``; for
a job whose bucket is on S3 they get the keys of the AWS role whose trust policy names their
service account (the embedded stand-in for AWS web-identity federation of a GCP service
account, docs/clouds.md).  An instance without a profile or account gets no credentials.

The keys are issued here and recorded, and S3 requests signed with them must stay inside what
the role's inline policies allow (``s3_refusal``, evaluated by moto's IAM policy engine): neither
moto's S3 nor rclone (the buckets on disk) checks credentials itself. GCS tokens the metadata
server issued are recorded too (``token_account``): the GCS front grants what the bucket IAM
policies grant the token's account (``infra/local/gcp_iam.py``).
"""

from __future__ import annotations

import fnmatch
import json
import secrets
import threading
import time
import urllib.parse

from moto.core import DEFAULT_ACCOUNT_ID
from moto.iam.access_control import IAMPolicy, PermissionResult
from moto.iam.models import iam_backends

from infra.records import JOB_LABEL, job_resource_name

_CREDENTIALS = "latest/meta-data/iam/security-credentials"
_TOKEN = "computeMetadata/v1/instance/service-accounts/default/token"


class Identities:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued: dict[str, str] = {}  # access key id -> role name
        self._keys: dict[tuple[str, str], dict] = {}  # (instance, role) -> credentials document
        self._tokens: dict[str, str] = {}  # GCS access token -> the service account it was issued to

    @staticmethod
    def _iam():
        return iam_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def role_of(self, cloud, machine) -> str | None:
        """The AWS role whose credentials this instance's metadata server hands out."""
        if machine.cloud == "aws":
            inst = cloud.aws.find(machine.instance_id)
            assoc = inst.ec2_backend.iam_instance_profile_associations.get(machine.instance_id) if inst else None
            roles = assoc.iam_instance_profile.roles if assoc is not None else []
            return roles[0].name if roles else None
        # A job's GCE instances run as the job's own service account, which the job's role trusts by
        # web identity; the instance names its job's role (by its job label) as a real one names the
        # role ARN in AssumeRoleWithWebIdentity, and the trust must name the instance's account
        # exactly (when all jobs shared one account, the first role trusting it was another job's).
        account, job = self.service_account_of(cloud, machine), self._job_of(cloud, machine)
        if not account or not job:
            return None
        wanted = job_resource_name(job)
        for role in list(self._iam().roles.values()):
            if role.name == wanted and account in _web_identity_audiences(role.assume_role_policy_document):
                return role.name
        return None

    @staticmethod
    def _gce_instance(cloud, machine) -> dict:
        with cloud.gce._lock:
            return dict(cloud.gce.instances.get((machine.zone, machine.instance_id)) or {})

    def service_account_of(self, cloud, machine) -> str | None:
        accounts = list(self._gce_instance(cloud, machine).get("serviceAccounts") or [])
        return accounts[0].get("email") if accounts else None

    def _job_of(self, cloud, machine) -> str | None:
        return (self._gce_instance(cloud, machine).get("labels") or {}).get(JOB_LABEL)

    def _credentials(self, machine, role: str) -> dict:
        with self._lock:
            doc = self._keys.get((machine.instance_id, role))
            if doc is None:
                key = "ASIA" + secrets.token_hex(8).upper()
                doc = {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key,
                       "SecretAccessKey": secrets.token_urlsafe(30), "Token": secrets.token_urlsafe(60),
                       "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 6 * 3600))}
                self._keys[(machine.instance_id, role)] = doc
                self._issued[key] = role
            return doc

    def _token(self, account: str) -> dict:
        token = "ya29.sailor-" + secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = account
        return {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

    def token_account(self, token: str) -> str | None:
        """The service account a GCS bearer token was issued to by a metadata server here; None for
        no token or one never issued (the GCS front refuses both: infra/local/gcp_iam.py)."""
        with self._lock:
            return self._tokens.get(token) if token else None

    def metadata(self, cloud, machine, path: str, method: str) -> tuple[int, str] | None:
        """The answer for identity and credential paths; None for the others (notices: files)."""
        if path == "latest/api/token":
            return (200, secrets.token_urlsafe(32)) if method == "PUT" else (405, "PUT only")
        if path == "latest/meta-data/instance-id" or path == "computeMetadata/v1/instance/name":
            return 200, machine.instance_id
        if path == "latest/meta-data/placement/availability-zone":
            return 200, machine.zone
        if path == "computeMetadata/v1/instance/zone":
            return 200, f"projects/sailor-local/zones/{machine.zone}"
        if path == "computeMetadata/v1/instance/service-accounts/default/email":
            account = self.service_account_of(cloud, machine) if machine.cloud == "gcp" else None
            return (200, account) if account else (404, "no service account")
        if path == _TOKEN:
            account = self.service_account_of(cloud, machine) if machine.cloud == "gcp" else None
            return (200, json.dumps(self._token(account))) if account else (404, "no service account")
        if path.rstrip("/") == _CREDENTIALS or path.startswith(_CREDENTIALS + "/"):
            role = self.role_of(cloud, machine)
            if role is None:
                return 404, "no instance profile"
            asked = path[len(_CREDENTIALS):].strip("/")
            if not asked:
                return 200, role
            if asked != role:
                return 404, "no such role"
            return 200, json.dumps(self._credentials(machine, role))
        return None

    def policies(self, role: str) -> list[dict]:
        """The role's inline policy documents."""
        found = self._iam().roles.get(self._role_id(role))
        return [json.loads(text) if isinstance(text, str) else text for text in (found.policies.values() if found else ())]

    def _role_id(self, name: str) -> str | None:
        return next((rid for rid, r in self._iam().roles.items() if r.name == name), None)

    def s3_refusal(self, cloud, access_key_id: str, method: str, path: str) -> str | None:
        """Why an S3 request signed with issued keys is outside the role's grants; None if allowed
        (or not signed with issued keys: the controller's own requests)."""
        with self._lock:
            role = self._issued.get(access_key_id)
        return None if role is None else self.role_refusal(role, method, path)

    def role_refusal(self, role: str, method: str, path: str) -> str | None:
        """Why the role's policies do not allow this S3 request (``method``, ``/bucket/key?query``);
        None if they do.  Evaluated by moto's IAM policy engine (``s3_allows``)."""
        raw_path, _, query = path.partition("?")
        bucket, _, key = urllib.parse.unquote(raw_path).lstrip("/").partition("/")
        params = urllib.parse.parse_qs(query, keep_blank_values=True)
        if key:
            action = _object_action(method, params)
            ok = s3_allows(self.policies(role), action, f"arn:aws:s3:::{bucket}/{key}")
        elif method == "POST":  # a batch delete names its keys in the body: any delete grant in the bucket
            ok = any(s3_allows([doc], "s3:DeleteObject", f"arn:aws:s3:::{bucket}/{st_key}")
                     for doc in self.policies(role) for st_key in _granted_keys(doc, bucket))
        else:
            ok = s3_allows(self.policies(role), "s3:ListBucket", f"arn:aws:s3:::{bucket}",
                           prefix=params.get("prefix", [""])[0])
        return None if ok else f"role {role} may not {method} s3://{bucket}/{key}"


def _web_identity_audiences(trust) -> set[str]:
    """The GCP accounts a role's trust policy lets assume it by web identity (``accounts.google.com:aud``)."""
    doc = json.loads(trust) if isinstance(trust, str) else (trust or {})
    out: set[str] = set()
    for st in doc.get("Statement", []):
        if st.get("Effect") == "Allow" and "sts:AssumeRoleWithWebIdentity" in str(st.get("Action")):
            aud = st.get("Condition", {}).get("StringEquals", {}).get("accounts.google.com:aud", [])
            out |= {aud} if isinstance(aud, str) else set(aud)
    return out


def _object_action(method: str, params: dict) -> str:
    if method in ("GET", "HEAD"):
        return "s3:GetObject"
    if method == "DELETE":
        return "s3:AbortMultipartUpload" if "uploadId" in params else "s3:DeleteObject"
    return "s3:PutObject"  # PUT, and POST: a multipart upload's start and end


def _granted_keys(doc: dict, bucket: str) -> list[str]:
    """A key each of the document's object grants in ``bucket`` covers (a wildcard taken as empty)."""
    out = []
    for st in doc.get("Statement", []):
        resources = st.get("Resource", [])
        for res in [resources] if isinstance(resources, str) else resources:
            if res.startswith(f"arn:aws:s3:::{bucket}/"):
                out.append(res.split("/", 1)[1].replace("*", ""))
    return out


def s3_allows(policies: list[dict], action: str, resource: str, *, prefix: str | None = None) -> bool:
    """Whether identity policies allow ``action`` on ``resource``, by moto's evaluation (actions,
    resources, wildcards, explicit denies).  moto leaves ``StringLike`` conditions unchecked, so a
    listing's ``s3:prefix`` condition is checked here: ``prefix`` must match one of its patterns."""
    allowed = False
    for doc in policies:
        for st in doc.get("Statement", []):
            one = IAMPolicy(json.dumps({"Version": "2012-10-17", "Statement": [st]}))
            result = one.is_action_permitted(action, resource)
            if result == PermissionResult.DENIED:
                return False
            if result == PermissionResult.PERMITTED and _string_like_holds(st, prefix):
                allowed = True
    return allowed


def _string_like_holds(statement: dict, prefix: str | None) -> bool:
    patterns = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
    if patterns is None:
        return True
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return prefix is not None and any(fnmatch.fnmatchcase(prefix, p) for p in patterns)
