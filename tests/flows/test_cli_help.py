"""Every `sailor` command's --help keeps its option names and metavars whole at any terminal width
(flows/cli/help_format.py): only the help text wraps."""

from __future__ import annotations

import re

import pytest
import typer
from flows.cli import app as cli_app


def _commands():
    """(the command's words, the command) for the root, every group and every command."""
    cli_app._register_all()

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(cli_app.app), []))


def _whole(word: str, text: str) -> bool:
    """``word`` in ``text`` as a word of its own, not the start of a longer name nor cut."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize("columns", [200, 80, 60])
def test_every_help_keeps_its_names_whole(sailor_cli, monkeypatch, columns):
    commands = _commands()
    assert len(commands) > 20  # the walk found the groups' commands, not only the root
    monkeypatch.setenv("COLUMNS", str(columns))
    for path, command in commands:
        res = sailor_cli(*path, "--help")
        where = f"sailor {' '.join(path)} --help at {columns} columns"
        assert res.returncode == 0, where
        assert "…" not in res.stdout, f"{where} cut something:\n{res.stdout}"
        assert max(len(line) for line in res.stdout.splitlines()) <= columns, where
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            if isinstance(param, typer.core.TyperArgument):
                assert _whole(param.display_name_raw, res.stdout), f"{where}: {param.display_name_raw}"
                continue
            for name in (*param.opts, *param.secondary_opts):
                assert _whole(name, res.stdout), f"{where}: {name} not whole:\n{res.stdout}"
            if isinstance(param.metavar, str):
                assert _whole(param.metavar, res.stdout), f"{where}: metavar {param.metavar}"


def test_a_terminal_too_narrow_for_the_help_beside_the_names_puts_it_under_them(sailor_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    out = sailor_cli("replay", "--help").stdout
    assert "…" not in out and _whole("--no-standby-workers", out) and _whole("--checkpoint-interval-s", out)
    # the help of --trace wraps on its own lines, indented under the name
    trace = out.splitlines().index(next(line for line in out.splitlines() if "--trace" in line))
    assert out.splitlines()[trace + 1].strip("│ ").startswith("Sailor GPU-trace")
