"""A flow's parameters are a spec's fields, with the spec's defaults and validation.

Prefect takes a flow's parameters from its signature: their schema (the form in the UI, the
deployment's parameters) and pydantic's type check of every run's values, which come from
the UI and the API as untrusted JSON.  ``takes_spec(SpecType)`` turns a flow body written as
``fn(spec: SpecType, *, <run-only parameters>)`` into a function whose signature is the spec's
fields followed by the run-only parameters, and whose first act is ``SpecType(**fields)``:
a spec field is a flow parameter without being written here, and a bad value (or, with
``check``, a name not in the catalogs) fails the run before anything is rented, with the
field's name.  The train-job flow takes JobSpec's fields, the plan flow PlanTerms', the
replay flow ReplaySpec's, the network-profile flow NetworkProfileSpec's.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from sailor_core.specs.fields import SpecField, spec_fields


def _parameter(f: SpecField) -> inspect.Parameter:
    default = inspect.Parameter.empty if f.required else f.default
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type)


def _describe(f: SpecField) -> str:
    unit = f" [{f.option.unit}]" if f.option.unit else ""
    return f"    {f.name}: {f.option.help}{unit}"


def takes_spec(spec_type: type, *, check: Callable[[Any], None] | None = None
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``fn(spec, **run_only)`` as a function of ``spec_type``'s fields and ``fn``'s keyword parameters."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fields = spec_fields(spec_type)
        names = frozenset(f.name for f in fields)
        run_only = list(inspect.signature(fn, eval_str=True).parameters.values())[1:]
        clash = names & {p.name for p in run_only}
        assert not clash, f"run-only parameters shadow {spec_type.__name__} fields: {sorted(clash)}"

        def with_spec(**params: Any) -> Any:
            spec = spec_type(**{k: params.pop(k) for k in names if k in params})
            if check is not None:
                check(spec)
            return fn(spec, **params)

        signature = inspect.Signature([_parameter(f) for f in fields] + run_only,
                                      return_annotation=inspect.signature(fn, eval_str=True).return_annotation)
        doc = inspect.getdoc(fn) or ""
        # Prefect shows each parameter's line of the "Args:" section next to it in the UI.
        doc += ("\n" if "\nArgs:" in doc else "\n\nArgs:\n") + "\n".join(_describe(f) for f in fields)
        with_spec.__name__, with_spec.__qualname__ = fn.__name__, fn.__qualname__
        with_spec.__module__, with_spec.__doc__ = fn.__module__, doc
        with_spec.__signature__ = signature  # type: ignore[attr-defined]
        with_spec.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return with_spec

    return decorate


def spec_parameters(spec: Any) -> dict[str, Any]:
    """``spec`` as the flow's parameters (JSON-ready: tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in
            ((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec))}
