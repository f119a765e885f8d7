"""What an instance runs at boot, before Sailor is installed on it (stdlib, plus obstore).

The startup script (``infra.bootstrap.startup_script``) runs this file's source with the
image's Python and a JSON configuration in ``SAILOR_BOOT_CONFIG``.  In order:

1. who am I: the instance id, cloud and zone from the environment (the embedded cloud) or the
   first metadata server that answers (AWS IMDSv2, GCE metadata: how to ask each is in the
   configuration, from ``sailor_core/catalog/data/clouds.json``);
2. fetch ``<job URL>/code/<sha256>.whl`` from the job's bucket with the instance's own
   credentials (its instance profile / service account, through obstore's standard chain)
   and check its SHA-256;
3. an environment for that wheel, ``<env cache>/<sha256>``, made once per wheel: a venv over
   the image's site-packages (the framework: torch and the rest of the lock), dependencies
   the image lacks installed at the locked versions, then the wheel itself, ``--no-deps``;
4. the GPU driver: ``nvidia-smi`` must list the GPUs the instance type has;
5. the installed Sailor must be the controller's (``sailor_core._build.SOURCE_HASH``);
6. exec the agent: ``<env>/bin/python -m sailor_core.runtime.agent --job-url URL``.

A failing step writes ``<job URL>/agents/<instance id>/boot.json`` (``BOOT_REPORT``: the step,
the error and the tail of this log) and exits non-zero; the flow reads it and treats the
instance as failed.  Runs as a program only: importing it does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

BOOT_REPORT = "boot.json"
BOOT_CONFIG_ENV = "SAILOR_BOOT_CONFIG"  # set by the startup script only (not a user setting)
BOOT_VERSION = 1
_LOG: list[str] = []


def log(line: str) -> None:
    text = f"{time.strftime('%H:%M:%S')} sailor-boot: {line}"
    _LOG.append(text)
    print(text, flush=True)


class BootError(Exception):
    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def ask_metadata(url: str, headers: dict[str, str], timeout_s: float = 2.0, method: str = "GET") -> str | None:
    """The metadata server's answer, or None: no such server here, a 404 (no such entry), or too slow."""
    try:
        req = urllib.request.Request(url, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read().decode().strip()
    except (OSError, ValueError):
        return None


def metadata_headers(probe: dict, timeout_s: float = 2.0) -> dict[str, str]:
    """The headers one cloud's metadata server wants (``clouds.json``), with its session token if it
    asks for one (AWS IMDSv2)."""
    headers = dict(probe["headers"])
    token = probe.get("token")
    if token:
        value = ask_metadata(f"{probe['base_url']}/{token['path']}", token["headers"], timeout_s, token["method"])
        if value:
            headers[token["header"]] = value
    return headers


def identity(cfg: dict) -> tuple[str, str, str]:
    """(instance id, cloud, zone): the embedded cloud sets them; on a real cloud, the metadata server
    of each cloud the controller knows (``cfg["metadata_probes"]``, in their order) is asked in turn."""
    env = cfg["env_names"]
    iid, cloud, zone = (os.environ.get(env[k]) for k in ("instance_id", "cloud", "zone"))
    if iid:
        return iid, cloud or cfg.get("cloud", ""), zone or ""
    probes = [p for p in cfg["metadata_probes"] if p["cloud"] == cfg.get("cloud")] or cfg["metadata_probes"]
    for probe in probes:
        headers = metadata_headers(probe)
        iid = ask_metadata(f"{probe['base_url']}/{probe['instance_id_path']}", headers)
        if iid:
            zone = ask_metadata(f"{probe['base_url']}/{probe['zone_path']}", headers) or ""
            return iid, probe["cloud"], zone.rsplit("/", 1)[-1]  # GCE says projects/N/zones/ZONE
    raise BootError("identity", "no instance id: the environment does not say it and no metadata server answers "
                                f"(asked {', '.join(p['cloud'] for p in probes)})")


def _pip(python: str, args: list[str], stage: str) -> None:
    proc = subprocess.run([python, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
                          capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).strip().splitlines()[-20:]:
        log(f"pip: {line}")
    if proc.returncode != 0:
        raise BootError(stage, f"pip {' '.join(args[:2])} failed (exit {proc.returncode})")


def _store(job_url: str):
    try:
        import obstore  # noqa: F401  # lazy: the image may lack it; installed below on first use
    except ImportError:
        log("the image has no obstore: installing it")
        _pip(sys.executable, ["install", "--user", "obstore"], "fetch")
    import obstore  # lazy: as above
    from obstore.store import from_url

    return obstore, from_url(job_url, client_options={"allow_http": True})


def fetch_wheel(cfg: dict, workdir: str) -> str:
    obstore, store = _store(cfg["job_url"])
    start = time.monotonic()
    try:
        data = bytes(obstore.get(store, cfg["wheel_key"]).bytes())
    except Exception as exc:  # noqa: BLE001 - any failure of the bucket is this step's
        raise BootError("fetch", f"cannot read {cfg['job_url']}/{cfg['wheel_key']}: "
                                 f"{str(exc).splitlines()[0][:300]}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != cfg["wheel_sha256"]:
        raise BootError("fetch", f"the wheel's SHA-256 is {digest}, expected {cfg['wheel_sha256']}")
    path = os.path.join(workdir, cfg["wheel_name"])
    with open(path, "wb") as fh:
        fh.write(data)
    log(f"fetched {cfg['wheel_key']} ({len(data)} bytes, sha256 ok) in {time.monotonic() - start:.2f} s")
    return path


def _image_site_dirs() -> list[str]:
    """The image's site-packages as this (the image's) Python sees them: the framework."""
    return [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


def _missing(python: str, lock: list[str]) -> list[str]:
    """Locked requirements the environment does not satisfy (absent or another version)."""
    probe = ("import importlib.metadata as m, json, sys\nout = []\n"
             "for line in json.load(sys.stdin):\n"
             "    name, want = line.split('==')\n"
             "    try:\n        ok = m.version(name) == want\n    except m.PackageNotFoundError:\n        ok = False\n"
             "    out += [] if ok else [line]\nprint(json.dumps(out))\n")
    proc = subprocess.run([python, "-c", probe], input=json.dumps(lock), capture_output=True, text=True)
    if proc.returncode != 0:
        raise BootError("install", f"cannot inspect the environment: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def environment(cfg: dict, wheel: str, lock_text: str) -> str:
    """The Python of the wheel's environment, made once per wheel in the env cache."""
    cache = os.environ.get(cfg["env_cache_var"]) or cfg["env_cache_default"]
    env_dir = os.path.join(cache, cfg["wheel_sha256"])
    python = os.path.join(env_dir, "bin", "python")
    if os.path.exists(os.path.join(env_dir, ".complete")):
        log(f"environment {env_dir} already made for this wheel")
        try:
            os.utime(env_dir)  # in use: a cache that prunes idle environments keeps it
        except OSError:
            pass
        return python
    os.makedirs(cache, exist_ok=True)
    tmp = f"{env_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BootError("install", f"cannot make a venv: {proc.stderr.strip()[-300:]}")
    site = subprocess.run([os.path.join(tmp, "bin", "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "_sailor_image.pth"), "w") as fh:
        fh.write("".join(f"{p}\n" for p in _image_site_dirs()))
    tmp_python = os.path.join(tmp, "bin", "python")
    lock = [line.strip() for line in lock_text.splitlines() if line.strip() and not line.startswith("#")]
    missing = _missing(tmp_python, lock)
    if missing:
        log(f"the image lacks {len(missing)} locked dependencies: installing {', '.join(missing[:8])}"
            + (" ..." if len(missing) > 8 else ""))
        _pip(tmp_python, ["install", "--no-deps", *missing], "install")
    _pip(tmp_python, ["install", "--no-deps", "--no-index", wheel], "install")
    open(os.path.join(tmp, ".complete"), "w").close()
    try:
        os.rename(tmp, env_dir)
    except OSError:  # another instance of the same wheel got there first: use its environment
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.exists(os.path.join(env_dir, ".complete")):
            raise BootError("install", f"{env_dir} exists but is incomplete") from None
    log(f"installed the wheel into {env_dir} in {time.monotonic() - start:.2f} s")
    return python


def check_gpus(cfg: dict) -> None:
    want = int(cfg.get("num_gpus") or 0)
    if want <= 0:
        return
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise BootError("gpu", f"the instance type has {want} GPUs but the image has no nvidia-smi (no driver)")
    proc = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    names = [n for n in proc.stdout.strip().splitlines() if n.strip()]
    if proc.returncode != 0 or len(names) < want:
        raise BootError("gpu", f"nvidia-smi lists {len(names)} GPUs, the instance type has at least {want} "
                               f"(exit {proc.returncode}: {proc.stderr.strip()[-200:]})")
    log(f"nvidia-smi: {len(names)} x {names[0]}")


def check_version(cfg: dict, python: str) -> None:
    proc = subprocess.run([python, "-c", "import sailor_core._build as b, sailor_core; "
                                         "print(b.SOURCE_HASH); print(sailor_core.__file__)"],
                          capture_output=True, text=True)
    lines = proc.stdout.split()
    if proc.returncode != 0 or not lines:
        raise BootError("version", f"the installed Sailor does not import: {proc.stderr.strip()[-300:]}")
    if lines[0] != cfg["source_hash"]:
        raise BootError("version", f"the environment runs Sailor {lines[0][:12]} from {lines[-1]}, "
                                   f"the controller {cfg['source_hash'][:12]}")


def report_failure(cfg: dict, iid: str | None, error: BootError) -> None:
    if not iid:
        return
    doc = {"version": BOOT_VERSION, "instance_id": iid, "state": "failed", "stage": error.stage,
           "error": str(error), "log_tail": _LOG[-40:], "unix_s": time.time()}
    try:
        obstore, store = _store(cfg["job_url"])
        obstore.put(store, f"agents/{iid}/{BOOT_REPORT}", json.dumps(doc).encode())
    except Exception as exc:  # noqa: BLE001 - the console log still has it
        log(f"could not report the failure to the bucket: {exc}")


def main() -> int:
    cfg = json.loads(os.environ[BOOT_CONFIG_ENV])
    iid = None
    try:
        iid, cloud, zone = identity(cfg)
        names = cfg["env_names"]
        os.environ.update({names["instance_id"]: iid, names["cloud"]: cloud, names["zone"]: zone})
        log(f"instance {iid} ({cloud} {zone}) boots Sailor {cfg['version']} ({cfg['source_hash'][:12]})")
        workdir = os.environ.get("TMPDIR") or "/tmp"
        wheel = fetch_wheel(cfg, workdir)
        obstore, store = _store(cfg["job_url"])
        lock_text = bytes(obstore.get(store, cfg["lock_key"]).bytes()).decode()
        python = environment(cfg, wheel, lock_text)
        check_gpus(cfg)
        check_version(cfg, python)
    except BootError as exc:
        log(f"failed at {exc.stage}: {exc}")
        report_failure(cfg, iid, exc)
        return 1
    except Exception as exc:  # noqa: BLE001 - anything unforeseen is a failed boot, reported
        error = BootError("boot", f"{type(exc).__name__}: {exc}")
        log(f"failed: {error}")
        report_failure(cfg, iid, error)
        return 1
    log("starting the agent")
    argv = [python, "-m", "sailor_core.runtime.agent", "--job-url", cfg["job_url"]]
    os.execv(python, argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
