"""The calibrations kept on disk: the fit's own answer, a new file when any input changes, and a
file that cannot be read is computed again."""

import dataclasses
import struct

from sailor_core.profiles import ProfileDB
from sailor_core.profiles import estimator as est
from sailor_core.profiles.calibration_cache import _profile_bytes, cache_dir, cached_calibrate

GPU, REGIME = "A100-40", "megatron-fp32-adamw"


def _measured(sailor_profiles):
    return [p for p in sailor_profiles if p.gpu == GPU and p.regime == REGIME]


def test_the_cached_calibration_is_the_fit_bit_for_bit(sailor_profiles):
    profiles = _measured(sailor_profiles)
    fitted = est.calibrate(profiles, GPU, REGIME)
    first = cached_calibrate(profiles, GPU, REGIME)
    files = list(cache_dir().glob("*.json"))
    again = cached_calibrate(profiles, GPU, REGIME)
    assert len(files) == 1
    assert first == fitted and again == fitted
    assert [getattr(again, f.name) for f in dataclasses.fields(again)] == \
        [getattr(fitted, f.name) for f in dataclasses.fields(fitted)]


def test_a_changed_profile_is_another_entry(sailor_profiles):
    profiles = _measured(sailor_profiles)
    cached_calibrate(profiles, GPU, REGIME)
    first = profiles[0]
    slower = dataclasses.replace(first, layers=tuple(dataclasses.replace(x, fwd_s=x.fwd_s * 3) for x in first.layers))
    changed = [slower, *profiles[1:]]
    assert cached_calibrate(changed, GPU, REGIME) == est.calibrate(changed, GPU, REGIME)
    assert len(list(cache_dir().glob("*.json"))) == 2


def test_an_unreadable_entry_is_fitted_again(sailor_profiles):
    profiles = _measured(sailor_profiles)
    cached_calibrate(profiles, GPU, REGIME)
    (path,) = cache_dir().glob("*.json")
    path.write_text("{not json")
    assert cached_calibrate(profiles, GPU, REGIME) == est.calibrate(profiles, GPU, REGIME)
    assert ProfileDB(profiles).calibration(GPU, REGIME) == est.calibrate(profiles, GPU, REGIME)


def test_a_profiles_digest_bytes_are_its_fields_column_by_column(sailor_profiles):
    # The file names of existing caches stay valid: every layer field packed as one column (8
    # bytes a value, exact), the profile's other fields by repr, as the digest has always read them.
    codes = {"float": "d", "int": "q", "bool": "?"}
    for profile in sailor_profiles[:40]:
        want = [repr([(f.name, getattr(profile, f.name)) for f in dataclasses.fields(profile)
                      if f.name != "layers"]).encode()]
        for f in dataclasses.fields(profile.layers[0]):
            column = [getattr(layer, f.name) for layer in profile.layers]
            code = codes[f.type if isinstance(f.type, str) else f.type.__name__]
            want += [struct.pack(f"<{len(column)}{code}", *column), f.name.encode()]
        want.append(str(len(profile.layers)).encode())
        assert _profile_bytes(profile) == b"\x00".join(want)
