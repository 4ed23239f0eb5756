"""Fixtures of the tests against real libtorrent sessions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.swarm.session import Swarm


@pytest.fixture
def swarms(tmp_path: Path) -> Iterator[list[Swarm]]:
    """Swarms a test opens through `open_swarm`; all closed at teardown."""
    opened: list[Swarm] = []
    yield opened
    for s in opened:
        s.close()
