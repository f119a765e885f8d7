"""Shared pieces of the command line: output in JSON or Rich, one-line errors."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import typer


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(data), indent=2) + "\n")


def console():
    """Rich output.  Piped or redirected (no terminal to measure), Rich would assume 80
    columns and cut the wide tables' headers and figures to "…": use 160 unless COLUMNS says."""
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=160)


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print ``error: message`` on one line to stderr and return the Exit to raise."""
    first_line = str(message).strip().splitlines()[0] if str(message).strip() else "failed"
    sys.stderr.write(f"error: {first_line}\n")
    return typer.Exit(code)


def parse_layers(text: str | None) -> tuple[int, int] | None:
    """``A:B`` -> (A, B), half-open."""
    if text is None:
        return None
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise fail(f"--layers must look like START:END (half-open), got {text!r}") from None
    if a < 0 or b <= a:
        raise fail(f"--layers {text!r} is empty or negative")
    return a, b
