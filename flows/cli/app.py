"""The ``sailor`` command line.

Kept light on purpose: this module imports only Typer; every command imports
what it needs inside its body, so ``sailor plan`` never loads Prefect or torch.
Each group of commands lives in its own ``cli_*`` module with a ``register``.
"""

from __future__ import annotations

import importlib
import sys

import typer

from flows.cli import help_format
from sailor_core.errors import SailorError

app = typer.Typer(
    name="sailor",
    help="Plan and run LLM training over heterogeneous, multi-zone spot GPUs within a budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules that add commands to ``app``; one per area so they stay small.
_COMMAND_MODULES = (
    "flows.cli.core",
    "flows.cli.profiles",
    "flows.cli.profiling",
    "flows.cli.plan",
    "flows.cli.cloud",
    "flows.cli.doctor",
    "flows.cli.engine",
    "flows.cli.data",
    "flows.cli.train",
    "flows.cli.stop",
    "flows.cli.logs",
    "flows.cli.deploy",
    "flows.cli.replay",
    "flows.cli.export",
)


_registered: list[str] = []


def _register_all() -> None:
    """Once per process: the tests call ``main`` many times in one, and each register would add
    its commands to ``app`` again (Typer then builds every copy on each call)."""
    if _registered:
        return
    help_format.install()
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that area is not built yet
                continue
            raise
        module.register(app)
        _registered.append(name)


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the app and turns Sailor's errors into one-line messages."""
    _register_all()
    try:
        app(args=argv, standalone_mode=True)
    except SailorError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    except Exception as exc:  # a bug, not bad input: still one line unless debugging
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core import settings

        if settings.debug():
            raise
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        sys.stderr.write(
            f"error: internal error ({type(exc).__name__}: {detail}); "
            "set SAILOR_DEBUG=1 for the traceback\n"
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
