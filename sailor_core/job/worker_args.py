"""The job options that reach the engine's workers, as worker flags and back.

A JobSpec field whose ``Option`` says ``worker=True`` (``sailor_core/job/spec.py``) reaches every
worker: the flow writes it on the worker's command line under its ``sailor train`` flag
(``worker_argv``), the worker's parser takes that flag (``add_worker_arguments``) and hands
the value, under the field's name, to its ``Recipe`` (``sailor_core/runtime/recipe.py``).
Generic over the fields: a new such option needs nothing here.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from typing import Any

from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpecError, SpecField, spec_field, worker_fields


def worker_argv(values: Any) -> list[str]:
    """Every worker option of ``values`` (a JobSpec, a Recipe: attributes named as the fields) as
    ``[flag, text, ...]``; a None is its field's default, left out."""
    argv: list[str] = []
    for f in worker_fields():
        value = getattr(values, f.name)
        if value is None:
            assert f.default is None, f"{f.name}: None must be the default of a worker option"
            continue
        argv += [f.cli_name, _text(value)]
    return argv


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's flags of the options, each read into the field's name, with JobSpec's default."""
    for f in worker_fields():
        parser.add_argument(f.cli_name, dest=f.name, type=_parser(f), default=f.default,
                            help=f.option.help.replace("%", "%%"))


def worker_values(source: Any) -> dict[str, Any]:
    """The worker options' values of ``source`` (parsed arguments, a JobSpec), by field name."""
    return {f.name: getattr(source, f.name) for f in worker_fields()}


def as_flag_error(exc: JobSpecError) -> InputError:
    """A bad option's error as the workers' command line names it (``--lr must be positive``)."""
    return InputError(f"{spec_field(exc.field).cli_name} {exc.problem}")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)  # repr: the float exactly


def _parser(f: SpecField) -> Callable[[str], Any]:
    kind = f.type
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is tuple:
        item = _scalar(typing.get_args(kind)[0])
        return lambda text: tuple(item(x) for x in text.split(",") if x)
    return _scalar(kind)


def _scalar(kind: type) -> Callable[[str], Any]:
    return _bool if kind is bool else kind


def _bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(f"{text!r} is not true or false")  # argparse reports it as the flag's bad value
    return text == "true"
