"""The train-job flow's parameters are JobSpec's fields, with JobSpec's defaults and validation.

Prefect takes a flow's parameters from its signature: their schema (the form in the UI, the
deployment's parameters) and pydantic's type check of every run's values, which come from
the UI and the API as untrusted JSON.  ``takes_job_spec`` turns a flow body written as
``fn(spec: JobSpec, *, <run-only parameters>)`` into a function whose signature is JobSpec's
fields followed by the run-only parameters, and whose first act is ``JobSpec(**fields)``:
a JobSpec field is a flow parameter without being written here, and a bad value (or a name
not in the catalogs) fails the run before anything is rented, with the field's name.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from sailor_core.job.spec import JobSpec, SpecField, check_names, spec_fields


def _parameter(f: SpecField) -> inspect.Parameter:
    default = inspect.Parameter.empty if f.required else f.default
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type)


def _describe(f: SpecField) -> str:
    unit = f" [{f.option.unit}]" if f.option.unit else ""
    return f"    {f.name}: {f.option.help}{unit}"


def takes_job_spec(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(spec, **run_only)`` as a function of JobSpec's fields and ``fn``'s keyword parameters."""
    fields = spec_fields()
    names = frozenset(f.name for f in fields)
    run_only = list(inspect.signature(fn, eval_str=True).parameters.values())[1:]
    clash = names & {p.name for p in run_only}
    assert not clash, f"run-only parameters shadow JobSpec fields: {sorted(clash)}"

    def with_spec(**params: Any) -> Any:
        spec = JobSpec(**{k: params.pop(k) for k in names if k in params})
        check_names(spec)
        return fn(spec, **params)

    signature = inspect.Signature([_parameter(f) for f in fields] + run_only,
                                  return_annotation=inspect.signature(fn, eval_str=True).return_annotation)
    doc = inspect.getdoc(fn) or ""
    # Prefect shows each parameter's line of the "Args:" section next to it in the UI.
    doc += ("\n" if "\nArgs:" in doc else "\n\nArgs:\n") + "\n".join(_describe(f) for f in fields)
    with_spec.__name__, with_spec.__qualname__, with_spec.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    with_spec.__doc__ = doc
    with_spec.__signature__ = signature  # type: ignore[attr-defined]
    with_spec.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return with_spec


def spec_parameters(spec: JobSpec) -> dict[str, Any]:
    """``spec`` as the flow's parameters (JSON-ready: tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in
            ((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec))}
