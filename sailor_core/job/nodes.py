"""From a plan to instances and back: which nodes to rent, which ranks each runs.

Pure functions the train-job flow uses between the planner and the clouds:

- ``availability_from_offers``: what the planner may use, from the offers the
  clouds list now (GPUs per type and zone, capped per job).
- ``nodes_for_plan``: the instances a plan needs.  Each replica is ``tp``
  GPUs of one node; replicas of the same GPU type and zone are packed into
  nodes of the cheapest fitting instance type, first fit, so a plan of eight
  TP=1 replicas rents one 8-GPU node where that is cheaper per GPU.  Each node
  is then rented as the cheapest shape that holds its GPUs (a node of 2 GPUs
  on a 2-GPU shape, not on the 4-GPU shape the packing used), and says why.
  A node holds replicas of one market: a mixed plan's on-demand replicas
  (``Replica.market``) get nodes of their own, rented and priced on demand.
- ``match_instances``: which of the nodes are served by instances still
  running from the previous attempt (a re-plan keeps the survivors instead of
  paying to start new ones; a spot instance never serves an on-demand node, nor
  the other way round), which must be launched, which are surplus.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sailor_core.catalog.instances import Offer
from sailor_core.errors import InfeasibleError
from sailor_core.plan.types import Plan
from sailor_core.plan.layout import replica_ranks


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRequest:
    """One instance a plan needs, and the ranks its agent runs."""

    cloud: str
    zone: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    spot: bool
    usd_per_hr: float
    ranks: tuple[int, ...]  # global ranks, ascending
    replicas: tuple[tuple[int, int], ...]  # (stage, replica) pairs placed here
    why: str = ""  # why this shape, in words (the plan artifact shows it)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningInstance:
    """What matching needs to know of an instance that is up."""

    instance_id: str
    zone: str
    instance_type: str
    spot: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    keep: tuple[tuple[NodeRequest, str], ...]  # node served by a running instance id
    launch: tuple[NodeRequest, ...]
    surplus: tuple[str, ...]  # running instance ids the plan does not use


def availability_from_offers(offers: Iterable[Offer], *, max_gpus_per_type_zone: int,
                             gpus: Sequence[str] = (), zones: Sequence[str] = ()) -> dict[tuple[str, str], int]:
    """GPUs the planner may use per (GPU type, zone): offered there, within the job's cap and filters."""
    out: dict[tuple[str, str], int] = {}
    for o in offers:
        if (gpus and o.gpu not in gpus) or (zones and o.zone not in zones):
            continue
        out[(o.gpu, o.zone)] = max_gpus_per_type_zone
    return out


def _price(o: Offer, spot: bool) -> float:
    return o.spot_usd_per_hr if spot else o.on_demand_usd_per_hr


def nodes_for_plan(plan: Plan, offers: Sequence[Offer], *, spot: bool = True) -> list[NodeRequest]:
    """The instances ``plan`` needs, each on its replicas' market (``spot``: the job's, for
    replicas that name none); InfeasibleError when a replica fits no offered instance type."""
    groups: dict[tuple[str, str, bool], list[tuple[int, int, int]]] = {}
    for s, stage in enumerate(plan.stages):
        for r, rep in enumerate(stage.replicas):
            groups.setdefault((rep.gpu, rep.zone, rep.on_spot(spot)), []).append((s, r, rep.tp_degree))
    nodes: list[NodeRequest] = []
    for (gpu, zone, on_spot), replicas in groups.items():
        nodes += _pool_nodes(plan, [o for o in offers if o.gpu == gpu and o.zone == zone], replicas,
                             gpu=gpu, zone=zone, spot=on_spot)
    return sorted(nodes, key=lambda n: n.ranks[0])


def _pool_nodes(plan: Plan, here: Sequence[Offer], replicas: list[tuple[int, int, int]], *, gpu: str, zone: str,
                spot: bool) -> list[NodeRequest]:
    """The nodes of one pool's replicas (stage, replica, tp) of one market, among its offers ``here``."""
    largest_tp = max(tp for _, _, tp in replicas)
    sizes = sorted({o.gpus_per_node for o in here if o.gpus_per_node >= largest_tp})
    if not sizes:
        raise InfeasibleError(f"no instance type in {zone} has {largest_tp} {gpu} GPUs on one node")

    def packed(size: int) -> list[tuple[list[tuple[int, int, int]], Offer, str]]:
        return [(b, *_right_size(here, sum(tp for _, _, tp in b), len(b), spot))
                for b in _first_fit(replicas, size)]

    # Whole nodes are paid for: the packing whose right-sized nodes cost least, then fewer nodes.
    options = [packed(size) for size in sizes]
    best = min(options, key=lambda p: (sum(_price(shape, spot) for _, shape, _ in p), len(p)))
    nodes = []
    for b, shape, why in best:
        ranks = sorted(rk for s, r, _ in b for rk in replica_ranks(plan, s, r))
        nodes.append(NodeRequest(
            cloud=shape.cloud, zone=zone, instance_type=shape.instance_type, gpu=gpu,
            gpus_per_node=shape.gpus_per_node, spot=spot, usd_per_hr=_price(shape, spot),
            ranks=tuple(ranks), replicas=tuple(sorted((s, r) for s, r, _ in b)), why=why,
        ))
    return nodes


def _first_fit(replicas: list[tuple[int, int, int]], capacity: int) -> list[list[tuple[int, int, int]]]:
    """(stage, replica, tp) packed into nodes of ``capacity`` GPUs, largest first."""
    bins: list[list[tuple[int, int, int]]] = []
    for item in sorted(replicas, key=lambda x: -x[2]):
        for b in bins:
            if sum(tp for _, _, tp in b) + item[2] <= capacity:
                b.append(item)
                break
        else:
            bins.append([item])
    return bins


def _right_size(here: Sequence[Offer], num_gpus: int, num_replicas: int, spot: bool) -> tuple[Offer, str]:
    """The cheapest shape among ``here`` (one GPU type, one zone) holding ``num_gpus``, and why it was rented."""
    holding = [o for o in here if o.gpus_per_node >= num_gpus]
    shape = min(holding, key=lambda o: (_price(o, spot), o.gpus_per_node))
    smallest = min(o.gpus_per_node for o in holding)
    gpus = f"{num_gpus} {shape.gpu}"
    if shape.gpus_per_node == num_gpus and num_replicas > 1:
        why = f"{num_replicas} replicas on one node: the cheapest way to rent {gpus} here"
    elif shape.gpus_per_node == num_gpus:
        why = f"the smallest shape holding {gpus}"
    elif shape.gpus_per_node == smallest:
        why = f"no shape of exactly {gpus} here: {shape.gpus_per_node - num_gpus} of {shape.gpus_per_node} GPUs idle"
    else:
        why = f"cheaper than the {smallest}-GPU shape for {gpus}"
    return shape, why


def match_instances(nodes: Sequence[NodeRequest], running: Iterable[RunningInstance]) -> Placement:
    """Serve nodes with running instances of the same type, zone and market first; the rest is launched."""
    pool: dict[tuple[str, str, bool], list[str]] = {}
    for inst in sorted(running, key=lambda i: i.instance_id):
        pool.setdefault((inst.zone, inst.instance_type, inst.spot), []).append(inst.instance_id)
    keep, launch = [], []
    for node in nodes:
        ids = pool.get((node.zone, node.instance_type, node.spot))
        if ids:
            keep.append((node, ids.pop(0)))
        else:
            launch.append(node)
    surplus = tuple(i for ids in pool.values() for i in ids)
    return Placement(keep=tuple(keep), launch=tuple(launch), surplus=surplus)


def plan_usd_per_hr(nodes: Iterable[NodeRequest]) -> float:
    return sum(n.usd_per_hr for n in nodes)
