"""Which clouds Sailor talks to: the embedded local cloud (default) or real AWS/GCP.

Real clouds are used only when asked (``SAILOR_CLOUDS=real``, or ``aws`` / ``gcp``
for one of them), so a machine that happens to hold credentials never spends money
by surprise. Real credentials come the SDKs' usual ways: boto3's chain (env vars,
``AWS_PROFILE``, ~/.aws, SSO, instance role) and ``google.auth.default()``.
Otherwise a standalone embedded cloud (``sailor cloud up``, found through
``$SAILOR_HOME/cloud.json``) is used, or one is started inside this process.  Either keeps its
buckets in ``$SAILOR_HOME/cloud/buckets`` (``buckets_dir``), so a later command reaches what an
ended one wrote (``use_embedded_storage``).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import urllib.request
from pathlib import Path

from infra.errors import CloudConfigError
from infra.provider import CloudProvider
from infra.providers import check_clouds, cloud_names, real_provider
from sailor_core import settings

_lock = threading.Lock()
_in_process = None  # EmbeddedCloud started by this process, if any


def real_clouds() -> tuple[str, ...]:
    """Clouds to reach for real; empty means the embedded cloud."""
    value = settings.clouds()
    if value in ("", "embedded", "local"):
        return ()
    if value in ("real", "all"):
        return cloud_names()
    chosen = tuple(c.strip() for c in value.split(",") if c.strip())
    unknown = [c for c in chosen if c not in cloud_names()]
    if unknown:
        raise CloudConfigError(f"{settings.CLOUDS_ENV}={value!r}: expected 'embedded', 'real' "
                               f"or a list of {', '.join(cloud_names())}")
    return chosen


def state_file() -> Path:
    return settings.sailor_home() / "cloud.json"


def standalone_state() -> dict | None:
    """The running standalone embedded cloud's endpoints, or None if there is none."""
    path = state_file()
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
        state["control_secret"] = Path(state["control_secret_file"]).read_text().strip()
        request = urllib.request.Request(f"{state['control_url']}/status", headers=control_headers(state))
        with urllib.request.urlopen(request, timeout=2) as resp:
            resp.read()
        return state
    except (OSError, ValueError, KeyError):
        return None


def control_headers(ends: dict) -> dict[str, str]:
    """What a request to the embedded cloud's control API (``ends["control_url"]``) carries: the
    cloud's secret, which only the controller holds (the Sailor home's 0600 file, or the cloud of
    this process); the API refuses a request without it."""
    secret = ends.get("control_secret")
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {secret}"} if secret else {})}


def buckets_dir() -> Path:
    """The embedded cloud's buckets, on disk: every embedded cloud of this Sailor home serves them."""
    return settings.sailor_home() / "cloud" / "buckets"


def runs_dir() -> Path:
    """Where the embedded clouds of this Sailor home keep their instances, one folder per cloud process."""
    return settings.sailor_home() / "cloud" / "runs"


def in_process_cloud():
    """An embedded cloud inside this process (started once, stopped at exit), over the Sailor
    home's buckets; instances a dead one left running are ended first."""
    global _in_process
    with _lock:
        if _in_process is None:
            from infra.local.cloud import EmbeddedCloud  # lazy: moto's server, only when the embedded cloud runs here
            from infra.local.machines import reap_dead_runs  # lazy: as above

            reap_dead_runs(runs_dir())
            _in_process = EmbeddedCloud(state_dir=runs_dir() / str(os.getpid()), buckets_dir=buckets_dir()).start()
            atexit.register(_in_process.stop)
        return _in_process


_storage_only = None  # DiskBuckets this process serves when no embedded cloud runs


def use_embedded_storage() -> None:
    """Let this process reach the embedded cloud's buckets (``s3://``, ``gs://``) with the standard
    variables, when Sailor is on the embedded cloud and the environment names no endpoint: a
    running cloud's (standalone, else this process's), else the buckets on disk served here."""
    global _storage_only
    if real_clouds() or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        return
    state = standalone_state()
    with _lock:
        if state is not None:
            s3, gcs = state["aws_endpoint"], state.get("gcs_endpoint")  # its S3 front: objects and bucket settings
            keys = tuple(state["aws_keys"]) if "aws_keys" in state else None  # an older cloud takes any keys
        elif _in_process is not None:
            s3, gcs, keys = _in_process.aws_endpoint, _in_process.gcs_endpoint, _in_process.aws_keys
        else:
            if _storage_only is None:
                from infra.local.object_store import DiskBuckets  # lazy: only for the embedded cloud's buckets

                _storage_only = DiskBuckets(buckets_dir()).start()
                atexit.register(_storage_only.stop)
            s3, gcs, keys = _storage_only.endpoint, _storage_only.gcs_endpoint, None
    point_at_embedded_storage(s3, gcs, keys)


def point_at_embedded_storage(s3_endpoint: str, gcs_endpoint: str | None, aws_keys: tuple[str, str] | None) -> None:
    """This process reaches the embedded S3 with the embedded account's administrator keys
    (``aws_keys``: a running cloud's; None: the buckets served on the loopback address, which
    check no keys) and GCS (no token: the controller's) through the variables obstore and boto3 read."""
    os.environ["AWS_ENDPOINT_URL_S3"] = s3_endpoint
    if aws_keys is not None:  # this embedded account's, whatever keys the environment held
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = aws_keys
        os.environ.pop("AWS_SESSION_TOKEN", None)
    else:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    if gcs_endpoint and not os.environ.get("GOOGLE_BASE_URL"):
        key = settings.sailor_home() / "cloud" / "gcs-no-oauth.json"  # an emulator's "key": no token at all
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text(json.dumps({"gcs_base_url": gcs_endpoint, "disable_oauth": True, "client_email": "",
                                   "private_key": "", "private_key_id": ""}))
        os.environ["GOOGLE_BASE_URL"] = gcs_endpoint
        os.environ["GOOGLE_SERVICE_ACCOUNT"] = str(key)


def embedded_endpoints() -> dict:
    """aws_endpoint, gce_endpoint, control_url (with control_secret) and where they come from."""
    state = standalone_state()
    if state is not None:
        if "aws_keys" not in state:  # started by a Sailor whose embedded AWS took any keys
            raise CloudConfigError(f"the standalone embedded cloud (pid {state['pid']}) is of an older Sailor and has no "
                                   "administrator keys: restart it (sailor cloud down; sailor cloud up)")
        return {**state, "source": "standalone"}
    cloud = in_process_cloud()
    return {"aws_endpoint": cloud.aws_endpoint, "gce_endpoint": cloud.gce_endpoint, "gcs_endpoint": cloud.gcs_endpoint,
            "control_url": f"{cloud.gce_endpoint}/sailor", "control_secret": cloud.control_secret,
            "aws_keys": list(cloud.aws_keys),
            "network": cloud.network.mode, "source": "in-process"}


def running_embedded_endpoints() -> dict | None:
    """``embedded_endpoints()`` of an embedded cloud already running (standalone, or started in
    this process), without starting one; None when none runs."""
    state = standalone_state()
    if state is not None:
        return {**state, "source": "standalone"}
    return embedded_endpoints() if _in_process is not None else None


def get_providers(clouds: tuple[str, ...] | list[str] | None = None) -> dict[str, CloudProvider]:
    """One provider per cloud asked for (default: all), real or embedded per ``SAILOR_CLOUDS``."""
    wanted = tuple(clouds) if clouds else cloud_names()
    check_clouds(wanted)
    real = real_clouds()
    if real:
        return {cloud: real_provider(cloud) for cloud in wanted if cloud in real}
    from infra.local.cloud import providers_for  # lazy: moto's server, only for the embedded cloud

    ends = embedded_endpoints()
    providers = providers_for(ends["aws_endpoint"], ends["gce_endpoint"], aws_keys=tuple(ends["aws_keys"]))
    return {c: p for c, p in providers.items() if c in wanted}


def describe_mode() -> str:
    real = real_clouds()
    if real:
        return "real clouds: " + ", ".join(real)
    state = standalone_state()
    return "embedded local cloud (" + ("standalone, pid %s" % state["pid"] if state else "in this process") + ")"
