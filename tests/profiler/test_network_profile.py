"""Network profiler: the fit reproduces what was measured, and the network model reads it back."""

import math

import pytest

from sailor_core.network.fits import BandwidthFit
from sailor_core.profiler.network import fit_bandwidth, network_profile_from_points


def test_fit_recovers_a_known_curve():
    true = BandwidthFit(a=-0.01, b=0.2, c=1.5, max_bw_bytes_per_s=3e9)
    pts = [(2**k, 2**k / true.bandwidth_bytes_per_s(2**k)) for k in range(16, 29, 2)]
    fit, err = fit_bandwidth(pts)
    assert err < 0.02
    for b, t in pts:
        assert b / fit.bandwidth_bytes_per_s(b) == pytest.approx(t, rel=0.02)


def test_local_processes_measured_fitted_and_loaded_by_the_network_model():
    from sailor_core.network import Endpoint, default_network
    from sailor_core.profiler.network import profile_network, save_network_profile

    prof = profile_network(2, sizes=[2**16, 2**18, 2**20], reps=2)
    assert [b for b, _ in prof.p2p_points] == [2**16, 2**18, 2**20]
    assert all(t > 0 for _, t in prof.p2p_points)
    assert 2 in prof.allreduce_points and len(prof.allreduce_points[2]) == 3
    assert all(t >= 0 for _, t in prof.allreduce_cpu_points[2])
    assert math.isfinite(prof.max_rel_error)
    # every measured point is reproduced within the stated error
    for b, t in prof.p2p_points:
        assert abs(b / prof.fit.bandwidth_bytes_per_s(b) - t) <= prof.max_rel_error * t * (1 + 1e-9)
    path = save_network_profile(prof)
    net = default_network()
    e = Endpoint(zone="local", gpu="cpu")
    for b, _ in prof.p2p_points:
        assert net.p2p_time_s(b, e, e) == pytest.approx(b / prof.fit.bandwidth_bytes_per_s(b), rel=1e-9)
    assert path.name == "local-cpu--local-cpu.json"


def test_from_points_rejects_too_few_sizes():
    from sailor_core.errors import ProfileError

    with pytest.raises(ProfileError, match="at least 3"):
        network_profile_from_points({"world_size": 2, "p2p": [(2**16, 1e-4), (2**18, 3e-4)]})


def test_measured_allreduce_interpolates_between_sizes():
    from sailor_core.profiler.network import NetworkProfile

    fit = BandwidthFit(a=0.0, b=0.0, c=1.0, max_bw_bytes_per_s=1e9)
    prof = NetworkProfile(src_zone="local", src_gpu="cpu", dst_zone="local", dst_gpu="cpu", fit=fit,
                          max_rel_error=0.0, p2p_points=(), allreduce_points={2: ((2**20, 1e-3), (2**22, 4e-3))})
    assert prof.allreduce_time_s(2**20, 2) == pytest.approx(1e-3)
    assert prof.allreduce_time_s(2**21, 2) == pytest.approx(2e-3)  # log-log: time proportional to size here
    assert prof.allreduce_time_s(2**23, 2) == pytest.approx(8e-3)
    assert prof.allreduce_time_s(2**20, 3) is None
    assert prof.allreduce_time_s(2**10, 2) == pytest.approx(1e-3)  # latency-bound below the smallest size
