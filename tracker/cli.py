"""The `tracker` command line. Every option is also read from `WEIGHTSWARM_<OPTION>`.

Expected failures (unreadable token file, bad Redis URL, store down) print one line to
stderr and exit non-zero, never a traceback.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import click

from clikit import CommandDecorator, env_option, error_handler
from tracker.errors import ConfigError, TrackerError
from tracker.settings import TrackerSettings, read_secret_file

if TYPE_CHECKING:
    from tracker.app import TrackerApp

handle_errors: CommandDecorator = error_handler(TrackerError)
"""Expected failures -> one line on stderr and their exit code."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    package_name="weightswarm", prog_name="tracker", message="%(prog)s (weightswarm) %(version)s"
)
def main() -> None:
    """weightswarm tracker: BitTorrent tracker, manifest registry and origin leases."""


_path = click.Path(dir_okay=False, path_type=Path)


@main.command()
@env_option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@env_option("--port", default=6969, type=click.IntRange(0, 65535), show_default=True, help="TCP port.")
@env_option(
    "--db",
    "db_path",
    type=_path,
    default=None,
    help="SQLite file (the default store). Without --db and --redis: in memory, nothing durable.",
)
@env_option(
    "--redis", "redis_url", default=None, help="redis://host:port/db: shared store for several replicas."
)
@env_option(
    "--token-file",
    type=_path,
    default=None,
    help="File holding the agent-role bearer token (every node has it): metainfo, leases, "
    "manifests of hub models, reads.",
)
@env_option(
    "--publisher-token-file",
    type=_path,
    default=None,
    help="File holding the publisher-role bearer token: manifests of hub-less models (a repo it "
    "writes is then closed to agent-role writes), reads.",
)
@env_option(
    "--read-token-file",
    type=_path,
    default=None,
    help="File holding an extra read-only token for GETs under /v1 (the agent and publisher tokens "
    "read too; without a token /v1 reads get 401).",
)
@env_option(
    "--interop-passkey-file",
    type=_path,
    default=None,
    help="File holding a passkey for stock BitTorrent clients: answered, but never counted among "
    "the agents (they get bytes only of public models, from agents run with --interop-public).",
)
@env_option(
    "--announce-passkey-file",
    type=_path,
    default=None,
    help="File holding the passkey that announce/scrape need (/announce/<passkey>). Required "
    "unless --insecure-no-token.",
)
@env_option(
    "--insecure-no-token",
    is_flag=True,
    default=False,
    help="Start without --token-file and --announce-passkey-file; what has no secret is open to "
    "anyone (development only).",
)
@env_option(
    "--trust-announce-ip",
    is_flag=True,
    default=False,
    help="Honour the announce ip= parameter instead of the connection's source address (agents "
    "behind NAT or a proxy); lets any passkey holder list any address.",
)
@env_option(
    "--interval",
    default=30,
    type=click.IntRange(1, 86400),
    show_default=True,
    help="Announce interval asked of clients, seconds; peers expire after 2.5 intervals.",
)
@env_option(
    "--max-lease-holders",
    default=1,
    type=click.IntRange(1, 64),
    show_default=True,
    help="Nodes that may hold an origin lease on one blob at once.",
)
@env_option(
    "--max-connections",
    default=8192,
    type=click.IntRange(16),
    show_default=True,
    help="Connections the listener holds at once; more are answered 503 and closed (lowered to fit the "
    "open-file limit).",
)
@env_option(
    "--max-connections-per-client",
    default=256,
    type=click.IntRange(1),
    show_default=True,
    help="Connections one client address may hold.",
)
@env_option(
    "--header-timeout",
    default=10.0,
    type=click.FloatRange(min=0.1),
    show_default=True,
    help="Seconds a connection has to send a request's headers (from its connect or its last response).",
)
@env_option(
    "--max-swarms",
    default=100_000,
    type=click.IntRange(1),
    show_default=True,
    help="Swarms the tracker holds in all; an announce that would start one more is refused (~1.2 KB each).",
)
@env_option(
    "--max-peers",
    default=500_000,
    type=click.IntRange(1),
    show_default=True,
    help="Peer entries (one per peer and swarm) in all, both passkeys (~0.4 KB each).",
)
@env_option(
    "--max-peers-per-address",
    default=50_000,
    type=click.IntRange(1),
    show_default=True,
    help="Entries one address may hold with the agents' passkey (a node: one per blob it holds, "
    "plus relay keys).",
)
@env_option(
    "--interop-max-swarms",
    default=10_000,
    type=click.IntRange(1),
    show_default=True,
    help="An interop-passkey announce starts a new swarm only while fewer than this many exist.",
)
@env_option(
    "--interop-max-peers",
    default=20_000,
    type=click.IntRange(1),
    show_default=True,
    help="Entries all interop-passkey holders together may hold.",
)
@env_option(
    "--interop-max-peers-per-address",
    default=1_000,
    type=click.IntRange(1),
    show_default=True,
    help="Entries one address may hold with the interop passkey.",
)
@env_option(
    "--body-timeout",
    default=10.0,
    type=click.FloatRange(min=0.1),
    show_default=True,
    help="Seconds a request's announced body has to start arriving, after which it must average 64 KiB/s; "
    "else 408 and close.",
)
@env_option(
    "--probe-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Probe port: /healthz and /readyz only, with connection limits of its own, so probes are "
    "answered while the main port is flooded [default: off].",
)
@env_option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@handle_errors
# Long because its parameters are the command's options, one each.
def serve(
    host: str,
    port: int,
    db_path: Path | None,
    redis_url: str | None,
    token_file: Path | None,
    publisher_token_file: Path | None,
    read_token_file: Path | None,
    announce_passkey_file: Path | None,
    interop_passkey_file: Path | None,
    insecure_no_token: bool,
    trust_announce_ip: bool,
    interval: int,
    max_lease_holders: int,
    max_connections: int,
    max_connections_per_client: int,
    header_timeout: float,
    max_swarms: int,
    max_peers: int,
    max_peers_per_address: int,
    interop_max_swarms: int,
    interop_max_peers: int,
    interop_max_peers_per_address: int,
    body_timeout: float,
    probe_port: int | None,
    log_level: str,
) -> None:
    """Run the tracker: announce/scrape, manifest registry, origin leases, /metrics."""
    from tracker.app import create_app
    from tracker.settings import SwarmLimits

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = TrackerSettings(
        host=host,
        port=port,
        db_path=db_path,
        redis_url=redis_url,
        token=read_secret_file(token_file, "--token-file") if token_file else None,
        publisher_token=(
            read_secret_file(publisher_token_file, "--publisher-token-file") if publisher_token_file else None
        ),
        read_token=read_secret_file(read_token_file, "--read-token-file") if read_token_file else None,
        announce_passkey=(
            read_secret_file(announce_passkey_file, "--announce-passkey-file")
            if announce_passkey_file
            else None
        ),
        interop_passkey=(
            read_secret_file(interop_passkey_file, "--interop-passkey-file") if interop_passkey_file else None
        ),
        insecure_no_token=insecure_no_token,
        trust_announce_ip=trust_announce_ip,
        interval=interval,
        min_interval=min(10, interval),
        max_lease_holders=max_lease_holders,
        log_level=log_level.upper(),
        limits=dataclasses.replace(
            TrackerSettings.limits,
            max_connections=max_connections,
            max_per_client=max_connections_per_client,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
        ),
        swarm_limits=SwarmLimits(
            max_swarms=max_swarms,
            max_peers=max_peers,
            max_peers_per_address=max_peers_per_address,
            interop_max_swarms=interop_max_swarms,
            interop_max_peers=interop_max_peers,
            interop_max_peers_per_address=interop_max_peers_per_address,
        ),
        probe_port=probe_port,
    )
    app = create_app(settings)
    # Announces allocate many short-lived objects; the default gen-0 threshold (700) runs the
    # collector every few requests and full collections show up as p99 spikes. Peer entries
    # hold no reference cycles, so collecting less often costs little memory.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    store = "redis" if redis_url else (f"sqlite {db_path}" if db_path else "sqlite in memory")
    warnings = [
        ", WRITES AND READS UNAUTHENTICATED" if settings.token is None else "",
        ", ANNOUNCES OPEN" if settings.announce_passkey is None else "",
        ", announce ip= trusted" if settings.trust_announce_ip else "",
    ]
    logging.getLogger("tracker").info(
        "serving on http://%s:%d (store: %s, interval %ds%s)", host, port, store, interval, "".join(warnings)
    )
    _listen(app, settings, log_level)


def _listen(app: TrackerApp, settings: TrackerSettings, log_level: str) -> None:
    """Serve `app` on the settings' address until stopped, its connections within the open-file limit."""
    import uvicorn

    from servekit.limits import PROBE_LIMITS, Gate, raise_open_file_limit
    from servekit.protocol import ProbePort, uvicorn_options
    from servekit.server import QuietServer

    host, port = settings.host, settings.port
    # One worker on purpose: with the SQLite store live peers are in this process's memory,
    # so a second worker would see half the swarm. For more throughput run replicas on --redis.
    # access_log off: announce URLs carry the passkey; tracker.access logs API paths, passkey redacted.
    probes = PROBE_LIMITS.max_connections if settings.probe_port is not None else 0
    room = raise_open_file_limit() - settings.fd_reserve - probes
    limits = settings.limits
    if room < limits.max_connections:
        logging.getLogger("tracker").warning(
            "the listener holds at most %d connections, not %d: the open-file limit less %d for the "
            "tracker's own work",
            room,
            limits.max_connections,
            settings.fd_reserve,
        )
        limits = dataclasses.replace(limits, max_connections=max(16, room))
    sockets = [_bind(host, port)]
    probe = None
    if settings.probe_port is not None:
        sockets.append(_bind(host, settings.probe_port))
        probe = ProbePort(int(sockets[1].getsockname()[1]), Gate(PROBE_LIMITS, f"tracker probes {host}"))
    config = uvicorn.Config(
        app,
        access_log=False,
        log_level=log_level.lower(),
        loop="auto",
        lifespan="on",
        server_header=False,
        **uvicorn_options(Gate(limits, f"tracker {host}:{port}"), quick=app.quick_routes(), probe=probe),
    )
    QuietServer(config).run(sockets=sockets)


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (the server is given its sockets: the probe port is a second)."""
    from servekit.server import BindError, bind_tcp

    try:
        sock = bind_tcp(host, port, 2048, f"{host}:{port}")
    except BindError as exc:
        raise ConfigError(str(exc)) from None
    sock.set_inheritable(True)
    return sock
