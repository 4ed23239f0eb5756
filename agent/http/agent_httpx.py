"""An httpx client on an agent URL, for the demo and the tests, which speak raw HTTP to a daemon's
routes. The CLI's own client (agent.http.client) uses the standard library: importing httpx takes
longer than everything else `agent fetch` imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from agent.core.sockets import SocketPath
from agent.http.client import UNIX, agent_url


def http_client(url: str, timeout: float) -> httpx.Client:
    """An httpx client for an agent URL (over the unix socket for `unix://`); never via a proxy."""
    url = agent_url(url)
    if url.startswith(UNIX):
        return _UnixClient(Path(url[len(UNIX) :]), timeout)
    return httpx.Client(base_url=url, timeout=timeout, trust_env=False)


class _UnixClient(httpx.Client):
    """An httpx client on a unix socket, which may have a path longer than `connect` takes
    (agent.core.sockets): the way to it stays open as long as the client."""

    def __init__(self, path: Path, timeout: float) -> None:
        self._socket = SocketPath(path)
        transport = httpx.HTTPTransport(uds=self._socket.address)
        super().__init__(transport=transport, base_url="http://agent", timeout=timeout, trust_env=False)

    def close(self) -> None:
        super().close()
        self._socket.close()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._socket.close()
