"""Every option's environment variable is a name a shell and a ConfigMap can hold (`WEIGHTSWARM_<OPTION>`),
the `--x/--no-x` flags included."""

from __future__ import annotations

import re

import click

from agent.cli.main import main as agent_main
from tracker.cli import main as tracker_main

_NAME = re.compile(r"^WEIGHTSWARM_[A-Z0-9_]+$")


def _options(group: click.Group) -> list[click.Option]:
    out = [p for p in group.params if isinstance(p, click.Option)]
    for command in group.commands.values():
        out += [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]
    return out


def test_every_environment_variable_is_a_portable_name():
    for group in (agent_main, tracker_main):
        for option in _options(group):
            if option.envvar is None:
                continue
            assert _NAME.match(str(option.envvar)), (option.opts, option.envvar)


def test_a_boolean_flag_is_read_from_its_variable(monkeypatch):
    """`--no-peer-gate` as a ConfigMap sets it: WEIGHTSWARM_PEER_GATE=false."""
    serve = agent_main.commands["serve"]
    peer_gate = next(p for p in serve.params if p.name == "peer_gate")
    ctx = click.Context(serve)
    monkeypatch.setenv("WEIGHTSWARM_PEER_GATE", "false")
    assert peer_gate.process_value(ctx, peer_gate.value_from_envvar(ctx)) is False
    monkeypatch.setenv("WEIGHTSWARM_PEER_GATE", "true")
    assert peer_gate.process_value(ctx, peer_gate.value_from_envvar(ctx)) is True
