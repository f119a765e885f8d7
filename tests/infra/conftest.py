"""One embedded cloud (moto EC2 server + GCE fake) for the whole session, reset per test."""

from __future__ import annotations

import time

import pytest

from infra.local.cloud import EmbeddedCloud, providers_for
from infra.retry import RetryPolicy

# Few regions/zones keep each listing call short; they cover every zone the tests use.
AWS_REGIONS = ["us-east-1", "us-west-2"]
GCP_ZONES = ["us-central1-a", "us-central1-b", "us-west1-b", "europe-west4-a"]
FAST_RETRY = RetryPolicy(max_attempts=8, base_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture(scope="session")
def embedded(tmp_path_factory):
    cloud = EmbeddedCloud(state_dir=tmp_path_factory.mktemp("cloud"), notice_s=0.5, tick_s=0.1, halt_grace_s=0.3)
    cloud.start()
    yield cloud
    cloud.stop()


@pytest.fixture
def cloud(embedded):
    embedded.reset()
    yield embedded
    embedded.reset()


def make_providers(cloud: EmbeddedCloud, retry: RetryPolicy = FAST_RETRY) -> dict:
    providers = providers_for(cloud.aws_endpoint, cloud.gce_endpoint, retry=retry, aws_regions=AWS_REGIONS,
                              aws_keys=cloud.aws_keys)
    providers["gcp"].zones = list(GCP_ZONES)
    return providers


@pytest.fixture
def providers(cloud):
    return make_providers(cloud)


@pytest.fixture
def new_providers(cloud):
    """Providers made from scratch, as another process would (no shared memory)."""
    return lambda: make_providers(cloud)


def wait_until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
