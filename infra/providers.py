"""The cloud providers, one line each: calls routed by the cloud's name (after SkyPilot's
``sky/provision/__init__.py``, which routes each verb to ``sky.provision.<cloud>``).

A provider's module is imported only when its cloud is used: each pulls in its cloud's SDK
(boto3, google-cloud-compute), which a machine that uses the other cloud need not have.  The
clouds named here are the ones ``catalog/data/clouds.json`` says are rented (a test checks).
"""

from __future__ import annotations

import importlib

from infra.errors import CloudConfigError
from infra.provider import CloudProvider

# cloud name -> "module:class" of its CloudProvider
PROVIDERS: dict[str, str] = {
    "aws": "infra.aws:AWSProvider",
    "gcp": "infra.gcp:GCPProvider",
}


def cloud_names() -> tuple[str, ...]:
    return tuple(PROVIDERS)


def check_clouds(clouds) -> None:
    """One line for a cloud no provider is registered for."""
    unknown = [c for c in clouds if c not in PROVIDERS]
    if unknown:
        raise CloudConfigError(f"unknown cloud {unknown[0]!r}; known: {', '.join(PROVIDERS)}")


def provider_class(cloud: str) -> type[CloudProvider]:
    check_clouds([cloud])
    module, _, name = PROVIDERS[cloud].partition(":")
    return getattr(importlib.import_module(module), name)


def real_provider(cloud: str) -> CloudProvider:
    """The provider of the real ``cloud``, configured from Sailor's settings."""
    return provider_class(cloud).from_settings()
