import pytest

from sailor_core.errors import InputError, UnknownNameError
from sailor_core.planner import Objective, make_request, parse_gpu_list


def test_parse_gpu_list_sums_and_normalises():
    got = parse_gpu_list("A100@us-central1-a=8, V100-16@us-central1-a=4,a100-40gb@us-central1-a=8")
    assert got == {("A100-40", "us-central1-a"): 16, ("V100-16", "us-central1-a"): 4}


def test_parse_gpu_list_without_zone_is_local():
    assert parse_gpu_list("H200=8") == {("H200", "local"): 8}


@pytest.mark.parametrize("text, needle", [
    ("", "empty"),
    ("A100-40@us-central1-a", "=COUNT"),
    ("A100-40@us-central1-a=x", "not an integer"),
    ("A100-40@us-central1-a=-2", "negative"),
    ("B999@us-central1-a=2", "unknown GPU"),
    ("A100-40@mars-1=2", "unknown zone"),
])
def test_parse_gpu_list_rejects_bad_input(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_gpu_list(text)


def test_make_request_validates():
    req = make_request(model="OPT-350", availability={("A100", "us-central1-a"): 4}, objective="COST")
    assert req.model == "opt-350m" and req.objective is Objective.COST
    assert req.availability == {("A100-40", "us-central1-a"): 4}
    with pytest.raises(UnknownNameError):
        make_request(model="gpt-5", availability={("A100-40", "us-central1-a"): 4})
    with pytest.raises(InputError, match="objective"):
        make_request(model="tiny", availability={("A100-40", "us-central1-a"): 4}, objective="speed")
    with pytest.raises(InputError, match="positive"):
        make_request(model="tiny", availability={("A100-40", "us-central1-a"): 4}, max_usd_per_hour=-1)
    with pytest.raises(InputError, match="no GPUs"):
        make_request(model="tiny", availability={("A100-40", "us-central1-a"): 0})
    with pytest.raises(InputError, match="batch"):
        make_request(model="tiny", availability={("A100-40", "us-central1-a"): 1}, global_batch_size=0)
