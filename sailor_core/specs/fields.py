"""A spec's fields as users see them: ``option`` declares one, ``spec_fields`` lists them."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sailor_core.errors import InputError

OPTION = "option"  # the metadata key of a field's Option


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """How a spec's field is offered to users (the CLI, a flow's parameters in the Prefect UI)."""

    help: str
    unit: str = ""  # of the value, as users write it: "USD", "steps", "samples/s"
    cli: tuple[str, ...] = ()  # names on the command line; empty: --the-field-name
    aliases: tuple[str, ...] = ()  # older or sibling-command spellings, accepted and hidden from --help
    off_aliases: tuple[str, ...] = ()  # of a yes/no field: older hidden flags that mean "no" (--on-demand)
    parse: Callable[[str], Any] | None = None  # reads the command line's text ("20B"); ValueError says why not
    worker: bool = False  # a JobSpec option that reaches the engine's workers (their flags, their Recipe)


def option(default: Any = dataclasses.MISSING, *, help: str, unit: str = "", cli: tuple[str, ...] = (),
           aliases: tuple[str, ...] = (), off_aliases: tuple[str, ...] = (),
           parse: Callable[[str], Any] | None = None, worker: bool = False) -> Any:
    """A spec's field with its user-facing description."""
    return dataclasses.field(default=default, metadata={OPTION: Option(
        help=help, unit=unit, cli=cli, aliases=aliases, off_aliases=off_aliases, parse=parse, worker=worker)})


class SpecError(InputError):
    """A bad value of one spec field; ``field`` names it, so each front end can say it its own way
    (``--budget-usd`` on the command line, ``budget_usd`` as a flow parameter)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem

    def __reduce__(self):  # picklable with its two arguments (Prefect ships exceptions between processes)
        return (type(self), (self.field, self.problem))


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecField:
    """One spec field as a front end sees it."""

    name: str
    type: Any  # resolved annotation, e.g. ``float | None``, ``tuple[str, ...]``
    default: Any  # dataclasses.MISSING when the user must give it
    option: Option

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def cli_names(self) -> tuple[str, ...]:
        return self.option.cli or ("--" + self.name.replace("_", "-"),)

    @property
    def cli_name(self) -> str:
        """The long option, as errors name it (``--spot`` of ``--spot/--no-spot``)."""
        return self.cli_names[0].split("/")[0]


@functools.cache
def spec_fields(spec_type: type) -> tuple[SpecField, ...]:
    """The fields of ``spec_type`` (a dataclass declared with ``option``), in declaration order,
    with their types resolved."""
    hints = typing.get_type_hints(spec_type)
    return tuple(SpecField(name=f.name, type=hints[f.name], default=f.default, option=f.metadata[OPTION])
                 for f in dataclasses.fields(spec_type))


def positive(name: str, value: float | None, *, optional: bool = False) -> None:
    """SpecError on ``name`` unless ``value`` is above 0 (or None, when ``optional``)."""
    if value is None and optional:
        return
    if value is None or not value > 0:  # NaN too
        raise SpecError(name, f"must be positive, got {value}")


def at_least(name: str, value: int | float | None, least: int | float, *, optional: bool = False) -> None:
    """SpecError on ``name`` unless ``value`` is at least ``least`` (or None, when ``optional``)."""
    if value is None and optional:
        return
    if value is None or not value >= least:  # NaN too
        raise SpecError(name, f"must be at least {least}, got {value}")
