"""Command-line pieces both CLIs (`agent`, `tracker`) use: options also read from
`WEIGHTSWARM_<OPTION>`, and expected failures printed as one line with their exit code.

A package of its own: the tracker must not import the agent, and a CLI kit is neither's.
Imports neither `agent` nor `tracker` (an import-linter contract).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import click

EXIT_FAILURE = 1
EXIT_USAGE = 2


class ExpectedError(Exception):
    """An expected failure: a one-line message a person can act on, and the process exit code.

    The base of the tracker's errors (`tracker.errors.TrackerError`) and of the agent's
    (`agent.core.errors.WeightswarmError`); each CLI catches its own family (`error_handler`).
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


F = TypeVar("F", bound=Callable[..., Any])


class CommandDecorator(Protocol):
    """Wraps a command and keeps its signature (what `error_handler` returns)."""

    def __call__(self, func: F, /) -> F: ...


def env_option(*param_decls: str, **attrs: Any) -> Callable[[F], F]:
    """`click.option` whose value also comes from `WEIGHTSWARM_<OPTION>` (e.g. WEIGHTSWARM_CACHE_DIR)."""
    long_name = next(p for p in param_decls if p.startswith("--"))
    attrs.setdefault("envvar", "WEIGHTSWARM_" + long_name[2:].replace("-", "_").upper())
    attrs.setdefault("show_envvar", True)
    return click.option(*param_decls, **attrs)


def error_handler(
    expected: type[ExpectedError], *, say_interrupted: bool = False, os_errors: bool = False
) -> CommandDecorator:
    """A decorator for commands: an `expected` failure becomes one line on stderr and its exit code.

    `say_interrupted` prints "interrupted" on Ctrl-C (exit 130 either way); `os_errors` also turns
    an unexpected OSError into one line (exit 1) instead of a traceback.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except expected as exc:
                click.echo(f"error: {exc}", err=True)
                sys.exit(exc.exit_code)
            except KeyboardInterrupt:
                if say_interrupted:
                    click.echo("interrupted", err=True)
                sys.exit(130)
            except OSError as exc:
                if not os_errors:
                    raise
                click.echo(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
                sys.exit(EXIT_FAILURE)

        return wrapper  # type: ignore[return-value]

    return decorate
