"""The daemon's listening sockets and the uvicorn servers on them.

One server per channel (docs/security.md): the admin unix socket (mode 0600), the pods' unix
socket (mode 0666, reachable by whoever can mount its directory) and the network listener.
The daemon binds each socket itself, so a unix socket has its final mode before anyone can
connect (bound under a random name, chmod-ed, then renamed into place) and a TCP port is known
as soon as the daemon is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import secrets
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from agent.core.errors import ConfigError
from agent.core.settings import Settings
from agent.core.sockets import SocketPath
from servekit.limits import PROBE_LIMITS, ConnectionLimits, Gate, raise_open_file_limit
from servekit.protocol import ProbePort, uvicorn_options
from servekit.server import BindError, QuietServer, bind_tcp

log = logging.getLogger(__name__)

_BACKLOG = 128
_FEWEST_NETWORK_CONNECTIONS = 16
"""Below this the network listener is not worth running: the open-file limit is too low."""


def split_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def tcp_listener(listen: str, what: str) -> socket.socket:
    host, port = split_hostport(listen, what)
    try:
        return bind_tcp(host, port, _BACKLOG, f"{what} {listen}")
    except BindError as exc:
        raise ConfigError(str(exc)) from None


def unix_listener(path: Path, mode: int, what: str) -> socket.socket:
    """A listening unix socket at `path` with permissions `mode` from the first moment it is visible."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the directory of {what} {path}: {exc.strerror}") from None
    _clear_stale(path, what)
    staging = path.with_name(f".{secrets.token_hex(6)}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with SocketPath(staging) as where:
            sock.bind(where.address)
        os.chmod(staging, mode)
        sock.listen(_BACKLOG)
        os.replace(staging, path)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            staging.unlink()
        raise ConfigError(f"cannot listen on {what} {path}: {exc.strerror or exc}") from None
    return sock


def _clear_stale(path: Path, what: str) -> None:
    """Remove a socket file left by a dead agent; refuse when a live one answers or it is not a socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{what} {path} exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with SocketPath(path) as where:
            probe.connect(where.address)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConfigError(f"cannot tell whether {what} {path} is in use: {exc.strerror}") from None
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise ConfigError(f"another agent serves on {what} {path}; stop it first")


def listener_limits(settings: Settings) -> tuple[ConnectionLimits, ConnectionLimits]:
    """The network listener's limits and each unix socket's, within the open-file limit (raised to its
    hard limit here) less the reserve for the agent's own work (`DaemonSettings.fd_reserve`)."""
    d, s = settings.daemon, settings.swarm
    reserve = d.fd_reserve
    if reserve is None:
        origin = settings.fetch.files_at_once * settings.fetch.connections_per_file
        reserve = s.connections_limit + s.file_pool_size + origin + 256
    soft = raise_open_file_limit()
    network = d.api_limits
    local = dataclasses.replace(network, max_connections=d.local_max_connections, max_per_client=None)
    sockets = 2 if d.pods_socket is not None else 1
    probes = PROBE_LIMITS.max_connections if d.probe_listen is not None else 0
    room = soft - reserve - sockets * local.max_connections - probes
    if room < _FEWEST_NETWORK_CONNECTIONS:
        raise ConfigError(
            f"the open-file limit ({soft}) less the reserve for the agent's own work ({reserve}) and "
            f"its unix sockets ({sockets} x {local.max_connections}) leaves {room} connections for "
            "--api-listen; raise the limit (ulimit -n, the container's nofile) or lower --fd-reserve"
        )
    if room < network.max_connections:
        log.warning(
            "--api-listen holds at most %d connections, not %d: the open-file limit is %d and %d are "
            "kept for the agent's own work",
            room,
            network.max_connections,
            soft,
            reserve,
        )
        network = dataclasses.replace(network, max_connections=room)
    return network, local


class ApiServer:
    """uvicorn on one bound socket, in a thread, so the daemon owns the process's signals and its
    shutdown order; its connections are under `limits` (servekit). `probe_sock`: a TCP socket of the
    same server that answers only the probes, under `PROBE_LIMITS` (servekit.protocol.ProbePort)."""

    def __init__(
        self, app: Any, sock: socket.socket, where: str, limits: ConnectionLimits,
        probe_sock: socket.socket | None = None,
    ) -> None:
        self.gate = Gate(limits, where)
        probe = None
        if probe_sock is not None:
            probe = ProbePort(int(probe_sock.getsockname()[1]), Gate(PROBE_LIMITS, f"{where} probes"))
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            # zerocopy: the relay sends blobs from their files
            **uvicorn_options(self.gate, zerocopy=True, probe=probe),
        )
        self.probe = probe
        self.server = QuietServer(config)
        self.where = where
        self._sock = sock
        self._sockets = [sock] if probe_sock is None else [sock, probe_sock]
        self._thread = threading.Thread(target=self._serve, name=f"api {where}", daemon=True)
        self._failed: BaseException | None = None

    def _serve(self) -> None:
        try:
            self.server.run(sockets=self._sockets)
        except BaseException as exc:  # uvicorn exits the thread with SystemExit on a fatal error
            self._failed = exc

    @property
    def port(self) -> int:
        """The TCP port (a network listener)."""
        return int(self._sock.getsockname()[1])

    def start(self, timeout: float) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"cannot serve the agent API on {self.where}: {self._failed!r}")
            time.sleep(0.02)

    def stop(self, timeout: float) -> None:
        self.server.exit_now()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("API server on %s did not stop within %.0fs", self.where, timeout)
        for sock in self._sockets:
            sock.close()
        if self._sock.family == socket.AF_UNIX:
            with contextlib.suppress(OSError):
                os.unlink(self.where)
