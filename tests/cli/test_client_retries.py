"""A follower of a daemon job (`agent fetch` through the agent, `agent wait`) asks for the job's status
again when a connection breaks before the answer: the job runs on in the daemon, so one dropped poll
must not fail the fetch. An agent that never answers is still an error, soon."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agent.core.errors import DaemonError
from agent.http.client import AgentClient

STATUS = {"job_id": "j1", "phase": "Downloading"}


def serve(listener: socket.socket, drops: int, served: list[str], stop: threading.Event) -> None:
    """Accept connections: close the first `drops` once their request is in, answer the rest."""
    listener.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            request = conn.recv(65536)
            if not request:
                continue
            if len(served) < drops:
                served.append("dropped")
                continue  # closed without a word, as a busy agent dropped one
            served.append("answered")
            body = json.dumps(STATUS).encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (len(body), body)
            )


@pytest.fixture
def agent_dropping(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    served: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(listener, request.param, served, stop), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", served
    stop.set()
    thread.join(5)
    listener.close()


@pytest.mark.parametrize("agent_dropping", [2], indirect=True)
def test_a_poll_whose_connection_breaks_is_asked_again(agent_dropping):
    url, served = agent_dropping
    assert AgentClient(url).job("j1") == STATUS
    assert served == ["dropped", "dropped", "answered"]


@pytest.mark.parametrize("agent_dropping", [100], indirect=True)
def test_an_agent_that_never_answers_is_an_error_within_seconds(agent_dropping):
    url, served = agent_dropping
    started = time.monotonic()
    with pytest.raises(DaemonError, match="cannot be reached"):
        AgentClient(url).job("j1")
    assert len(served) == 4 and time.monotonic() - started < 5
