"""The exit codes the README, `agent fetch --help` and `agent wait --help` list are exactly those of
agent.core.errors (its `EXIT_*` constants, 0 for success), each with its meaning: a code added, renumbered
or dropped there and not in the docs (or the other way round) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import agent.core.errors as errors
from agent.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"
MEANING = {
    "EXIT_FAILURE": ("other failure",),
    "EXIT_USAGE": ("usage",),
    "EXIT_NOT_FOUND": ("not found",),
    "EXIT_AUTH": ("refused",),
    "EXIT_DISK": ("disk full",),
    "EXIT_INTEGRITY": ("bad content",),
    "EXIT_TIMEOUT": ("timed out", "stopped"),
    "EXIT_ORIGIN": ("origin unreachable",),
    "EXIT_AGENT": ("agent",),
    "EXIT_INTERRUPTED": ("interrupted (143 on SIGTERM)",),
}
"""What each code means, in agent.core.errors' words (its docstrings and class names)."""


def listed(text: str, start: str) -> dict[int, str]:
    """{code: meaning} of the list that begins after `start` and ends at "SIGTERM)"."""
    text = " ".join(text.split())
    found = re.search(re.escape(start) + r"(.*?SIGTERM\))", text)
    assert found, f"no exit code list after {start!r}"
    codes = {}
    for match in re.finditer(r"(\d+) (.+?)(?=, \d+ |$)", found.group(1).strip()):
        assert int(match.group(1)) not in codes, match.group(0)
        codes[int(match.group(1))] = match.group(2)
    return codes


def help_of(command: str) -> str:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_module_names_every_code_meant_here():
    constants = {name for name in vars(errors) if name.startswith("EXIT_")}
    assert constants == set(MEANING), constants ^ set(MEANING)


@pytest.mark.parametrize("where", ["README", "fetch", "wait"])
def test_every_exit_code_is_listed_with_its_meaning_and_no_other(where):
    if where == "README":
        codes = listed(README.read_text(), "print one line and exit non-zero:")
    else:
        codes = listed(help_of(where), "Exit codes: 0 ")
    codes.pop(0, None)  # success: "verified" / "complete"
    want = {getattr(errors, name): name for name in MEANING}
    assert set(codes) == set(want), f"{where} lists {sorted(codes)}, agent.core.errors has {sorted(want)}"
    for code, text in codes.items():
        assert any(word in text for word in MEANING[want[code]]), (where, code, text)
