"""`sailor replay` bad input: one `error:` line, non-zero exit, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sailor(*args):
    return subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--trace", "/nonexistent.csv", "--model", "opt-350m", "--tokens", "1e9"], "does not exist"),
        (["--trace", "derived:gcp-4d", "--model", "no-such-model", "--tokens", "1e9"], "unknown model"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "-5"], "tokens"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--policy", "yolo"], "unknown policy"),
        (["--trace", "derived:nope", "--model", "opt-350m", "--tokens", "1e9"], "unknown derived trace"),
    ],
)
def test_bad_input_one_error_line(args, words):
    p = sailor("replay", *args)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_bad_trace_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("hello,world\nfoo,bar\n")
    p = sailor("replay", "--trace", str(bad), "--model", "opt-350m", "--tokens", "1e9")
    assert p.returncode != 0 and p.stderr.startswith("error:") and "trace format" in p.stderr
