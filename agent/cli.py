"""The `agent` command line. Every option is also read from `WEIGHTSWARM_<OPTION>`.

Commands build a `Settings` once and hand it down; expected failures print one line to
stderr and exit non-zero (see `agent.errors`), never a traceback.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from agent.errors import EXIT_FAILURE, WeightswarmError

F = TypeVar("F", bound=Callable[..., Any])


def env_option(*param_decls: str, **attrs: Any) -> Callable[[F], F]:
    """`click.option` whose value also comes from `WEIGHTSWARM_<OPTION>` (e.g. WEIGHTSWARM_CACHE_DIR)."""
    long_name = next(p for p in param_decls if p.startswith("--"))
    attrs.setdefault("envvar", "WEIGHTSWARM_" + long_name[2:].replace("-", "_").upper())
    attrs.setdefault("show_envvar", True)
    return click.option(*param_decls, **attrs)


def handle_errors(func: F) -> F:
    """Turn an expected failure into one line on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except WeightswarmError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except OSError as exc:
            # Unexpected I/O failures still get one line, not a traceback.
            click.echo(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
            sys.exit(EXIT_FAILURE)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@env_option("--log-level", default="WARNING", help="Logging level (DEBUG, INFO, WARNING, ERROR).")
def main(log_level: str) -> None:
    """weightswarm node agent: model weights into a Hugging Face hub cache, peer to peer."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
