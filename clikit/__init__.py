"""Command-line pieces both CLIs (`agent`, `tracker`) use: options also read from
`WEIGHTSWARM_<OPTION>`, options listed under section headings in `--help`, and expected failures
printed as one line with their exit code.

A package of its own: the tracker must not import the agent, and a CLI kit is neither's.
Imports neither `agent` nor `tracker` (an import-linter contract).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
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


def env_option(*param_decls: str, section: str | None = None, **attrs: Any) -> Callable[[F], F]:
    """`click.option` whose value also comes from `WEIGHTSWARM_<OPTION>` (e.g. WEIGHTSWARM_CACHE_DIR).

    `section`: the heading it is listed under in the `--help` of a `SectionedCommand` (and in
    docs/configuration.md, which scripts/config_doc.py generates from the same declarations).
    """
    long_name = next(p for p in param_decls if p.startswith("--")).split("/")[0]  # `--x/--no-x`: X
    attrs.setdefault("envvar", "WEIGHTSWARM_" + long_name[2:].replace("-", "_").upper())
    attrs.setdefault("show_envvar", True)
    if section is not None:
        attrs.setdefault("cls", SectionOption)
        attrs["section"] = section
    return click.option(*param_decls, **attrs)


class SectionOption(click.Option):
    """A `click.Option` that names the section of `--help` it belongs to (`env_option(section=...)`)."""

    def __init__(self, param_decls: Sequence[str] | None = None, *, section: str | None = None,
                 **attrs: Any) -> None:
        super().__init__(param_decls, **attrs)
        self.section = section


def option_section(param: click.Parameter) -> str | None:
    """The section an option was declared in, or None (arguments, `--help`, plain `click.option`s)."""
    section = getattr(param, "section", None)
    return section if isinstance(section, str) else None


class SectionedCommand(click.Command):
    """A command whose `--help` lists its options under headings, one per purpose.

    click has no option groups: each option names its section (`env_option(..., section="Origin")`)
    and the command lists the sections in the order given by `sections`; options keep their order
    within a section. Options that name none (`--help`) come last, under "Options". A section that
    is not in `sections` is a mistake found when the command is built, not when someone reads help.
    """

    def __init__(self, *args: Any, sections: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = tuple(sections)
        unknown = {s for p in self.params if (s := option_section(p)) is not None} - set(self.sections)
        if unknown:
            raise ValueError(f"command {self.name!r}: options in undeclared sections {sorted(unknown)}; "
                             f"declared: {list(self.sections)}")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        grouped: dict[str | None, list[tuple[str, str]]] = {s: [] for s in self.sections}
        grouped[None] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                grouped[option_section(param)].append(record)
        # One first column for every section (click measures each list on its own), so the help
        # texts line up down the whole page; names wider than click's 30 columns get a line of their own.
        width = min(max((len(term) for rows in grouped.values() for term, _ in rows), default=0), _COL_MAX)
        for section in (*self.sections, None):
            rows = grouped[section]
            if rows:
                with formatter.section(section or "Options"):
                    formatter.write_dl([(term.ljust(width), text) for term, text in rows], col_max=_COL_MAX)


_COL_MAX = 30
"""click's default widest first column of a help list (`HelpFormatter.write_dl`)."""


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
