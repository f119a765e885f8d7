"""The simulator and planner load without torch, Prefect or any cloud SDK (DESIGN.md layering)."""

import ast
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


def imported_names(source: str, module: str) -> set[str]:
    """Every module (and ``module.name`` of a from-import) that ``source``, the module named
    ``module``, imports anywhere: at its top, inside functions, relative imports resolved."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join(parent + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def runtime_imports(package_dir: Path) -> list[str]:
    """``file: name`` for each import of ``sailor_core.runtime`` under ``package_dir``."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found += [f"{path.relative_to(ROOT)}: {name}" for name in sorted(imported_names(path.read_text(), module))
                  if name == "sailor_core.runtime" or name.startswith("sailor_core.runtime.")]
    return found


def test_job_state_never_imports_the_runtime():
    """``sailor_core/job`` (job state, its protocol and attempts) is read by the flow, which has no
    engine: it imports nothing of ``sailor_core/runtime``, not even inside a function."""
    assert runtime_imports(ROOT / "sailor_core" / "job") == []


def test_the_runtime_import_check_sees_every_spelling():
    for source in ("from sailor_core.runtime.worker import EXIT_OK", "import sailor_core.runtime.trainer",
                   "from sailor_core import runtime", "def f():\n    from ..runtime import recipe\n"):
        names = imported_names(source, "sailor_core.job.attempts")
        assert any(n == "sailor_core.runtime" or n.startswith("sailor_core.runtime.") for n in names), source
    assert not any(n.startswith("sailor_core.runtime") for n in imported_names(
        "from sailor_core.job.protocol import EXIT_OK", "sailor_core.job.attempts"))
