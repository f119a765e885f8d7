"""The embedded GCP's IAM: service accounts, buckets' IAM policies, and their evaluation at the GCS front.

What ``infra.gcp_identity`` calls on real GCP, answered here (on the GCE fake's endpoint):

- IAM's ``projects/P/serviceAccounts`` (create, get, delete): the accounts a job's instances run as;
  an instance launched with an account that does not exist is refused, as GCE refuses it.
- Cloud Storage's JSON ``b/BUCKET/iam`` (get, set with etag; policy version 3 for conditions).

The GCS front (``infra/local/object_store.py``) asks ``refusal`` about each request of an instance:
the bearer token's account must hold, in the bucket's policy, a binding whose role grants the
request's permission and whose IAM Condition holds.  There is no well-kept open-source evaluator
of GCP IAM, so this one is minimal and driven by the data the provider writes (docs/clouds.md):
conditions are CEL, evaluated by cel-python with the attributes GCS gives them (``resource.type``,
``resource.name`` as ``projects/_/buckets/B[/objects/KEY]``, and for a listing the API attribute
``storage.googleapis.com/objectListPrefix``); roles are the object roles' documented
permissions (``ROLES``); members match exactly.  No deny policies, no project-level grants, no
custom roles: what is not granted by a bucket binding is refused.
"""

from __future__ import annotations

import copy
import functools
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable

OBJECT, BUCKET = "storage.googleapis.com/Object", "storage.googleapis.com/Bucket"
LIST_PREFIX = "storage.googleapis.com/objectListPrefix"
_VIEW = {"storage.objects.get", "storage.objects.list"}
_USE = _VIEW | {"storage.objects.create", "storage.objects.delete", "storage.objects.update",
                "storage.multipartUploads.create", "storage.multipartUploads.abort",
                "storage.multipartUploads.listParts", "storage.multipartUploads.list"}
# The predefined object roles' permissions (cloud.google.com/storage/docs/access-control/iam-roles).
ROLES: dict[str, frozenset[str]] = {
    "roles/storage.objectViewer": frozenset(_VIEW),
    "roles/storage.objectCreator": frozenset({"storage.objects.create", "storage.multipartUploads.create",
                                              "storage.multipartUploads.abort", "storage.multipartUploads.listParts"}),
    "roles/storage.objectUser": frozenset(_USE),
    "roles/storage.objectAdmin": frozenset(_USE | {"storage.objects.getIamPolicy", "storage.objects.setIamPolicy"}),
}
_ACCOUNT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ACCOUNTS = re.compile(r"^/v1/projects/(?P<project>[^/]+)/serviceAccounts(?:/(?P<email>[^/]+))?$")
_BUCKET_IAM = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)/iam$")


class GcpIam:
    def __init__(self, *, project: str, bucket_exists: Callable[[str], bool]) -> None:
        self.project = project
        self.bucket_exists = bucket_exists
        self._lock = threading.Lock()
        self._accounts: dict[str, dict] = {}  # email -> the account resource
        self._policies: dict[str, dict] = {}  # bucket -> its IAM policy

    def reset(self, *, keep: tuple[str, ...] = ()) -> None:
        with self._lock:
            self._accounts = {e: a for e, a in self._accounts.items() if e in keep}
            self._policies.clear()

    def add_account(self, account_id: str, *, description: str = "") -> dict:
        email = f"{account_id}@{self.project}.iam.gserviceaccount.com"
        account = {"name": f"projects/{self.project}/serviceAccounts/{email}", "projectId": self.project,
                   "uniqueId": str(secrets.randbelow(10**20)), "email": email, "description": description,
                   "displayName": account_id}
        with self._lock:
            if email in self._accounts:
                raise KeyError(email)
            self._accounts[email] = account
        return dict(account)

    def has_account(self, email: str) -> bool:
        with self._lock:
            return email in self._accounts

    # ---- the REST APIs ------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Callable[[], dict]) -> tuple[int, dict]:
        """IAM's service accounts and a bucket's IAM policy, as the real APIs answer them."""
        path = urllib.parse.unquote(path)
        if m := _ACCOUNTS.match(path):
            if m["project"] not in (self.project, "-"):
                return _error(404, "NOT_FOUND", f"project {m['project']} not found")
            return self._accounts_api(method, m["email"], body)
        if m := _BUCKET_IAM.match(path):
            if not self.bucket_exists(m["bucket"]):
                return _error(404, "notFound", "The specified bucket does not exist.")
            return self._policy_api(method, m["bucket"], body)
        return _error(404, "NOT_FOUND", f"no such path {path}")

    def _accounts_api(self, method: str, email: str | None, body) -> tuple[int, dict]:
        if email is None and method == "POST":
            asked = body()
            account_id = str(asked.get("accountId", ""))
            if not _ACCOUNT_ID.match(account_id):
                return _error(400, "INVALID_ARGUMENT", f"accountId {account_id!r} must match {_ACCOUNT_ID.pattern}")
            try:
                return 200, self.add_account(account_id, description=(asked.get("serviceAccount") or {}).get(
                    "description", ""))
            except KeyError:
                return _error(409, "ALREADY_EXISTS", f"Service account {account_id} already exists")
        if email is None and method == "GET":
            with self._lock:
                return 200, {"accounts": [dict(a) for a in self._accounts.values()]}
        with self._lock:
            found = self._accounts.get(email or "")
            if found is not None and method == "DELETE":
                del self._accounts[email]
                return 200, {}
        if found is None or method != "GET":
            return _error(404, "NOT_FOUND", f"Unknown service account {email}")
        return 200, dict(found)

    def _policy_api(self, method: str, bucket: str, body) -> tuple[int, dict]:
        with self._lock:
            current = copy.deepcopy(self._policies.get(bucket) or {
                "kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}", "version": 1,
                "bindings": [], "etag": "CAE="})
            if method == "GET":
                return 200, current
            if method != "PUT":
                return _error(405, "methodNotAllowed", f"{method} on a bucket's IAM policy")
            wanted = body()
            if wanted.get("etag") and wanted["etag"] != current["etag"]:
                return _error(412, "conditionNotMet", "the policy changed since it was read (etag)")
            why = _invalid_policy(wanted)
            if why:
                return _error(400, "invalid", why)
            stored = {"kind": "storage#policy", "resourceId": current["resourceId"],
                      "version": int(wanted.get("version") or 1), "bindings": wanted.get("bindings") or [],
                      "etag": secrets.token_urlsafe(6)}
            self._policies[bucket] = stored
            return 200, copy.deepcopy(stored)

    # ---- evaluation at the GCS front ------------------------------------------------------

    def allows(self, member: str, permission: str, *, bucket: str, key: str | None = None,
               list_prefix: str = "") -> bool:
        """Whether the bucket's policy grants ``member`` the ``permission`` on the bucket (``key``
        None: a listing, of ``list_prefix``) or on its object ``key``."""
        with self._lock:
            bindings = copy.deepcopy((self._policies.get(bucket) or {}).get("bindings") or [])
        name = f"projects/_/buckets/{bucket}" + (f"/objects/{key}" if key is not None else "")
        attributes = {"resource": {"type": OBJECT if key is not None else BUCKET, "name": name,
                                   "service": "storage.googleapis.com"},
                      "api": {LIST_PREFIX: list_prefix} if key is None else {}}
        for binding in bindings:
            if member not in binding.get("members", ()) or permission not in ROLES.get(binding.get("role"), ()):
                continue
            condition = binding.get("condition")
            if condition is None or _holds(condition["expression"], attributes):
                return True
        return False

    def refusal(self, account: str | None, method: str, path: str, copy_source: str = "") -> str | None:
        """Why a GCS XML API request (``method``, ``/bucket[/key][?query]``) of the holder of a token
        issued to ``account`` (None: no or an unknown token) is refused; None when it is allowed."""
        raw, _, query = path.partition("?")
        bucket, _, key = urllib.parse.unquote(raw).lstrip("/").partition("/")
        where = f"gs://{bucket}/{key}"
        if account is None:
            return f"anonymous or unknown token may not {method} {where}"
        member = f"serviceAccount:{account}"
        for permission, b, k, prefix in _permissions(method, bucket, key, query, copy_source):
            if not self.allows(member, permission, bucket=b, key=k, list_prefix=prefix):
                return f"{account} lacks {permission} on gs://{b}/{k if k is not None else prefix}"
        return None


def _permissions(method: str, bucket: str, key: str, query: str, copy_source: str) -> list[tuple]:
    """What one XML API request needs: (permission, bucket, key or None for the bucket, list prefix)."""
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    if not key:
        if method == "GET" and not ({"uploads", "location", "versioning", "acl"} & set(params)):
            return [("storage.objects.list", bucket, None, params.get("prefix", [""])[0])]
        return [(f"storage.buckets.{'create' if method == 'PUT' else 'update'}", bucket, None, "")]
    if method in ("GET", "HEAD"):
        return [("storage.objects.get", bucket, key, "")]
    if method == "DELETE":
        return [("storage.multipartUploads.abort" if "uploadId" in params else "storage.objects.delete", bucket, key, "")]
    needed = [("storage.objects.create", bucket, key, "")]
    if copy_source:  # a copy reads its source: as a GET of it would
        src_bucket, _, src_key = urllib.parse.unquote(copy_source.split("?")[0]).lstrip("/").partition("/")
        needed.append(("storage.objects.get", src_bucket, src_key, ""))
    return needed


def _cel():
    import celpy  # lazy: cel-python (~0.3 s to import, ~0.5 s for its parser), only once a binding has a condition

    return celpy


@functools.lru_cache(maxsize=256)
def _program(expression: str):
    env = _cel().Environment()
    return env.program(env.compile(expression), functions={"getAttribute": _get_attribute})


def _get_attribute(api, name, default):
    return api.get(_cel().celtypes.StringType(str(name)), default)


def _holds(expression: str, attributes: dict) -> bool:
    """An IAM Condition: true only when it evaluates to true (an error denies, as IAM's does)."""
    celpy = _cel()
    try:
        activation = {k: celpy.json_to_cel(v) for k, v in attributes.items()}
        result = _program(expression).evaluate(activation)
    except Exception:  # noqa: BLE001 - any evaluation error: the binding does not apply
        return False
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def _invalid_policy(policy: dict) -> str | None:
    for binding in policy.get("bindings") or []:
        if binding.get("role") not in ROLES:
            return f"role {binding.get('role')!r} is not an object role this embedded GCS knows ({', '.join(ROLES)})"
        condition = binding.get("condition")
        if condition is None:
            continue
        if int(policy.get("version") or 1) < 3:
            return "a binding with a condition needs policy version 3"
        try:
            _program(condition["expression"])
        except Exception as exc:  # noqa: BLE001 - CEL's parse errors, of several types
            return f"condition {condition.get('title', '')!r} does not parse: {exc}"
    return None


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status,
                            "errors": [{"domain": "global", "reason": status, "message": message}]}}
