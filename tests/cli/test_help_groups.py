"""`agent serve --help` (and `agent fetch --help`) list their options under headings by purpose
(clikit.SectionedCommand), each option exactly once."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from agent.cli.main import main
from clikit import SectionedCommand, env_option

SERVE_HEADINGS = [
    "Cache and state", "Origin", "Tracker and swarm", "BitTorrent", "Channels and connection limits",
    "Eviction", "Publishing", "Kubernetes",
]
FETCH_HEADINGS = ["What to fetch", "Cache and state", "Origin", "Agent daemon", "Output"]

# A few options and where a reader looks for them (docs/configuration.md has the same headings).
SERVE_PLACES = {
    "--cache-dir": "Cache and state", "--origin": "Origin", "--tracker": "Tracker and swarm",
    "--relay-fanout": "Tracker and swarm", "--bt-listen": "BitTorrent", "--disk-io": "BitTorrent",
    "--api-listen": "Channels and connection limits", "--pods-socket": "Channels and connection limits",
    "--pin": "Eviction", "--cache-max-disk-percent": "Eviction", "--publish-root": "Publishing",
    "--kube": "Kubernetes", "--watch-namespace": "Kubernetes",
}

OPTION_ROW = re.compile(r"^  (?:-\w, )?(--[\w-]+)(?: / (--[\w-]+))?")
HEADING = re.compile(r"^(\S[^:]*):$")


def help_sections(args: list[str]) -> list[tuple[str | None, str]]:
    """(heading, option) for each option row of the help, in order; None before the first heading."""
    res = CliRunner().invoke(main, args, terminal_width=100)
    assert res.exit_code == 0, res.output
    rows: list[tuple[str | None, str]] = []
    heading: str | None = None
    for line in res.output.splitlines():
        if m := HEADING.match(line):
            heading = m.group(1)
        elif m := OPTION_ROW.match(line):
            rows += [(heading, name) for name in m.groups() if name]
    return rows


def expected_options(command: str) -> list[str]:
    names = ["--help"]
    for param in main.commands[command].params:
        if isinstance(param, click.Option):
            names += [*param.opts, *param.secondary_opts]
    return sorted(names)


def test_agent_serve_help_shows_each_purpose_heading_in_order_and_every_option_once() -> None:
    rows = help_sections(["serve", "--help"])
    headings = list(dict.fromkeys(h for h, _ in rows))
    assert headings == [*SERVE_HEADINGS, "Options"]
    assert sorted(name for _, name in rows) == expected_options("serve")  # each exactly once
    assert ("Options", "--help") in rows
    place = {name: heading for heading, name in rows}
    for option, heading in SERVE_PLACES.items():
        assert place[option] == heading, option


def test_agent_fetch_help_is_grouped_the_same_way() -> None:
    rows = help_sections(["fetch", "--help"])
    assert list(dict.fromkeys(h for h, _ in rows)) == [*FETCH_HEADINGS, "Options"]
    assert sorted(name for _, name in rows) == expected_options("fetch")


def test_an_option_in_a_section_the_command_does_not_declare_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="Orgin"):
        @click.command(cls=SectionedCommand, sections=("Origin",))
        @env_option("--origin", section="Orgin")
        def typo(origin: str | None) -> None:
            pass


def test_options_without_a_section_come_last_under_options() -> None:
    @click.command(cls=SectionedCommand, sections=("Origin",))
    @env_option("--verbose", is_flag=True, help="Say more.")
    @env_option("--origin", section="Origin", help="Where from.")
    def cmd(verbose: bool, origin: str | None) -> None:
        pass

    out = CliRunner().invoke(cmd, ["--help"]).output
    assert out.index("Origin:") < out.index("--origin") < out.index("Options:") < out.index("--verbose")
    assert "[env var: WEIGHTSWARM_ORIGIN]" in out  # env_option's variable, section or not
