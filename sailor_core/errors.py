"""The project's own error types.

Every error a user can cause derives from ``SailorError``; the CLI prints its
message on one line and exits non-zero.  Input errors are also ``ValueError``
so plain Python callers can catch them the usual way.
"""


class SailorError(Exception):
    """Base of every error Sailor reports to a user."""

    exit_code: int = 2


class InputError(SailorError, ValueError):
    """Bad input: config, plan, profile, trace or CLI argument."""


class UnknownNameError(InputError, KeyError):
    """An unknown model, GPU type, zone or instance type."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PlanError(InputError):
    """A plan that is malformed or cannot run (layers, TP, zones)."""


class ProfileError(InputError):
    """A missing or corrupt profile."""


class InfeasibleError(SailorError):
    """No plan satisfies the request; the message says why."""

    exit_code = 3


class BudgetExceededError(SailorError):
    """Continuing would cross the budget."""

    exit_code = 4
