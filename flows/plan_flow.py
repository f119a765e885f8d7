"""The plan flow: the best plans for a model on the GPUs the clouds offer now; nothing is rented.

Its parameters are PlanTerms' fields (``sailor_core/specs/plan.py``, as ``sailor plan`` takes
them) and the offers' filters here."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.spec_parameters import takes_spec
from sailor_core.job import report
from sailor_core.specs.plan import PlanTerms
from tasks import cloud as cloud_tasks
from tasks import control, reporting


@flow(name="plan", description="Plan a training job on current offers (no instances are rented).")
@takes_spec(PlanTerms)
def plan_flow(terms: PlanTerms, *, gpus: list[str] | None = None, zones: list[str] | None = None,
              clouds: list[str] | None = None, max_gpus_per_zone: int = 8, max_gpus: int | None = None,
              cloud: str = "auto") -> dict:
    """The plans for ``terms`` on the offers of the GPU types, zones and clouds allowed (all when not
    given), at most ``max_gpus_per_zone`` of one type per zone and ``max_gpus`` in all."""
    model = terms.model
    session = cloud_tasks.offers_session(cloud, clouds or ())
    offers = cloud_tasks.list_offers(session, gpus or (), zones or (), clouds or ())
    planner = control.planner_on_offers(offers, model=model, objective=terms.objective,
                                        global_batch_size=terms.global_batch_size,
                                        max_usd_per_hr=terms.max_usd_per_hr,
                                        min_throughput_samples_per_s=terms.min_throughput_samples_per_s,
                                        spot=terms.spot)
    available = control.availability(offers, max_gpus_per_zone=max_gpus_per_zone, max_gpus=max_gpus)
    options = control.plan_options(planner, available)
    rows = [{"rank": i + 1, "GPUs": report.gpus(o.gpus), "samples/s": report.sig(o.throughput_samples_per_s),
             "USD/h": report.sig(o.usd_per_hr), "stages": o.plan.pp_degree,
             "micro-batch": o.plan.micro_batch_size} for i, o in enumerate(options)]
    create_table_artifact(key=reporting.artifact_key("plans", model), table=rows or [{"rank": "none"}],
                          description=f"plans for {model} on {sum(available.values())} GPUs offered now ({session.mode})")
    if options:
        create_markdown_artifact(key=reporting.artifact_key("pareto", model),
                                 markdown=reporting.pareto_markdown(control.pareto_points(planner),
                                                                    control.chosen_point(planner, options[0])),
                                 description="cost against throughput of the plans on the Pareto front")
    result = planner.last_result
    return {"search_time_s": result.search_time_s if result else None,
            "plans": [{"plan": o.plan.to_dict(), "throughput_samples_per_s": o.throughput_samples_per_s,
                       "usd_per_hour": o.usd_per_hr} for o in options]}
