"""A command's options generated from a spec's fields (``sailor_core/specs/fields.py``).

``with_spec_options(SpecType, panel=...)`` turns a command written as
``fn(spec: SpecType, *, <run-only options>)`` into a Typer command whose options are one per
field of the spec (name, help, default and hidden aliases from the field's ``Option``), then
the run-only ones; it builds the spec before calling ``fn``, so bad values stop the command
with one ``error:`` line naming the option, before anything starts.  Lists (``--gpus``,
``--preempt-at``) are comma-separated.  ``sailor train`` (JobSpec), ``sailor plan``
(PlanSpec), ``sailor replay`` (ReplaySpec), ``sailor profile`` (ProfileSpec) and ``sailor
profile network`` (NetworkProfileSpec) are made this way.
"""

from __future__ import annotations

import copy
import enum
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Optional

import typer

from sailor_core.errors import InputError
from sailor_core.specs.fields import SpecError, SpecField, spec_fields

RUN_PANEL = "Run"


def _value_type(f: SpecField) -> Any:
    """The field's type without ``None`` (``float | None`` -> float), a name (an Enum of names such as
    the objective) as text: the spec parses it, and a bad one gets the spec's line naming the known ones."""
    inner = f.type
    if isinstance(f.type, types.UnionType) or typing.get_origin(f.type) is typing.Union:
        (inner,) = [a for a in typing.get_args(f.type) if a is not type(None)]
    return str if isinstance(inner, type) and issubclass(inner, enum.Enum) else inner


def _is_list(f: SpecField) -> bool:
    return typing.get_origin(_value_type(f)) is tuple


def _cli_type(f: SpecField) -> Any:
    if f.option.parse is not None:
        return str if f.required else Optional[str]
    if _is_list(f):
        return Optional[str]
    inner = _value_type(f)
    return inner if inner is f.type else Optional[inner]


def _alias_name(f: SpecField, i: int) -> str:
    return f"{f.name}__alias{i}"


def _off_alias_name(f: SpecField, i: int) -> str:
    return f"{f.name}__off{i}"


def _cli_default(f: SpecField, required: bool = True) -> Any:
    """What the command line takes when the option is not given: a list's default as its text ("1");
    a required field's is None where the command may not need it (``continues``)."""
    if f.required:
        return ... if required else None
    if _is_list(f):
        return ",".join(str(x) for x in f.default) or None
    return f.default


def _options(f: SpecField, panel: str | None, *, required: bool = True) -> list[inspect.Parameter]:
    default = _cli_default(f, required)
    show_default = default not in (None, "", ...)
    metavar = f.option.unit.upper() if f.option.unit and not _is_list(f) else None
    help = f.option.help + (", comma-separated" if _is_list(f) and f.option.parse is None else "")  # a parse's help says its syntax
    option = typer.Option(default, *f.cli_names, help=help, metavar=metavar, show_default=show_default,
                          rich_help_panel=panel)
    params = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=_cli_type(f), default=option)]
    for i, alias in enumerate(f.option.aliases):
        params.append(inspect.Parameter(_alias_name(f, i), inspect.Parameter.KEYWORD_ONLY,
                                        annotation=Optional[_value_type(f)] if not _is_list(f) else Optional[str],
                                        default=typer.Option(None, alias, hidden=True)))
    for i, alias in enumerate(f.option.off_aliases):
        params.append(inspect.Parameter(_off_alias_name(f, i), inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                        default=typer.Option(False, alias, hidden=True)))
    return params


def _from_cli(f: SpecField, text: str | None, spelled: str) -> tuple:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if typing.get_args(_value_type(f))[0] is not int:
        return tuple(items)
    out = []
    for item in items:
        try:
            out.append(int(item))
        except ValueError:
            raise InputError(f"{spelled} takes comma-separated {f.option.unit or 'numbers'} like 5,12; "
                             f"{item!r} is not a whole number") from None
    return tuple(out)


def spec_from_options(spec_type: type, options: dict[str, Any], check: Callable[[Any], None] | None = None) -> Any:
    """Take the spec's options out of ``options`` (a command's arguments) and build the spec, then
    ``check`` it (JobSpec: its names against the catalogs); a bad value is one error naming its option."""
    values, spelled = _values_from_options(spec_type, options)
    return _build(spec_type, values, spelled, check)


def _build(spec_type: type, values: dict[str, Any], spelled: dict[str, str], check) -> Any:
    try:
        spec = spec_type(**values)
        if check is not None:
            check(spec)
        return spec
    except SpecError as exc:
        raise InputError(f"{spelled.get(exc.field, exc.field)} {exc.problem}") from None


_CTX = "sailor_typer_context"  # the command's Typer context, asked which options the command line gave


def _given(spec_type: type, ctx: typer.Context | None) -> set[str]:
    """The spec's fields whose option (or an alias of it) this command line gave."""
    if ctx is None:
        return set()
    given = set()
    for f in spec_fields(spec_type):
        names = [f.name, *(_alias_name(f, i) for i in range(len(f.option.aliases))),
                 *(_off_alias_name(f, i) for i in range(len(f.option.off_aliases)))]
        sources = [ctx.get_parameter_source(n) for n in names]
        if any(src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT") for src in sources):
            given.add(f.name)
    return given


def _values_from_options(spec_type: type, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The spec's values taken out of ``options``, and how each was spelled on the command line."""
    values, spelled = {}, {}
    for f in spec_fields(spec_type):
        value, spelled[f.name] = options.pop(f.name), f.cli_name
        for i, alias in enumerate(f.option.aliases):
            alias_value = options.pop(_alias_name(f, i))
            if alias_value is not None:
                value, spelled[f.name] = alias_value, alias
        for i, alias in enumerate(f.option.off_aliases):
            if options.pop(_off_alias_name(f, i)):
                value, spelled[f.name] = False, alias
        if f.option.parse is not None and value is not None:
            try:
                values[f.name] = f.option.parse(value)
            except ValueError as exc:
                raise InputError(f"{spelled[f.name]} {exc}") from None
        else:
            values[f.name] = _from_cli(f, value, spelled[f.name]) if _is_list(f) else value
    return values, spelled


def _in_run_panel(p: inspect.Parameter) -> inspect.Parameter:
    """Under its own heading in --help, apart from the spec's options."""
    if not isinstance(p.default, typer.models.OptionInfo) or p.default.rich_help_panel is not None:
        return p
    info = copy.copy(p.default)
    info.rich_help_panel = RUN_PANEL
    return p.replace(default=info)


Continues = Callable[[dict[str, Any], dict[str, Any], dict[str, str]], Any]


def with_spec_options(spec_type: type, *, panel: str | None = None, check: Callable[[Any], None] | None = None,
                      continues: Continues | None = None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``fn(spec, **run_only)`` as a Typer command taking ``spec_type``'s options and ``fn``'s own;
    with a ``panel``, --help shows the spec's options under that heading and the run-only ones under "Run".

    ``continues(run_only, given, spelled)``: the spec of something the command continues (``sailor
    train --job-id`` of a job that exists), built from its recorded spec and the spec options given
    on the command line (``given``: their values; ``spelled``: as typed), or None for a new one.  With
    it, a required field is optional on the command line (a continued job has it already)."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        run_only = list(inspect.signature(fn, eval_str=True).parameters.values())[1:]
        params = [p for f in spec_fields(spec_type) for p in _options(f, panel, required=continues is None)]
        clash = {p.name for p in params} & {p.name for p in run_only}
        assert not clash, f"run-only options shadow {spec_type.__name__} fields: {sorted(clash)}"

        def command(**options: Any) -> None:
            given = _given(spec_type, options.pop(_CTX, None))
            values, spelled = _values_from_options(spec_type, options)
            spec = continues({p.name: options[p.name] for p in run_only}, {k: values[k] for k in given},
                             spelled) if continues is not None else None
            if spec is None:
                missing = [spelled[f.name] for f in spec_fields(spec_type) if f.required and values[f.name] is None]
                if missing:
                    raise InputError(f"{missing[0]} is required")
                spec = _build(spec_type, values, spelled, check)
            fn(spec, **options)

        context = ([inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
                   if continues is not None else [])
        signature = inspect.Signature(params + [_in_run_panel(p) if panel else p for p in run_only] + context)
        command.__name__, command.__doc__ = fn.__name__, fn.__doc__
        command.__signature__ = signature  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return command

    return decorate
