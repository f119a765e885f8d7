"""A trivial planner for controller and replay tests: throughput and cost add up per GPU."""

from sailor_core.controller import PlanOption, describe_gpus

SPEED = {"A100-40": 10.0, "V100-16": 4.0, "T4": 1.0}       # samples/s per GPU
PRICE = {"A100-40": 1.2, "V100-16": 0.8, "T4": 0.2}         # USD/h per GPU
ZONE_PRICE = {"us-central1-b": 0.9}                          # multiplier; others 1.0


def linear_option(gpus):
    gpus = {k: n for k, n in gpus.items() if n > 0}
    return PlanOption(
        gpus=gpus,
        throughput_samples_per_s=sum(SPEED[g] * n for (g, _), n in gpus.items()),
        usd_per_hr=sum(PRICE[g] * ZONE_PRICE.get(z, 1.0) * n for (g, z), n in gpus.items()),
        label=describe_gpus(gpus),
    )


def linear_planner(available):
    """Best first: everything; then each pool alone (cheaper, slower)."""
    avail = {k: n for k, n in available.items() if n > 0}
    if not avail:
        return []
    options = [linear_option(avail)]
    if len(avail) > 1:
        singles = sorted((linear_option({k: n}) for k, n in avail.items()),
                         key=lambda o: -o.throughput_samples_per_s)
        options += singles
    return options
