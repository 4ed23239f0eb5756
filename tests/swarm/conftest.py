"""Fixtures of the swarm tests: libtorrent sessions closed at teardown, the relay receiver's ways."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.relay.splicing import Pipe
from agent.swarm.session import Swarm


@pytest.fixture
def swarms(tmp_path: Path) -> Iterator[list[Swarm]]:
    """Swarms a test opens through `open_swarm`; all closed at teardown."""
    opened: list[Swarm] = []
    yield opened
    for s in opened:
        s.close()


@dataclass
class ReceivePath:
    way: str
    spliced: int = 0
    """Bytes relay receivers moved from a socket into a file through a pipe."""

    def assert_taken(self) -> None:
        """The relayed bytes went the way the test asked for."""
        assert (self.spliced > 0) == (self.way == "splice"), self


@pytest.fixture(params=["splice", "buffer"])
def receive_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ReceivePath:
    """Each way an in-process relay receiver takes bytes (agent.relay.splicing), whatever file system the
    test's cache is on: through a pipe into the file, or through a buffer as on tmpfs."""
    seen = ReceivePath(str(request.param))
    drain = Pipe.drain

    def counted(pipe: Pipe, fd: int, offset: int) -> int:
        n = drain(pipe, fd, offset)
        seen.spliced += n
        return n

    monkeypatch.setattr(Pipe, "drain", counted)
    monkeypatch.setattr("agent.relay.receiver.worth_splicing", lambda _path: seen.way == "splice")
    return seen

