"""Error translation at the boundary, on the SDKs' own exception objects."""

from __future__ import annotations

import botocore.exceptions as bexc
import google.api_core.exceptions as gexc
import pytest

from infra.aws import translate_aws_error
from infra.errors import CapacityError, CloudConfigError, CloudError, QuotaError, TransientCloudError
from infra.gcp import translate_gcp_error
from infra.retry import RetryPolicy, with_retries
from sailor_core.errors import SailorError


def client_error(code: str, status: int) -> bexc.ClientError:
    return bexc.ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                            "RunInstances")


@pytest.mark.parametrize("code,status,kind", [
    ("InsufficientInstanceCapacity", 500, CapacityError),
    ("Unsupported", 400, CapacityError),
    ("VcpuLimitExceeded", 400, QuotaError),
    ("MaxSpotInstanceCountExceeded", 400, QuotaError),
    ("RequestLimitExceeded", 503, TransientCloudError),
    ("InternalError", 500, TransientCloudError),
    ("SomethingNew", 502, TransientCloudError),
    ("AuthFailure", 401, CloudConfigError),
    ("UnauthorizedOperation", 403, CloudConfigError),
    ("InvalidParameterValue", 400, CloudError),
])
def test_aws_codes(code, status, kind):
    err = translate_aws_error(client_error(code, status), zone="us-east-1a", what="run_instances")
    assert type(err) is kind and isinstance(err, SailorError)
    assert err.code in (code, str(status)) and err.zone == "us-east-1a"


def test_aws_transport_and_credentials():
    assert isinstance(translate_aws_error(bexc.NoCredentialsError()), CloudConfigError)
    assert isinstance(translate_aws_error(bexc.EndpointConnectionError(endpoint_url="http://x")), TransientCloudError)
    assert isinstance(translate_aws_error(bexc.ReadTimeoutError(endpoint_url="http://x")), TransientCloudError)


@pytest.mark.parametrize("exc,kind", [
    (gexc.TooManyRequests("slow down"), TransientCloudError),
    (gexc.ServiceUnavailable("backend"), TransientCloudError),
    (gexc.InternalServerError("oops"), TransientCloudError),
    (gexc.Forbidden("Quota 'GPUS_ALL_REGIONS' exceeded"), QuotaError),
    (gexc.Forbidden("Required 'compute.instances.create' permission"), CloudConfigError),
    (gexc.Unauthorized("bad token"), CloudConfigError),
    (gexc.BadRequest("Machine type with name 'a2-highgpu-1g' does not exist in zone 'x'"), CapacityError),
    (gexc.NotFound("no such instance"), CloudError),
])
def test_gcp_exceptions(exc, kind):
    assert type(translate_gcp_error(exc, zone="us-central1-a")) is kind


def test_retries_back_off_then_give_up_and_never_retry_capacity():
    sleeps, calls = [], []

    def flaky():
        calls.append(1)
        raise TransientCloudError("throttled")

    policy = RetryPolicy(max_attempts=4, base_delay_s=0.1, max_delay_s=0.3)
    with pytest.raises(TransientCloudError):
        with_retries(flaky, policy, sleep=sleeps.append)
    assert len(calls) == 4 and len(sleeps) == 3
    assert all(0.05 <= s <= 0.3 for s in sleeps) and sleeps[2] >= 0.15  # grows, capped

    def full():
        calls.append(1)
        raise CapacityError("no room")

    calls.clear()
    with pytest.raises(CapacityError):
        with_retries(full, policy, sleep=sleeps.append)
    assert len(calls) == 1
