"""docs/configuration.md does not drift from the code: its option tables are what
scripts/config_doc.py generates from the click commands, and every option is there."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

from agent.cli.main import main as agent_main
from tracker.cli import main as tracker_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "config_doc.py"
DOC = ROOT / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def config_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_option_tables_are_what_the_script_generates(config_doc: ModuleType) -> None:
    assert config_doc.current(DOC.read_text()) == config_doc.generate(), (
        "docs/configuration.md's option tables differ from the code: run "
        ".venv/bin/python scripts/config_doc.py --write (and read the diff)"
    )


def _command_part(doc: str, usage_prefix: str) -> str:
    """The doc's text from the heading of one command to the next command's heading."""
    start = doc.index(f"## `{usage_prefix}")
    following = doc.find("\n## ", start + 1)
    return doc[start:following if following >= 0 else len(doc)]


@pytest.mark.parametrize(("group", "name", "usage"), [
    (agent_main, "serve", "agent serve "),
    (agent_main, "fetch", "agent fetch "),
    (agent_main, "wait", "agent wait "),
    (tracker_main, "serve", "tracker serve "),
])
def test_every_option_has_one_row_with_its_variable(group: click.Group, name: str, usage: str) -> None:
    part = _command_part(DOC.read_text(), usage)
    for param in group.commands[name].params:
        if not isinstance(param, click.Option):
            continue
        rows = [line for line in part.splitlines() if line.startswith(f"| `{param.opts[0]}")
                and re.match(rf"\| `{re.escape(param.opts[0])}[ `]", line)]
        assert len(rows) == 1, f"{usage}{param.opts[0]}: {len(rows)} rows"
        assert f"`{param.envvar}`" in rows[0], rows[0]


def test_the_script_finds_a_stale_doc_and_rewrites_it(config_doc: ModuleType, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "configuration.md"
    stale = DOC.read_text().replace("WEIGHTSWARM_CACHE_MAX_BYTES", "WEIGHTSWARM_CACHE_LIMIT")
    doc.write_text(stale)
    monkeypatch.setattr(config_doc, "DOC", doc)
    monkeypatch.setattr(config_doc, "ROOT", tmp_path)

    assert config_doc.main(["--check"]) == 1
    assert "-| `--cache-max-bytes BYTES` | `WEIGHTSWARM_CACHE_LIMIT`" in capsys.readouterr().out

    assert config_doc.main(["--write"]) == 0
    assert doc.read_text() == DOC.read_text()  # hand-written text kept, tables regenerated
    assert config_doc.main(["--check"]) == 0


def test_the_script_runs_as_a_command() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT / "docs")
    assert res.returncode == 0, res.stdout + res.stderr
