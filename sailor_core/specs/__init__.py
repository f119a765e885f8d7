"""Settings declared once, as typed specs: each user-facing setting is one dataclass field.

``fields.py`` holds the machinery every spec uses (``option``: a field's default, help, unit and
spellings; ``spec_fields``: a spec's fields as the front ends see them).  The command lines
(``flows/cli/spec_options.py``) and the flows' parameters (``flows/spec_parameters.py``) are
generated from a spec's fields, so a new setting is one new field.  The job's spec lives with the
job (``sailor_core/job/spec.py``); ``plan.py``, ``replay.py``, ``profile.py`` and ``memory.py`` hold ``sailor
plan``'s, ``sailor replay``'s, ``sailor profile``'s (and ``profile network``'s) and ``sailor memory``'s.  Plain dataclasses only: the CLI reads these modules at start-up.
"""
