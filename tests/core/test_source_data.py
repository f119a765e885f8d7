"""The repository stands on its own: its source data is inside it, the shipped files are
rebuilt from that data exactly, and nothing names a path outside the repository."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sailor_core import source_data
from sailor_core.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

# Built from pieces so that this file does not match itself.
_SIBLING = "." + "./" + "shared"
_OUTSIDE = [
    re.compile(re.escape(_SIBLING)),
    # a path built by climbing above the repository to a folder named like the old sibling
    re.compile(r"parents\[\d+\]\.parent\s*/\s*[\"']" + "shared"),
    re.compile(r"parents\[[3-9]\]\s*/\s*[\"']" + "shared"),
]
_CHECKED_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini", ""}


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_source_data_is_inside_the_repository_with_licenses():
    assert source_data.REPO_DATA_DIR == ROOT / "data"
    for folder in (source_data.SAILOR_DATA_DIR, source_data.MEASUREMENTS_DIR, source_data.SPOT_TRACES_DIR):
        assert (folder / "README.md").is_file(), folder
    assert "MIT License" in (source_data.SAILOR_DATA_DIR / "LICENSE").read_text()
    for src in ("bamboo", "oobleck", "training_on_a_dime"):
        assert "Permission is hereby granted, free of charge" in (source_data.SPOT_TRACES_DIR / src / "LICENSE").read_text(), src
    assert source_data.MEASUREMENTS_FILE.is_file()
    assert (ROOT / "data" / "README.md").is_file()


def test_shipped_files_are_rebuilt_byte_for_byte_from_the_source_data(tmp_path):
    written = source_data.build(tmp_path)
    assert len(written) == 6
    for rel in written:
        shipped, rebuilt = ROOT / rel, tmp_path / rel
        assert shipped.read_bytes() == rebuilt.read_bytes(), f"{rel} differs from what data/ builds"


def test_the_rebuild_command_prints_what_it_wrote_and_fails_in_one_line(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "sailor_core.source_data", "build", "--out", str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "228 profiles" in ok.stdout and "12 profiles" in ok.stdout


def test_require_names_what_is_missing(tmp_path):
    with pytest.raises(InputError, match="missing: the source data ships only with a checkout"):
        source_data.require(tmp_path / "nope")


def test_nothing_names_a_path_outside_the_repository():
    offenders = []
    for path in _tracked_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("data", "docs") or path.suffix not in _CHECKED_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in _OUTSIDE):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)
