"""Errors a person can act on (the tracker's own; it must not import `agent`).

A `TrackerError` builds a one-line message and maps to an exit code; the CLI prints it
and exits, never a traceback. Messages never contain tokens or passkeys.
"""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_USAGE = 2


class ExpectedError(Exception):
    """An expected failure: a one-line message a person can act on, and the process exit code.

    The base of the tracker's errors and of the agent's (`agent.errors.WeightswarmError`); each
    CLI catches its own family (`tracker.clikit.error_handler`).
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TrackerError(ExpectedError):
    """Base of every expected tracker failure."""


class ConfigError(TrackerError):
    """A setting, option or secret file cannot be used."""

    exit_code = EXIT_USAGE


class StoreUnavailableError(TrackerError):
    """The store (SQLite file or Redis) cannot be reached or opened."""


class ValidationError(TrackerError):
    """A client sent something the tracker refuses (bad metainfo, unsafe manifest path, ...)."""


class ConflictError(TrackerError):
    """A write disagrees with what is already stored (e.g. a second info dict for one blob)."""
