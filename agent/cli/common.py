"""What the `agent` commands share: the error handler and the choice of daemon and origin."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import FrameType

from agent.core.errors import EXIT_INTERRUPTED, WeightswarmError
from agent.core.settings import Settings
from clikit import CommandDecorator, error_handler

handle_errors: CommandDecorator = error_handler(WeightswarmError, say_interrupted=True, os_errors=True)
"""Expected failures -> one line on stderr and their exit code; so are unexpected OSErrors."""


def with_origin(settings: Settings, origin: str | None, token: str | None) -> Settings:
    """`settings` with --origin / --token applied where given."""
    return replace(
        settings,
        origin=replace(settings.origin, endpoint=(origin or settings.origin.endpoint).rstrip("/"),
                       token=token or settings.origin.token),
    )


def choose_daemon(agent_url: str | None, explicit_local: bool) -> str | None:
    """The daemon to work through: --agent URL ('off' = none), else the local default one (its
    admin socket) if it answers and nothing says to work on a given cache directly (`explicit_local`)."""
    from agent.http.client import agent_url as normalise
    from agent.http.client import local_agent_answers

    if agent_url and agent_url.lower() in ("off", "none", "standalone"):
        return None
    if agent_url:
        return normalise(agent_url)
    default = local_agent_url()
    if not explicit_local and local_agent_answers(default):
        return default
    return None


def local_agent_url() -> str:
    """The admin socket of this machine's agent with the default state dir."""
    from agent.http.client import default_agent_url

    return default_agent_url(Settings.from_env_defaults().state_dir)


@contextlib.contextmanager
def interruptible(outcome: str) -> Iterator[list[Callable[[], None]]]:
    """Ctrl-C (SIGINT) or SIGTERM inside: run what was put in the list it yields (saving resume records),
    say "interrupted: <outcome>" and exit now (130, 143).

    Not through KeyboardInterrupt: the download threads would finish every file in flight first (the
    executor joins them at exit), tens of seconds on a slow origin, and a second Ctrl-C then went
    nowhere. Exiting at once keeps what resumes: partial blobs are written in place and their resume
    records replaced atomically (and saved once more on the way out), so any moment is a consistent one.
    huggingface_hub stops at once too (its KeyboardInterrupt) and resumes from the `.incomplete` file.
    """
    before_exit: list[Callable[[], None]] = []
    if threading.current_thread() is not threading.main_thread():
        yield before_exit  # signals reach the main thread only (in-process callers, e.g. tests in threads)
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        # A second signal while the records are saved exits at once (the default action).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            for step in before_exit:
                with contextlib.suppress(Exception):
                    step()
            sys.stdout.flush()
            os.write(2, f"\ninterrupted: {outcome}\n".encode())
        finally:
            os._exit(EXIT_INTERRUPTED if signum == signal.SIGINT else 128 + signum)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield before_exit
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
