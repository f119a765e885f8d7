"""The refresh-offers flow (scheduled in prefect.yaml): GPU offers and spot prices of the clouds, as a table."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact

from tasks import cloud as cloud_tasks


@flow(name="refresh-offers", description="List GPU offers and prices per zone of the configured clouds.")
def refresh_offers(cloud: str = "auto", gpus: list[str] | None = None, zones: list[str] | None = None,
                   clouds: list[str] | None = None) -> list[dict]:
    session = cloud_tasks.offers_session(cloud, clouds or ())
    offers = cloud_tasks.list_offers.with_options(refresh_cache=True)(session, gpus or (), zones or (), clouds or ())
    rows = sorted(({"cloud": o.cloud, "zone": o.zone, "instance_type": o.instance_type, "gpu": o.gpu,
                    "gpus_per_node": o.gpus_per_node, "spot_usd_per_hr": o.spot_usd_per_hr,
                    "on_demand_usd_per_hr": o.on_demand_usd_per_hr} for o in offers),
                  key=lambda r: (r["spot_usd_per_hr"] / r["gpus_per_node"], r["zone"]))
    create_table_artifact(key=f"offers-{session.mode}", table=rows,
                          description=f"{len(rows)} offers from {', '.join(session.providers)} ({session.mode}), "
                                      "cheapest per GPU first")
    return rows
