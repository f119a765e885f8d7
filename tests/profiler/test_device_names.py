"""CUDA device names -> catalog GPU types, and a new GPU as a data change (gpus.json only)."""

import copy

import pytest

from sailor_core.catalog import gpus
from sailor_core.catalog.gpus import get_gpu, gpu_names
from sailor_core.errors import InputError
from sailor_core.profiler.compute import gpu_type_of
from sailor_core.profiles import estimator as est
from sailor_core.regimes import get_regime

FP32_REGIME = get_regime("megatron-fp32-adamw")  # matmuls on TF32 tensor cores where there are some


@pytest.mark.parametrize("device_name, gpu", [
    ("NVIDIA GH200 480GB", "GH-96"),  # contains "H200" too, but not as a word: not an H200
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 PCIe", "H100-80"),
    ("NVIDIA H100 80GB HBM3", "H100-80"),  # SXM
    ("NVIDIA A100-SXM4-40GB", "A100-40"),
    ("NVIDIA A100-SXM4-80GB", "A100-80"),  # contains "A100" too: the longer name wins
    ("NVIDIA A100 80GB PCIe", "A100-80"),
    ("A100-SXM4-80GB", "A100-80"),  # older drivers leave out "NVIDIA"
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA L4", "L4"),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100-16"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("NVIDIA GeForce RTX 2080 Ti", "RTX-2080"),
    ("NVIDIA TITAN RTX", "Titan-RTX"),
    ("nvidia  h200", "H200"),  # case and spacing do not matter
])
def test_a_cuda_device_name_is_its_catalog_gpu(device_name, gpu):
    assert gpu_type_of(device_name) == gpu


@pytest.mark.parametrize("device_name", [
    "NVIDIA L40S",  # contains "L4" but is not one
    "NVIDIA A10",  # an A10 is not an A10G
    "NVIDIA GeForce RTX 2080",  # the catalog's RTX-2080 is the 11 GB Ti
    "NVIDIA B200",
])
def test_a_gpu_the_catalog_does_not_know_is_unknown(device_name):
    assert gpus.gpu_of_device_name(device_name) is None
    with pytest.raises(InputError, match="not in the catalog; pass --gpu"):
        gpu_type_of(device_name)


def test_every_cuda_name_in_the_catalog_finds_its_own_gpu():
    for name in gpu_names():
        for cuda_name in get_gpu(name).cuda_names:
            assert gpus.gpu_of_device_name(cuda_name) == name, cuda_name


def test_tf32_tensor_cores_come_from_the_catalog():
    assert {name for name in gpu_names() if get_gpu(name).tf32} == {
        "A100-40", "A100-80", "H100-80", "H200", "GH-96", "L4", "A10G", "RTX-3090"}


# The L40S's datasheet (dense, no sparsity): 48 GB GDDR6, 362 TFLOP/s bf16, 91.6 fp32, 864 GB/s.
L40S_ROW = {"name": "L40S", "aliases": ["nvidia-l40s"], "memory_bytes": 51539607552,
            "peak_bf16_flops": 362e12, "peak_fp32_flops": 91.6e12, "memory_bw_bytes_per_s": 0.864e12,
            "intra_node_bw_bytes_per_s": 32e9, "intra_node_link": "pcie4", "gpus_per_node": [1, 4, 8],
            "default_gpus_per_node": 4, "tf32": True, "cuda_names": ["NVIDIA L40S", "L40S"]}


@pytest.fixture
def catalog_with(monkeypatch):
    """Load the GPU catalog from gpus.json plus extra rows, as if they had been added to the file."""
    shipped = gpus.load_data_file("gpus.json")

    def load(*rows):
        data = copy.deepcopy(shipped)
        data["gpus"].extend(copy.deepcopy(rows))
        monkeypatch.setattr(gpus, "load_data_file", lambda name: data)
        gpus._catalog.cache_clear()

    yield load
    gpus._catalog.cache_clear()


def test_a_new_gpu_is_one_row_of_data(catalog_with):
    catalog_with(L40S_ROW)
    assert gpu_type_of("NVIDIA L40S") == "L40S"
    assert gpu_type_of("NVIDIA L4") == "L4"
    l40s = get_gpu("nvidia-l40s")
    assert est.matmul_peak_flops(l40s, FP32_REGIME) == 362e12 / 2  # its TF32 tensor cores
    times = est.predict_model("opt-350m", "L40S", 1, 1, 2048, FP32_REGIME.name,
                              est.default_calibration("L40S", FP32_REGIME.name))
    assert len(times) > 0 and all(t > 0 for t in times[0])


def test_the_estimator_reads_the_tf32_flag_from_the_data(catalog_with):
    catalog_with({**L40S_ROW, "tf32": False})
    assert est.matmul_peak_flops(get_gpu("L40S"), FP32_REGIME) == 91.6e12


def test_a_cuda_name_listed_for_two_gpus_is_a_data_error(catalog_with):
    catalog_with({**L40S_ROW, "cuda_names": ["NVIDIA L4"]})
    with pytest.raises(ValueError, match="'NVIDIA L4' is listed for both L4 and L40S"):
        get_gpu("L4")
