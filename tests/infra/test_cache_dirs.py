"""The build caches stay bounded: the wheels of a checkout's ``.whl/`` and the embedded image's
per-wheel environments lose their idle, oldest entries, never a recent one or a build in progress."""

import os
import time

import pytest

from infra import cache_dirs
from infra.code import build_wheel


def _entry(cache, n: int, age_s: float):
    p = cache / f"{n:064x}"
    p.mkdir(parents=True)
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_prune_keeps_the_newest_and_the_recently_used(tmp_path):
    day = 24 * 3600.0
    old = [_entry(tmp_path, n, age_s=(10 + n) * day) for n in range(5)]  # idle for 10-14 days
    recent = [_entry(tmp_path, 100 + n, age_s=n * 3600.0) for n in range(3)]
    building = tmp_path / f"{7:064x}.tmp-123"  # an environment being made
    building.mkdir()
    other = tmp_path / "notes"  # not an entry of the cache
    other.mkdir()
    gone = cache_dirs.prune(tmp_path, keep=4, max_idle_s=7 * day)
    # the 3 recent and the newest old one are the 4 kept; the other old ones go
    assert sorted(gone) == sorted(old[1:])
    assert all(p.exists() for p in recent) and old[0].exists() and building.exists() and other.exists()
    # used within the idle limit: kept even beyond ``keep``
    cache_dirs.mark_used(old[0])
    assert cache_dirs.prune(tmp_path, keep=1, max_idle_s=7 * day) == []
    assert cache_dirs.prune(tmp_path / "absent") == []
    with pytest.raises(ValueError):
        cache_dirs.prune(tmp_path, keep=0)


def test_a_new_wheel_prunes_the_idle_builds(tmp_path):
    day = 24 * 3600.0
    stale = [_entry(tmp_path, n, age_s=30 * day) for n in range(cache_dirs.KEEP + 2)]
    wheel, key = build_wheel(cache_dir=tmp_path)
    assert wheel.is_file() and wheel.parent.name == key
    left = [p for p in stale if p.exists()]
    # the new build is one of the KEEP most recent; the others are the newest of the stale
    assert len(left) == cache_dirs.KEEP - 1
    again, _ = build_wheel(cache_dir=tmp_path)  # reused, and marked used
    assert again == wheel and time.time() - wheel.parent.stat().st_mtime < 60


def test_the_embedded_image_prunes_idle_environments(tmp_path):
    from infra.local.image import image_for_this_machine

    image = image_for_this_machine(home=tmp_path)
    day = 24 * 3600.0
    stale = [_entry(image.env_cache, n, age_s=(30 + n) * day) for n in range(cache_dirs.KEEP + 3)]
    assert image_for_this_machine(home=tmp_path) == image  # a cloud starting on the image
    assert [p.exists() for p in stale] == [True] * cache_dirs.KEEP + [False] * 3


def test_a_package_installed_or_upgraded_makes_a_new_embedded_image(tmp_path):
    """An image made before a package was installed lacks it: its instances would download it at boot."""
    from infra.local.image import image_key

    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "torch-2.13.0.dist-info").mkdir()
    before = image_key(site)
    assert image_key(site) == before  # the same environment, the same image
    (site / "tensorboard-2.21.0.dist-info").mkdir()
    installed = image_key(site)
    (site / "tensorboard-2.21.0.dist-info").rename(site / "tensorboard-2.22.0.dist-info")
    assert len({before, installed, image_key(site)}) == 3
    upgraded = image_key(site)
    (site / "sailor_core").mkdir()  # Sailor's own entries and caches are not the image's
    (site / "__pycache__").mkdir()
    assert image_key(site) == upgraded
