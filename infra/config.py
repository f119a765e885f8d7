"""Which clouds Sailor talks to: the embedded local cloud (default) or real AWS/GCP.

Real clouds are used only when asked (``SAILOR_CLOUDS=real``, or ``aws`` / ``gcp``
for one of them), so a machine that happens to hold credentials never spends money
by surprise. Real credentials come the SDKs' usual ways: boto3's chain (env vars,
``AWS_PROFILE``, ~/.aws, SSO, instance role) and ``google.auth.default()``.
Otherwise a standalone embedded cloud (``sailor cloud up``, found through
``$SAILOR_HOME/cloud.json``) is used, or one is started inside this process.
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
        with urllib.request.urlopen(f"{state['control_url']}/status", timeout=2) as resp:
            resp.read()
        return state
    except (OSError, ValueError, KeyError):
        return None


def in_process_cloud():
    """An embedded cloud inside this process (started once, stopped at exit)."""
    global _in_process
    with _lock:
        if _in_process is None:
            from infra.local.cloud import EmbeddedCloud  # lazy: moto's server, only when the embedded cloud runs here

            _in_process = EmbeddedCloud().start()
            atexit.register(_in_process.stop)
        return _in_process


def embedded_endpoints() -> dict:
    """aws_endpoint, gce_endpoint, control_url and where they come from."""
    state = standalone_state()
    if state is not None:
        return {**state, "source": "standalone"}
    cloud = in_process_cloud()
    return {"aws_endpoint": cloud.aws_endpoint, "gce_endpoint": cloud.gce_endpoint,
            "control_url": f"{cloud.gce_endpoint}/sailor", "network": cloud.network.mode, "source": "in-process"}


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
    return {c: p for c, p in providers_for(ends["aws_endpoint"], ends["gce_endpoint"]).items() if c in wanted}


def describe_mode() -> str:
    real = real_clouds()
    if real:
        return "real clouds: " + ", ".join(real)
    state = standalone_state()
    return "embedded local cloud (" + ("standalone, pid %s" % state["pid"] if state else "in this process") + ")"
