"""The startup script every instance runs, and the boot report it leaves when it fails.

The script is the same on AWS (user-data), GCE (``startup-script`` metadata) and the embedded
cloud: a few lines of shell that run ``infra/instance_boot.py``'s source with the image's
Python (``$SAILOR_PYTHON``, else ``python3``) and a JSON configuration naming the job's URL,
the wheel's key and SHA-256, the source hash it must install to, and the GPUs to expect.  No
credential is in it: the instance reads the bucket with its own instance profile / service
account.  The images it expects are in docs/clouds.md ("What an instance runs").
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from infra.code import CodeBundle
from infra.instance_boot import BOOT_CONFIG_ENV, BOOT_REPORT, BOOT_VERSION
from sailor_core import settings
from sailor_core.catalog.clouds import all_clouds
from sailor_core.storage import open_storage

_BOOT_SOURCE = Path(__file__).with_name("instance_boot.py")
DEFAULT_ENV_CACHE = "/opt/sailor/envs"  # on a real instance: root's, made by cloud-init


_PROBE_KEYS = ("base_url", "headers", "token", "instance_id_path", "zone_path")


def metadata_probes() -> list[dict]:
    """How an instance asks each cloud's metadata server who it is, in the order to ask them."""
    found = [c for c in all_clouds() if c.metadata is not None]
    found.sort(key=lambda c: c.metadata["probe_order"])
    return [{"cloud": c.name, **{k: c.metadata[k] for k in _PROBE_KEYS}} for c in found]


def boot_config(job_url: str, code: CodeBundle, *, cloud: str, num_gpus: int) -> dict:
    """``num_gpus``: the fewest GPUs nvidia-smi must list (one script serves every instance type of a launch)."""
    return {
        "job_url": job_url, "cloud": cloud, "num_gpus": num_gpus,
        "wheel_key": code.wheel_key, "wheel_sha256": code.wheel_sha256, "wheel_name": code.wheel_name,
        "lock_key": code.lock_key, "source_hash": code.source_hash, "version": code.version,
        "env_cache_var": settings.ENV_CACHE_ENV, "env_cache_default": DEFAULT_ENV_CACHE,
        "env_names": {"instance_id": settings.INSTANCE_ID_ENV, "cloud": settings.CLOUD_ENV,
                      "zone": settings.ZONE_ENV},
        "metadata_probes": metadata_probes(),
    }


def startup_script(job_url: str, code: CodeBundle, *, cloud: str, num_gpus: int) -> str:
    """The instance's boot: fetch the wheel from the job's bucket, check, install, start the agent."""
    cfg = boot_config(job_url, code, cloud=cloud, num_gpus=num_gpus)
    lines = [
        "#!/bin/bash",
        f"# Sailor {code.version} ({code.source_hash[:12]}): boot the agent of {job_url}",
        "set -euo pipefail",
        f"export {BOOT_CONFIG_ENV}={shlex.quote(json.dumps(cfg, sort_keys=True))}",
        f'exec "${{{settings.PYTHON_ENV}:-python3}}" - <<\'SAILOR_BOOT_PY\'',
        _BOOT_SOURCE.read_text().rstrip("\n"),
        "SAILOR_BOOT_PY",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class BootReport:
    """An instance's failed boot, as its startup script reported it."""

    instance_id: str
    stage: str  # identity, fetch, install, gpu, version, boot
    error: str
    log_tail: tuple[str, ...]

    def describe(self) -> str:
        tail = " | ".join(self.log_tail[-5:])
        return f"{self.instance_id} failed to boot at {self.stage}: {self.error}" + (f" (log: {tail})" if tail else "")


def read_boot_report(job_url: str, instance_id: str) -> BootReport | None:
    """The instance's boot report, or None while it has none (booting, or booted fine)."""
    try:
        doc = json.loads(open_storage(job_url).get(f"agents/{instance_id}/{BOOT_REPORT}"))
    except FileNotFoundError:
        return None
    except ValueError:
        return BootReport(instance_id=instance_id, stage="boot", error="its boot report is not JSON", log_tail=())
    if doc.get("version") != BOOT_VERSION or doc.get("state") != "failed":
        return None
    return BootReport(instance_id=instance_id, stage=str(doc.get("stage", "boot")), error=str(doc.get("error", "")),
                      log_tail=tuple(str(x) for x in doc.get("log_tail", ()))[-40:])
