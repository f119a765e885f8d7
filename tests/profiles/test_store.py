"""The parquet format: round trip, and corrupt files as one clear ProfileError."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sailor_core.errors import ProfileError
from sailor_core.profiles import default_profile_db
from sailor_core.profiles.default import write_user_profiles
from sailor_core.profiles.store import read_profiles, user_profiles_dir, write_profiles


def test_round_trip_is_exact(tmp_path, h200_profiles, sailor_profiles):
    profiles = h200_profiles + sailor_profiles[:5]
    path = write_profiles(tmp_path / "p.parquet", profiles)
    back = read_profiles(path)
    assert sorted(back, key=lambda p: p.key) == sorted(profiles, key=lambda p: p.key)
    table = pq.read_table(path)
    assert table.schema.metadata[b"sailor_profile_format"] == b"1"
    assert table.num_rows == sum(len(p.layers) for p in profiles)  # one row per layer


def test_not_parquet(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all")
    with pytest.raises(ProfileError, match="bad.parquet is not a readable profile file"):
        read_profiles(bad)
    with pytest.raises(ProfileError, match="does not exist"):
        read_profiles(tmp_path / "missing.parquet")


def _rewrite(tmp_path, profiles, change):
    good = write_profiles(tmp_path / "good.parquet", profiles)
    data = pq.read_table(good).to_pydict()
    change(data)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table(data), bad)
    return bad


def test_missing_column_gap_and_negative_time(tmp_path, h200_profiles):
    bad = _rewrite(tmp_path, h200_profiles[:1], lambda d: d.pop("fwd_s"))
    with pytest.raises(ProfileError, match="missing columns fwd_s"):
        read_profiles(bad)
    bad = _rewrite(tmp_path, h200_profiles[:1], lambda d: d["layer"].__setitem__(3, 99))
    with pytest.raises(ProfileError, match="layer indices"):
        read_profiles(bad)
    bad = _rewrite(tmp_path, h200_profiles[:1], lambda d: d["bwd_s"].__setitem__(2, -1.0))
    with pytest.raises(ProfileError, match="bwd_s must be a finite non-negative"):
        read_profiles(bad)


def test_user_profiles_are_found_and_win(h200_profiles):
    from sailor_core.profiles.types import ModelProfile

    p = h200_profiles[0]
    faster = ModelProfile(
        model=p.model,
        gpu=p.gpu,
        tp_degree=p.tp_degree,
        micro_batch_size=p.micro_batch_size,
        seq_len=p.seq_len,
        layers=p.layers,
        regime=p.regime,
        source="mine",
        update_s_per_param=p.update_s_per_param,
    )
    assert default_profile_db().get(p.model, p.gpu, p.tp_degree, p.micro_batch_size).source != "mine"
    path = write_user_profiles("my run", [faster])
    assert path.parent == user_profiles_dir() and path.name == "my_run.parquet"
    assert default_profile_db().get(p.model, p.gpu, p.tp_degree, p.micro_batch_size).source == "mine"


def test_corrupt_user_file_fails_loading(tmp_path):
    user_profiles_dir().mkdir(parents=True)
    (user_profiles_dir() / "broken.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(ProfileError, match="broken.parquet"):
        default_profile_db()
