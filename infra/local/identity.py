"""What an embedded instance's metadata server says about who it is, and its role's credentials.

AWS instances (IMDSv2's tokens: ``metadata_door.py``): ``latest/meta-data/instance-id``,
``placement/availability-zone`` and ``iam/security-credentials/<role>``: temporary keys of the
role in the instance profile attached at launch (recorded by moto's EC2 and IAM).  GCE
instances: ``computeMetadata/v1/instance/{name,zone,service-accounts/default/email}``; for
a job whose bucket is on S3 they get the keys of the AWS role whose trust policy names their
service account (the embedded stand-in for AWS web-identity federation of a GCP service
account, docs/clouds.md).  An instance without a profile or account gets no credentials.

The keys are a session of the role assumed through moto's STS (``aws_auth.instance_credentials``),
so the embedded AWS endpoint knows them and authorises what they sign by the role's policies, as
AWS does (``infra/local/aws_auth.py``). GCS tokens the metadata server issued are recorded
(``token_account``): the GCS front grants what the bucket IAM policies grant the token's account
(``infra/local/gcp_iam.py``).
"""

from __future__ import annotations

import json
import secrets
import threading

from moto.core import DEFAULT_ACCOUNT_ID
from moto.iam.models import iam_backends

from infra.local.aws_auth import instance_credentials
from infra.records import JOB_LABEL, job_resource_name

_CREDENTIALS = "latest/meta-data/iam/security-credentials"
_TOKEN = "computeMetadata/v1/instance/service-accounts/default/token"


class Identities:
    def __init__(self) -> None:
        self._lock = threading.Lock()
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

    def _credentials(self, machine, role: str) -> dict | None:
        with self._lock:
            doc = self._keys.get((machine.instance_id, role))
            if doc is None:
                doc = instance_credentials(role, machine.instance_id)
                if doc is not None:
                    self._keys[(machine.instance_id, role)] = doc
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
            keys = self._credentials(machine, role)
            return (200, json.dumps(keys)) if keys is not None else (404, "no such role")
        return None


def _web_identity_audiences(trust) -> set[str]:
    """The GCP accounts a role's trust policy lets assume it by web identity (``accounts.google.com:aud``)."""
    doc = json.loads(trust) if isinstance(trust, str) else (trust or {})
    out: set[str] = set()
    for st in doc.get("Statement", []):
        if st.get("Effect") == "Allow" and "sts:AssumeRoleWithWebIdentity" in str(st.get("Action")):
            aud = st.get("Condition", {}).get("StringEquals", {}).get("accounts.google.com:aud", [])
            out |= {aud} if isinstance(aud, str) else set(aud)
    return out
