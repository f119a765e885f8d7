"""The embedded cloud's network: each instance in its own network namespace, the job's rules enforced.

``netns`` mode (root, with ``ip`` and ``nft``): one namespace per cloud is "the internet", with
a bridge ``pub`` that every instance's public interface (``pub0``) and the host's side of a
veth pair join; each VPC is a bridge of its own there (an AWS region's default VPC, GCP's
global ``default`` network), joined by the instances' private interfaces (``eth0``).  So an
instance reaches a peer's private address only inside its VPC, and anything else only by the
public addresses; the endpoints (moto, the GCE fake, the metadata server) listen on the
host's address on the internet bridge.  Each instance's namespace drops every inbound
connection but those its security groups / firewall rules allow (nftables, from what moto's
EC2 and the GCE fake record), so a missing or wrong rule breaks the rendezvous as on a cloud.
The bridges let each instance send only from its own addresses (no instance passes for another
with the metadata server or a peer's rules).

``host`` mode (not root, or no ``nft``): every instance on 127.0.0.1; the rules are recorded
by the clouds but nothing enforces them.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import random
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from sailor_core import settings
from sailor_core.errors import InputError

log = logging.getLogger("sailor.infra.local")
LOOPBACK = "127.0.0.1"
_RUN_DIR = Path("/run/sailor-netns")  # one file per live cloud: its tag, owner pid and its start (stale ones are swept)
PRIVATE_IFACE, PUBLIC_IFACE = "eth0", "pub0"


@dataclass(frozen=True, slots=True, kw_only=True)
class Addresses:
    vpc: str  # "aws-us-east-1", "gcp-default": instances of one VPC reach each other privately
    private: str
    public: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Allow:
    """Inbound TCP from ``sources`` (addresses or CIDRs) to ``ports`` ("29500", "32768-60999")."""

    sources: tuple[str, ...]
    ports: tuple[str, ...]
    protocol: str = "tcp"  # tcp, udp, or all


def vpc_of(cloud: str, zone: str) -> str:
    """AWS VPCs are regional (its default VPC per region); GCP's default network is global."""
    return f"aws-{zone[:-1] if zone[-1:].isalpha() else zone}" if cloud == "aws" else "gcp-default"


def netns_available() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no {tool} command (scripts/bootstrap installs nftables as root)"
    return None


def choose_mode() -> str:
    mode = settings.embedded_network()
    if mode not in ("auto", "netns", "host"):
        raise InputError(f"{settings.EMBEDDED_NETWORK_ENV}={mode!r}: expected auto, netns or host")
    why = netns_available()
    if mode == "netns" and why:
        raise InputError(f"{settings.EMBEDDED_NETWORK_ENV}=netns but network namespaces are unavailable: {why}")
    if mode == "auto":
        if why:
            log.warning("embedded cloud: instances share 127.0.0.1 and firewall rules are not enforced (%s)", why)
            return "host"
        return "netns"
    return mode


def _run(*args: str, input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), input=input_text, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _start_ticks(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, /proc), "" when unknown: a pid and its
    start time name one process, where a pid alone may have been reused since."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_alive(fields: list[str]) -> bool:
    """Whether the process a ``.cloud`` file names (pid, octet, start ticks) still runs."""
    try:
        pid = int(fields[0])
    except (ValueError, IndexError):
        return False
    if not pid_alive(pid):
        return False
    started = fields[2] if len(fields) > 2 else ""
    return not started or started == _start_ticks(pid)


def _free_tag(taken: set[str], namespaces: list[str]) -> str:
    """A tag for a new cloud's names that no live cloud file and no namespace left behind uses
    (a pid's low bits and a random byte: pids are reused, and a crashed cloud may have left
    namespaces no file names any more)."""
    for _ in range(512):
        tag = f"{os.getpid() % 0xFFFF:04x}{random.randrange(256):02x}"
        if tag not in taken and not any(n == f"sl{tag}i" or n.startswith(f"sl{tag}-") for n in namespaces):
            return tag
    raise RuntimeError("no free name for another embedded cloud's network namespaces on this machine")


class Network:
    """Addresses, namespaces and firewall rules of one embedded cloud's instances; thread-safe."""

    def __init__(self, mode: str | None = None) -> None:
        self.mode = mode or choose_mode()
        self._lock = threading.RLock()
        self._addresses: dict[str, Addresses] = {}
        self._namespaces: dict[str, str] = {}  # instance id -> namespace
        self._rules: dict[str, str] = {}  # instance id -> the nft ruleset applied
        self._ports: dict[str, tuple[tuple[str, str], ...]] = {}  # instance id -> its (bridge port, address)s
        self._vpcs: dict[str, int] = {}
        self._next_host: dict[str, int] = {}
        self._next_public = 0
        self._next_ns = 0
        self.tag = ""
        self.host_address = LOOPBACK
        self._octet = 0

    @property
    def enforced(self) -> bool:
        return self.mode == "netns"

    # ---- life cycle --------------------------------------------------------------

    def start(self) -> Network:
        if self.mode != "netns":
            return self
        _RUN_DIR.mkdir(parents=True, exist_ok=True)
        with open(_RUN_DIR / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # other clouds on this machine choose their ranges too
            self._sweep_stale()
            used = {int(p.read_text().split()[1]) for p in _RUN_DIR.glob("*.cloud") if p.read_text().split()[1:]}
            free = [o for o in range(64, 128) if o not in used]
            if not free:
                raise RuntimeError("no free 100.X.0.0/16 range for another embedded cloud on this machine")
            self._octet = random.choice(free)
            namespaces = [line.split()[0] for line in _run("ip", "netns", "list", check=False).stdout.splitlines()
                          if line.split()]
            self.tag = _free_tag({p.stem for p in _RUN_DIR.glob("*.cloud")}, namespaces)
            (_RUN_DIR / f"{self.tag}.cloud").write_text(
                f"{os.getpid()} {self._octet} {_start_ticks(os.getpid())}\n")
        self.host_address = f"100.{self._octet}.0.1"
        inet, host = self._inet, f"sl{self.tag}h"
        _run("ip", "netns", "add", inet)
        _run("ip", "-n", inet, "link", "set", "lo", "up")
        _run("ip", "-n", inet, "link", "add", "pub", "type", "bridge")
        _run("ip", "-n", inet, "link", "set", "pub", "up")
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", "host", "netns", inet)
        _run("ip", "addr", "add", f"{self.host_address}/16", "dev", host)
        _run("ip", "link", "set", host, "up")
        _run("ip", "-n", inet, "link", "set", "host", "master", "pub", "up")
        return self

    @property
    def _inet(self) -> str:
        return f"sl{self.tag}i"

    def stop(self) -> None:
        if self.mode != "netns" or not self.tag:
            return
        with self._lock:
            for ns in list(self._namespaces.values()):
                _run("ip", "netns", "del", ns, check=False)
            self._namespaces.clear()
        _delete_cloud(self.tag)
        self.tag = ""

    @staticmethod
    def _sweep_stale() -> None:
        """Namespaces of embedded clouds whose process died without stopping them."""
        for path in _RUN_DIR.glob("*.cloud"):
            try:
                fields = path.read_text().split()
            except OSError:
                fields = []
            if not _owner_alive(fields):
                _delete_cloud(path.stem)

    # ---- addresses ------------------------------------------------------------------

    def allocate(self, instance_id: str, cloud: str, zone: str) -> Addresses:
        """The instance's private address in its VPC and its public one (the same every call)."""
        with self._lock:
            if instance_id in self._addresses:
                return self._addresses[instance_id]
            vpc = vpc_of(cloud, zone)
            if self.mode != "netns":
                found = Addresses(vpc=vpc, private=LOOPBACK, public=LOOPBACK)
            else:
                index = self._vpcs.setdefault(vpc, len(self._vpcs) + 1)
                n = self._next_host.get(vpc, 0) + 1
                self._next_host[vpc] = n
                self._next_public += 1
                private = ipaddress.ip_address(f"10.{self._octet}.{index * 16}.0") + n
                public = ipaddress.ip_address(f"100.{self._octet}.1.0") + self._next_public
                found = Addresses(vpc=vpc, private=str(private), public=str(public))
            self._addresses[instance_id] = found
            return found

    def addresses(self, instance_id: str) -> Addresses | None:
        with self._lock:
            return self._addresses.get(instance_id)

    # ---- namespaces -------------------------------------------------------------------

    def attach(self, instance_id: str) -> str | None:
        """Make the instance's namespace with its two interfaces; None in host mode."""
        if self.mode != "netns":
            return None
        with self._lock:
            if instance_id in self._namespaces:
                return self._namespaces[instance_id]
            addr = self._addresses[instance_id]
            self._next_ns += 1
            n = self._next_ns
            ns = f"sl{self.tag}-{n}"
            self._namespaces[instance_id] = ns
            vpc_bridge = f"v{self._vpcs[addr.vpc]}"
        inet = self._inet
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        if _run("ip", "-n", inet, "link", "show", vpc_bridge, check=False).returncode != 0:
            _run("ip", "-n", inet, "link", "add", vpc_bridge, "type", "bridge", check=False)
            _run("ip", "-n", inet, "link", "set", vpc_bridge, "up")
        for iface, peer, bridge, ip, prefix in ((PRIVATE_IFACE, f"e{n}", vpc_bridge, addr.private, 20),
                                                (PUBLIC_IFACE, f"p{n}", "pub", addr.public, 16)):
            _run("ip", "-n", ns, "link", "add", iface, "type", "veth", "peer", "name", peer, "netns", inet)
            _run("ip", "-n", ns, "addr", "add", f"{ip}/{prefix}", "dev", iface)
            _run("ip", "-n", ns, "link", "set", iface, "up")
            _run("ip", "-n", inet, "link", "set", peer, "master", bridge, "up")
        with self._lock:
            self._ports[instance_id] = ((f"p{n}", addr.public), (f"e{n}", addr.private))
        self._guard_addresses()
        self.apply(instance_id, [])  # closed until its rules say otherwise
        return ns

    def detach(self, instance_id: str) -> None:
        with self._lock:
            ns = self._namespaces.pop(instance_id, None)
            self._rules.pop(instance_id, None)
            had_ports = self._ports.pop(instance_id, None) is not None
        if ns:
            _run("ip", "netns", "del", ns, check=False)
        if had_ports:
            self._guard_addresses()

    def _guard_addresses(self) -> None:
        """Each instance's interfaces may send only from its own addresses (as a cloud's hypervisor
        allows): the metadata server and the peers' rules know an instance by its address, so one
        that took another's address would pass for it."""
        with self._lock:
            ports = [p for pairs in self._ports.values() for p in pairs]
            lines = ["table bridge sailor_addresses {", "  chain forward {",
                     "    type filter hook forward priority 0; policy accept;"]
            for port, address in sorted(ports):
                lines += [f'    iifname "{port}" ether type ip ip saddr != {address} drop',
                          f'    iifname "{port}" ether type arp arp saddr ip != {address} drop']
            text = "\n".join([*lines, "  }", "}"]) + "\n"
            _run("ip", "netns", "exec", self._inet, "nft", "-f", "-",
                 input_text="table bridge sailor_addresses {}\ndelete table bridge sailor_addresses\n" + text)

    def admit_to_host(self, ports: list[int]) -> None:
        """The host answers instances on the cloud's endpoints only: a service of this machine that
        listens on every address (0.0.0.0: a Prefect server, a database, rclone) is the user's, not
        the internet's, and a real cloud's instances cannot reach the user's machine."""
        if self.mode != "netns" or not self.tag:
            return
        table, iface = _host_table(self.tag), f"sl{self.tag}h"
        allowed = ", ".join(str(p) for p in sorted(set(ports)))
        text = (f"table inet {table} {{}}\ndelete table inet {table}\n"
                f"table inet {table} {{\n  chain input {{\n"
                "    type filter hook input priority 0; policy accept;\n"
                f'    iifname "{iface}" ct state established,related accept\n'
                f'    iifname "{iface}" tcp dport {{ {allowed} }} accept\n'
                f'    iifname "{iface}" drop\n  }}\n}}\n')
        _run("nft", "-f", "-", input_text=text)

    def wrap(self, instance_id: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the instance's namespace."""
        with self._lock:
            ns = self._namespaces.get(instance_id)
        return ["ip", "netns", "exec", ns, *argv] if ns else argv

    # ---- rules ------------------------------------------------------------------------

    def apply(self, instance_id: str, allows: list[Allow]) -> bool:
        """Replace the instance's inbound rules (atomically); True when they changed."""
        text = ruleset(allows)
        with self._lock:
            ns = self._namespaces.get(instance_id)
            if ns is None or self._rules.get(instance_id) == text:
                return False
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", input_text=text)
        with self._lock:
            if instance_id in self._namespaces:
                self._rules[instance_id] = text
        return True

    def rules_of(self, instance_id: str) -> str | None:
        with self._lock:
            return self._rules.get(instance_id)


def ruleset(allows: list[Allow]) -> str:
    """An nftables ruleset: inbound dropped but for loopback, replies, and ``allows``."""
    lines = ["flush ruleset", "table inet sailor {", "  chain input {",
             "    type filter hook input priority 0; policy drop;",
             '    iif "lo" accept', "    ct state established,related accept"]
    for allow in allows:
        sources = sorted({s for s in allow.sources if s})
        if not sources:
            continue
        src = f"ip saddr {{ {', '.join(sources)} }}"
        if allow.protocol == "all":
            lines.append(f"    {src} accept")
            continue
        ports = sorted(set(allow.ports)) or ["0-65535"]
        lines.append(f"    {src} {allow.protocol} dport {{ {', '.join(ports)} }} accept")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _host_table(tag: str) -> str:
    """The host's nftables table of one cloud: what its instances may reach of this machine."""
    return f"sailor_host_{tag}"


def _delete_cloud(tag: str) -> None:
    out = _run("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"sl{tag}-") or name == f"sl{tag}i":
            _run("ip", "netns", "del", name, check=False)
    _run("ip", "link", "del", f"sl{tag}h", check=False)
    _run("nft", "delete", "table", "inet", _host_table(tag), check=False)
    try:
        (_RUN_DIR / f"{tag}.cloud").unlink()
    except FileNotFoundError:
        pass
