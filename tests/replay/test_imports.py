"""The controller, traces and replay stay pure: no Prefect, cloud SDK or torch."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pure_imports():
    code = (
        "import sys, sailor_core.traces, sailor_core.controller, sailor_core.replay, sailor_core.replay.plot;"
        "bad = [m for m in ('prefect', 'boto3', 'botocore', 'google.cloud', 'moto', 'torch') if m in sys.modules];"
        "print(','.join(bad))"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ""
