"""Who calls the embedded AWS, and may they: moto's IAM access control, applied to every request.

Every request to the embedded AWS endpoint (EC2, IAM, STS, Service Quotas and S3) must be signed
(SigV4) with keys the embedded account knows: an IAM user's access key, or the session keys of a
role assumed through STS (the instances' credentials, ``instance_credentials``).  The signature
is verified, and the action authorised against the caller's policies, by moto's own classes
(``moto.iam.access_control``: ``IAMRequest`` / ``S3IAMRequest``, ``check_signature``,
``check_action_permitted``, ``IAMPolicyStatement``), the ones moto's documented "IAM-like access
control" mode runs.  That mode itself is one process-wide switch
(``settings.INITIAL_NO_AUTH_ACTION_COUNT``) which would also bind every other moto server of
the process (the tests' own), and S3 objects never reach moto's S3 (rclone serves them from
disk), so the endpoint calls the same classes for its own requests only.

- EC2, IAM, STS, Service Quotas: ``check_action_permitted("*")``, as moto's server does for them.
- S3: each action the request implies, as AWS evaluates them: ``CopyObject``/``UploadPartCopy``
  also read their source, ``DeleteObjects`` deletes each key its body names, a listing lists its
  prefix.  moto leaves ``StringLike`` conditions unchecked (it knows ``StringEquals`` only); a
  listing's ``s3:prefix`` condition is checked here, and a statement whose condition fails does
  not apply (moto would turn it into a deny).

The controller's own credentials are an administrator user's (``controller_keys``), made when
the cloud starts; nothing else may do what the instances' roles do not grant.
"""

from __future__ import annotations

import fnmatch
import json
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET

from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.exceptions import ServiceException
from moto.iam.access_control import IAMPolicy, IAMPolicyStatement, IAMRequest, PermissionResult, S3IAMRequest
from moto.iam.exceptions import NoSuchEntity
from moto.iam.models import iam_backends
from moto.sts.models import sts_backends
from werkzeug.datastructures import EnvironHeaders
from werkzeug.exceptions import HTTPException

CONTROLLER_USER = "sailor-controller"
_ADMIN_POLICY = json.dumps({"Version": "2012-10-17",
                            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
_SESSION_S = 6 * 3600

# S3's bucket sub-resources and the IAM actions of reading, writing and deleting each (AWS's
# names: the API's DeletePublicAccessBlock is authorised as s3:PutBucketPublicAccessBlock).
_BUCKET_SETTINGS = {
    "publicAccessBlock": ("GetBucketPublicAccessBlock", "PutBucketPublicAccessBlock", "PutBucketPublicAccessBlock"),
    "encryption": ("GetEncryptionConfiguration", "PutEncryptionConfiguration", "PutEncryptionConfiguration"),
    "ownershipControls": ("GetBucketOwnershipControls", "PutBucketOwnershipControls", "PutBucketOwnershipControls"),
    "policy": ("GetBucketPolicy", "PutBucketPolicy", "DeleteBucketPolicy"),
    "policyStatus": ("GetBucketPolicyStatus", "GetBucketPolicyStatus", "GetBucketPolicyStatus"),
    "acl": ("GetBucketAcl", "PutBucketAcl", "PutBucketAcl"),
    "versioning": ("GetBucketVersioning", "PutBucketVersioning", "PutBucketVersioning"),
    "tagging": ("GetBucketTagging", "PutBucketTagging", "PutBucketTagging"),
    "cors": ("GetBucketCORS", "PutBucketCORS", "PutBucketCORS"),
    "lifecycle": ("GetLifecycleConfiguration", "PutLifecycleConfiguration", "PutLifecycleConfiguration"),
    "location": ("GetBucketLocation", "GetBucketLocation", "GetBucketLocation"),
    "logging": ("GetBucketLogging", "PutBucketLogging", "PutBucketLogging"),
    "website": ("GetBucketWebsite", "PutBucketWebsite", "DeleteBucketWebsite"),
    "notification": ("GetBucketNotification", "PutBucketNotification", "PutBucketNotification"),
    "replication": ("GetReplicationConfiguration", "PutReplicationConfiguration", "PutReplicationConfiguration"),
    "object-lock": ("GetBucketObjectLockConfiguration", "PutBucketObjectLockConfiguration",
                    "PutBucketObjectLockConfiguration"),
    "accelerate": ("GetAccelerateConfiguration", "PutAccelerateConfiguration", "PutAccelerateConfiguration"),
    "requestPayment": ("GetBucketRequestPayment", "PutBucketRequestPayment", "PutBucketRequestPayment"),
}


def _iam():
    return iam_backends[DEFAULT_ACCOUNT_ID]["aws"]


def controller_keys() -> tuple[str, str]:
    """The embedded account's administrator (the user's own credentials on a real cloud): its access
    key id and secret, made once per process (moto's IAM is the process's)."""
    iam = _iam()
    try:
        user = iam.get_user(CONTROLLER_USER)
    except NoSuchEntity:
        user = iam.create_user("us-east-1", CONTROLLER_USER)
        iam.put_user_policy(CONTROLLER_USER, "administrator", _ADMIN_POLICY)
    key = user.access_keys[0] if user.access_keys else iam.create_access_key(CONTROLLER_USER)
    return key.access_key_id, key.secret_access_key


def instance_credentials(role_name: str, session_name: str) -> dict | None:
    """An instance's temporary keys for its role, as IMDS hands them out: a session of the role
    assumed through moto's STS, so the keys are the account's (and checked as such)."""
    try:
        role = _iam().get_role(role_name)
    except NoSuchEntity:
        return None
    session = sts_backends[DEFAULT_ACCOUNT_ID]["aws"].assume_role(
        region_name="us-east-1", role_session_name=session_name, role_arn=role.arn, policy=None,
        duration=_SESSION_S, external_id=None)
    return {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": session.access_key_id,
            "SecretAccessKey": session.secret_access_key, "Token": session.session_token,
            "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "Expiration": session.expiration.strftime("%Y-%m-%dT%H:%M:%SZ")}


# ---- the control plane: EC2, IAM, STS, Service Quotas --------------------------------------


def query_refusal(environ, body: bytes, action: str) -> tuple[int, bytes] | None:
    """Why an API call (``action``, e.g. ``RunInstances``) is refused, as AWS answers it; None if
    its signature holds and the caller's policies allow it."""
    headers = EnvironHeaders(environ)
    if "Authorization" not in headers:
        return _error(403, "MissingAuthenticationToken", "Request is missing Authentication Token")
    data = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    try:
        request = IAMRequest(account_id=DEFAULT_ACCOUNT_ID, method=environ.get("REQUEST_METHOD", "POST"),
                             path=_raw_target(environ), data=data, body=body, headers=headers, action=action)
        request.check_signature()
        request.check_action_permitted("*")
    except (HTTPException, ServiceException, NoSuchEntity) as exc:
        return _error(*_described(exc))
    return None


# ---- object storage ------------------------------------------------------------------------


class _S3Request(S3IAMRequest):
    """moto's S3 request check, asked for each action the request implies (not only the one moto's
    own S3 would name), with a listing's ``s3:prefix`` in the evaluation."""

    def permits(self, action: str, resource: str, prefix: str | None) -> bool:
        # IAMPolicy reads inline and managed policies alike (a document, a dict, a Policy's version)
        documents = [IAMPolicy(policy)._policy_json for policy in self._access_key.collect_policies()]
        return s3_allows(documents, action, resource, prefix=prefix)


def s3_refusal(environ, body: bytes) -> tuple[int, bytes] | None:
    """Why an S3 request is refused (unsigned, unknown keys, a bad signature, or an action the
    caller's policies do not allow), as S3 answers it; None if it may go on."""
    headers = EnvironHeaders(environ)
    if "Authorization" not in headers:
        return _s3_error(403, "AccessDenied", "Anonymous requests are not allowed (the request is not signed)")
    actions = s3_actions(environ, body)
    try:
        request = _S3Request(account_id=DEFAULT_ACCOUNT_ID, method=environ.get("REQUEST_METHOD", "GET"),
                             path=_raw_target(environ), data={}, body=body, headers=headers,
                             action=actions[0][0].removeprefix("s3:"))
        request.check_signature()
        for action, resource, prefix in actions:
            if not request.permits(action, resource, prefix):
                return _s3_error(403, "AccessDenied", f"{request._access_key.arn} is not authorized to "
                                                      f"perform: {action} on resource: {resource}")
    except (HTTPException, ServiceException, NoSuchEntity) as exc:
        return _s3_error(*_described(exc))
    return None


def s3_actions(environ, body: bytes) -> list[tuple[str, str, str | None]]:
    """(IAM action, resource ARN, listing prefix) for each thing the S3 request does, first the
    one it is named by."""
    method = environ.get("REQUEST_METHOD", "GET")
    bucket, _, key = urllib.parse.unquote(environ.get("PATH_INFO", "/")).lstrip("/").partition("/")
    params = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if not bucket:
        return [("s3:ListAllMyBuckets", "*", None)]
    if key:
        return _object_actions(method, bucket, key, params, EnvironHeaders(environ))
    setting = next((name for name in _BUCKET_SETTINGS if name in params), None)
    if setting is not None:
        get, put, delete = _BUCKET_SETTINGS[setting]
        name = {"GET": get, "HEAD": get, "DELETE": delete}.get(method, put)
        return [(f"s3:{name}", f"arn:aws:s3:::{bucket}", None)]
    if method == "POST" and "delete" in params:
        return [("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{name}", None) for name in _deleted_keys(body)] or [
            ("s3:DeleteObject", f"arn:aws:s3:::{bucket}/*", None)]
    if method in ("GET", "HEAD"):
        listing = "s3:ListBucketVersions" if "versions" in params else (
            "s3:ListBucketMultipartUploads" if "uploads" in params else "s3:ListBucket")
        prefix = params["prefix"][0] if "prefix" in params else None  # absent: a prefix condition fails, as on AWS
        return [(listing, f"arn:aws:s3:::{bucket}", prefix)]
    return [("s3:CreateBucket" if method == "PUT" else "s3:DeleteBucket", f"arn:aws:s3:::{bucket}", None)]


def _object_actions(method: str, bucket: str, key: str, params: dict, headers) -> list[tuple[str, str, str | None]]:
    arn = f"arn:aws:s3:::{bucket}/{key}"
    if method in ("GET", "HEAD"):
        name = ("s3:ListMultipartUploadParts" if "uploadId" in params else "s3:GetObjectAcl" if "acl" in params
                else "s3:GetObjectTagging" if "tagging" in params else "s3:GetObject")
        return [(name, arn, None)]
    if method == "DELETE":
        return [("s3:AbortMultipartUpload" if "uploadId" in params else "s3:DeleteObject", arn, None)]
    if method == "POST" and not ("uploads" in params or "uploadId" in params):
        return [("s3:RestoreObject" if "restore" in params else "s3:GetObject", arn, None)]
    name = "s3:PutObjectAcl" if "acl" in params else "s3:PutObjectTagging" if "tagging" in params else "s3:PutObject"
    out = [(name, arn, None)]
    source = headers.get("x-amz-copy-source")
    if source:  # CopyObject and UploadPartCopy read their source: a grant to write is not one to read
        source_path = urllib.parse.unquote(source.split("?", 1)[0]).lstrip("/")
        out.append(("s3:GetObject", f"arn:aws:s3:::{source_path}", None))
    return out


def _deleted_keys(body: bytes) -> list[str]:
    """The keys a DeleteObjects request names (its XML body; any namespace)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []
    return [el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "Key"]


def _prefix_condition_holds(statement: dict, prefix: str | None) -> bool:
    """A statement's ``StringLike``/``StringEquals`` on ``s3:prefix`` (AWS: a key the request does
    not carry fails the condition); statements without one hold."""
    for operator, match in (("StringLike", fnmatch.fnmatchcase), ("StringEquals", str.__eq__)):
        patterns = statement.get("Condition", {}).get(operator, {}).get("s3:prefix")
        if patterns is None:
            continue
        patterns = [patterns] if isinstance(patterns, str) else patterns
        if prefix is None or not any(match(prefix, p) for p in patterns):
            return False
    return True


def s3_allows(policies: list[dict], action: str, resource: str, *, prefix: str | None = None) -> bool:
    """Whether identity policy documents allow ``action`` on ``resource`` (a listing of ``prefix``),
    evaluated as the embedded S3 evaluates a caller's policies (for tests of a policy alone)."""
    allowed = False
    for doc in policies:
        statements = doc["Statement"]
        for statement in [statements] if isinstance(statements, dict) else statements:
            if not _prefix_condition_holds(statement, prefix):
                continue
            unconditioned = {k: v for k, v in statement.items() if k != "Condition"}
            result = IAMPolicyStatement(unconditioned).is_action_permitted(action, resource)
            if result == PermissionResult.DENIED:
                return False
            allowed = allowed or result == PermissionResult.PERMITTED
    return allowed


# ---- answers --------------------------------------------------------------------------------


def _raw_target(environ) -> str:
    """The path and query as the client sent and signed them (keys keep their own escapes)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return raw
    query = environ.get("QUERY_STRING", "")
    return urllib.parse.quote(environ.get("PATH_INFO", "/")) + (f"?{query}" if query else "")


def _described(exc: Exception) -> tuple[int, str, str]:
    if isinstance(exc, NoSuchEntity):  # the caller's role was deleted after its keys were issued
        return 403, "AccessDenied", "the credentials' role no longer exists"
    status = exc.code if isinstance(exc, HTTPException) else 403
    return status, getattr(exc, "error_type", None) or str(exc.code), exc.message


def _error(status: int, code: str, message: str) -> tuple[int, bytes]:
    return status, (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
                    f"<Message>{_xml(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID>"
                    "</Response>").encode()


def _s3_error(status: int, code: str, message: str) -> tuple[int, bytes]:
    return status, (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>{_xml(message)}</Message><RequestId>{uuid.uuid4()}</RequestId></Error>").encode()


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
