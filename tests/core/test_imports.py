"""The simulator and planner load without torch, Prefect or any cloud SDK (DESIGN.md layering)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "prefect", "boto3", "botocore", "google.cloud", "moto")


def test_simulator_and_planner_import_light():
    code = (
        "import json, sys\n"
        "import sailor_core.network, sailor_core.simulator, sailor_core.planner\n"
        "from sailor_core.simulator import simulate\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == []


def test_job_protocol_settings_storage_and_the_agent_import_light():
    """The agent starts on every instance and the flow reads its documents: neither pulls torch,
    numpy, Prefect or a cloud SDK in through the job's core modules."""
    code = (
        "import json, sys\n"
        "import sailor_core.settings, sailor_core.storage, sailor_core.runtime.agent\n"
        "import sailor_core.job.protocol, sailor_core.job.state, sailor_core.job.attempts, sailor_core.job.nodes\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in (*FORBIDDEN, "numpy"))]
    assert bad == []
