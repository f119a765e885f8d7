"""An embedded instance's inbound rules, read from what the clouds recorded.

EC2: the ingress permissions of the instance's security groups (moto's backend objects): a
CIDR source as it is, a group source as the private addresses of the live instances in that
group in the same VPC (a group reference works only inside its VPC, as on AWS).  GCE: the
fake's firewall rules whose target tags the instance carries (or that have none), with their
source ranges and the network IPs of the instances carrying a source tag.
"""

from __future__ import annotations

from infra.local.aws_server import LIVE
from infra.local.network import Allow

_PROTOCOLS = {"-1": "all", "tcp": "tcp", "6": "tcp", "udp": "udp", "17": "udp", "all": "all"}


def _ports(from_port, to_port) -> tuple[str, ...]:
    if from_port is None or int(from_port) < 0:
        return ()
    lo, hi = int(from_port), int(to_port if to_port is not None else from_port)
    return (str(lo),) if lo == hi else (f"{lo}-{hi}",)


def aws_allows(ec2, inst) -> list[Allow]:
    """``inst``: a moto EC2 instance; ``ec2``: infra.local.aws_server.MotoEC2."""
    out: list[Allow] = []
    for group in inst.security_groups or ():
        for rule in group.ingress_rules:
            protocol = _PROTOCOLS.get(str(rule.ip_protocol).lower())
            if protocol is None:
                continue
            sources: list[str] = []
            if rule.ip_range.get("CidrIp"):
                sources.append(rule.ip_range["CidrIp"])
            source_group = rule.source_group.get("GroupId")
            if source_group:
                sources += [peer.private_ip for peer in inst.ec2_backend.all_instances()
                            if peer.state in LIVE and peer.private_ip
                            and any(g.id == source_group for g in peer.security_groups or ())]
            out.append(Allow(sources=tuple(sources), ports=_ports(rule.from_port, rule.to_port), protocol=protocol))
    return out


def gce_allows(inst: dict, instances: list[dict], firewalls: list[dict]) -> list[Allow]:
    """``inst`` and ``instances``: the GCE fake's instance resources; ``firewalls``: its rules."""
    tags = set((inst.get("tags") or {}).get("items") or ())
    out: list[Allow] = []
    for rule in firewalls:
        if rule.get("direction", "INGRESS") != "INGRESS" or rule.get("disabled"):
            continue
        targets = set(rule.get("targetTags") or ())
        if targets and not targets & tags:
            continue
        source_tags = set(rule.get("sourceTags") or ())
        sources = list(rule.get("sourceRanges") or ())
        sources += [peer["networkInterfaces"][0]["networkIP"] for peer in instances
                    if source_tags & set((peer.get("tags") or {}).get("items") or ())
                    and peer.get("status") in ("PROVISIONING", "STAGING", "RUNNING")]
        for allowed in rule.get("allowed") or ():
            protocol = _PROTOCOLS.get(str(allowed.get("IPProtocol", "")).lower())
            if protocol is not None:
                out.append(Allow(sources=tuple(sources), ports=tuple(allowed.get("ports") or ()), protocol=protocol))
    return out
