"""How long `sailor train` takes to refuse each bad input of issue 32, through the real CLI (the
console script, a new process each time) on the embedded default, in a fresh Sailor home with
no environment variables of Sailor's or the clouds'.  Each must exit 2 with one `error:` line,
leave no job state and start no Prefect server (so no flow run), within 2 s.

Printed per input: the wall time of the whole command and its CPU time (user + system, its
process and children: what an idle machine takes; medians of ``--runs``), its exit code and its
line; first the command's own floor: `sailor train --budget-usd -1` (an argument error, no
check run), what any refusal costs at least on this machine.

    .venv/bin/python benchmarks/bench_bad_inputs.py [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAILOR = str(Path(sys.executable).with_name("sailor"))

CASES = {
    "(floor: an argument error, no check)": ["--budget-usd", "-1"],
    "--init-from missing folder": ["--init-from", "{home}/hf/missing"],
    "--init-from mismatched config.json": ["--model", "{home}/hf/llama", "--init-from", "{home}/hf/qwen2"],
    "--init-from unsupported family": ["--model", "{home}/hf/llama", "--init-from", "{home}/hf/bert"],
    "--init-from corrupt model.safetensors": ["--model", "{home}/hf/llama", "--init-from", "{home}/hf/corrupt"],
    "--data missing object/bucket": ["--data", "s3://no-such-bucket/corpus/tokens.bin"],
    "--checkpoint-url unwritable": ["--checkpoint-url", "{home}/a-file/checkpoints"],
    "--min-throughput 1e9": ["--min-throughput", "1e9"],
    "--budget-usd 0.000001": ["--budget-usd", "0.000001"],
}


def _folders(home: Path) -> None:
    """The model folders, made by transformers (tests/hf_tiny.py's configs) in a child process."""
    code = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
import transformers
from tests.hf_tiny import tiny_configs
root = {str(home / "hf")!r}
c = tiny_configs()
for name, cfg in (("llama", "llama-3-like"), ("qwen2", "qwen2"), ("corrupt", "llama-3-like")):
    transformers.AutoModelForCausalLM.from_config(c[cfg]).save_pretrained(os.path.join(root, name))
w = os.path.join(root, "corrupt", "model.safetensors")
data = open(w, "rb").read()
open(w, "wb").write(data[: len(data) * 2 // 3])
os.makedirs(os.path.join(root, "bert"))
json.dump({{"model_type": "bert", "hidden_size": 32}}, open(os.path.join(root, "bert", "config.json"), "w"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    (home / "a-file").write_text("a file where the folder would be")


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAILOR_", "AWS_", "GOOGLE_", "PREFECT_", "CLOUDSDK_"))}
    return {**env, "SAILOR_HOME": str(home / "sailor"), "PREFECT_HOME": str(home / "prefect")}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_case(args: list[str], home: Path) -> tuple[float, float, int, str]:
    """(wall s, CPU s, exit code, the line) of one command; on a shared machine the CPU seconds
    are what an idle one would take."""
    argv = [SAILOR, "train", "--budget-usd", "1", *[a.format(home=home) for a in args]]
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(argv, env=_env(home), capture_output=True, text=True, timeout=300)
    wall_s, cpu_s = time.perf_counter() - t0, _children_cpu_s() - cpu0
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return wall_s, cpu_s, done.returncode, lines[-1] if len(lines) == 1 else f"{len(lines)} lines: {done.stderr[-300:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sailor-bad-inputs-") as tmp:
        home = Path(tmp)
        _folders(home)
        for name, case in CASES.items():
            runs = [run_case(case, home) for _ in range(args.runs)]
            wall = statistics.median(r[0] for r in runs)
            rows.append({"input": name, "wall_s": round(wall, 2), "max_wall_s": round(max(r[0] for r in runs), 2),
                         "cpu_s": round(statistics.median(r[1] for r in runs), 2),
                         "exit": runs[0][2], "line": runs[0][3].replace(str(home), "$TMP")})
        left = {"job states": sorted(p.name for p in (home / "sailor" / "jobs").glob("*")),
                "prefect home": (home / "prefect").exists()}
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"rows": rows, "left_behind": left, "load_average_1m": load}, indent=2))
        return
    print(f"load average (1 min) at the end: {load:.1f} on {os.cpu_count()} CPUs")
    for r in rows:
        print(f"{r['wall_s']:6.2f} s wall (max {r['max_wall_s']:.2f}), {r['cpu_s']:.2f} s CPU  exit {r['exit']}  "
              f"{r['input']}\n        {r['line']}")
    print(f"left behind: job states {left['job states'] or 'none'}; Prefect home made: {left['prefect home']}")


if __name__ == "__main__":
    main()
