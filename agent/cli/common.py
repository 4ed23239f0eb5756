"""What the `agent` commands share: the error handler and the choice of daemon and origin."""

from __future__ import annotations

from dataclasses import replace

from agent.core.errors import WeightswarmError
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
