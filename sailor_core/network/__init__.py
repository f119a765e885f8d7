"""Network model: transfer times between GPU endpoints and egress prices (see ``model``)."""

from sailor_core.network.fits import BandwidthFit
from sailor_core.network.model import (
    ALLREDUCE_BUCKET_BYTES,
    DEFAULT_LINKS,
    Endpoint,
    LinkClass,
    LinkDefault,
    NetworkModel,
    default_network,
    link_class,
)

__all__ = [
    "ALLREDUCE_BUCKET_BYTES",
    "DEFAULT_LINKS",
    "BandwidthFit",
    "Endpoint",
    "LinkClass",
    "LinkDefault",
    "NetworkModel",
    "default_network",
    "link_class",
]
