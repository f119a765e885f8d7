"""Sailor's pure core: types, catalogs, profiles, network, simulator, planner.

Nothing here imports Prefect, boto3 or google-cloud; only ``sailor_core.runtime``
imports torch.
"""
