"""Catalogs of GPUs, models and cloud instances, loaded from the JSON files in ``data/``.

The files are data, not code, so prices and specs can be refreshed without a release.
"""

from sailor_core.catalog.gpus import GPUSpec, get_gpu, gpu_names, normalize_gpu_name
from sailor_core.catalog.models import ModelSpec, get_model, model_names

__all__ = [
    "GPUSpec",
    "ModelSpec",
    "get_gpu",
    "get_model",
    "gpu_names",
    "model_names",
    "normalize_gpu_name",
]
