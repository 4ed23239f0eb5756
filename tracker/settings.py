"""Tracker settings: one frozen dataclass, built once by the CLI and passed down.

No other tracker module reads `os.environ`; `WEIGHTSWARM_<OPTION>` variables are handled
by the CLI layer, and secrets are read from files here, once, at startup.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from servekit.limits import ConnectionLimits
from tracker.errors import ConfigError

MiB = 2**20
_URL_SAFE = re.compile(r"^[A-Za-z0-9._~-]+$")


@dataclass(frozen=True)
class SwarmLimits:
    """What announces may make the tracker hold: swarms, and peer entries (one per peer and swarm), in
    all and per announcing address, with a smaller budget for the interop passkey's stock clients so
    that they cannot crowd out the agents. An announce over a limit gets a bencoded failure reason and
    stores nothing; a peer already listed always renews. A swarm costs ~1.2 KB of tracker memory, an
    entry ~0.4 KB (SQLite store); the defaults hold at most ~300 MiB, raise them with the memory."""

    max_swarms: int = 100_000
    """Swarms (infohashes with a peer) in all. 100,000: one per blob a cluster holds, plus the relay's
    part and rank keys; an announce that would start one more is refused (--max-swarms)."""

    max_peers: int = 500_000
    """Peer entries in all, both passkeys (--max-peers). 500,000: e.g. 50 nodes holding 10,000 blobs."""

    max_peers_per_address: int = 50_000
    """Entries one address may hold with the agents' passkey: a big node announces every blob it holds
    (many thousands) plus relay and rank keys (--max-peers-per-address)."""

    interop_max_swarms: int = 10_000
    """An interop-passkey announce starts a new swarm only while fewer than this many exist in all, so
    agents keep `max_swarms` less this for their own (--interop-max-swarms). Stock clients normally
    join the agents' swarms of public models, which exist already."""

    interop_max_peers: int = 20_000
    """Entries all interop-passkey holders together may hold (--interop-max-peers)."""

    interop_max_peers_per_address: int = 1_000
    """Entries one address may hold with the interop passkey: a stock client seeding a few models
    (--interop-max-peers-per-address)."""

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1: {value}")

    def swarms_for(self, agent: bool) -> int:
        """Swarms beyond which an announce with this passkey may start no new one."""
        return self.max_swarms if agent else min(self.max_swarms, self.interop_max_swarms)

    def peers_for(self, agent: bool) -> tuple[int, int]:
        """(entries in all, entries per address) this passkey's holders may hold."""
        if agent:
            return self.max_peers, self.max_peers_per_address
        return self.interop_max_peers, self.interop_max_peers_per_address


SWARMS_FULL = "tracker full: too many swarms, retry later"
PEERS_FULL = "tracker full: too many peers, retry later"
ADDRESS_FULL = "too many swarms announced from this address"
"""Failure reasons of an announce over a `SwarmLimits` limit (nothing of it is stored)."""


@dataclass(frozen=True)
class TrackerSettings:
    """Everything `tracker serve` needs."""

    host: str = "127.0.0.1"
    """Address to listen on. Default loopback; the chart sets 0.0.0.0."""

    port: int = 6969
    """TCP port for HTTP (announce, scrape, API, metrics). Default 6969, the customary tracker port."""

    db_path: Path | None = None
    """SQLite file for manifests, metainfo and leases (the default store). None = in-memory (tests, demo)."""

    redis_url: str | None = None
    """redis://host:port/db for the shared store; several replicas then serve one swarm view."""

    token: str | None = field(default=None, repr=False)
    """The agent-role bearer token (--token-file): metainfo, origin leases, manifests of hub models,
    and every read. Every node holds it, so it cannot write a model the publisher published.
    Never logged (repr=False)."""

    publisher_token: str | None = field(default=None, repr=False)
    """The publisher-role bearer token (--publisher-token-file): manifests (and the refs they set)
    of hub-less models, and every read; no metainfo, no leases. A repo it writes is marked
    published, and agent-role writes for that repo are refused from then on. None: no publisher.
    Never logged (repr=False)."""

    read_token: str | None = field(default=None, repr=False)
    """An optional read-only bearer token (--read-token-file) for GETs under /v1 (dashboards,
    operators). The agent and publisher tokens read too; without any of them /v1 reads get 401."""

    announce_passkey: str | None = field(default=None, repr=False)
    """The passkey that /announce and /scrape need (/announce/<passkey>, or ?passkey=). Required:
    without it anyone who reaches the tracker can join (and map) every swarm. URL-safe characters
    only, since it travels in the announce URL. Never logged (repr=False)."""

    interop_passkey: str | None = field(default=None, repr=False)
    """A second passkey for stock BitTorrent clients (--interop-passkey-file): their announces are
    answered, but their addresses are not the agents' (`GET /v1/peers`), so agents exchange bytes
    with them only for blobs of models the origin reports public, and only where the agents run
    with --interop-public. None: no stock client can announce. Never logged (repr=False)."""

    insecure_no_token: bool = False
    """Start without the agent token and the announce passkey; whatever has no secret configured
    is then open to anyone (writes, reads, announce). Development only: a tracker that accepts
    anyone's metainfo can be made to serve poisoned piece hashes, so running open must be an
    explicit choice."""

    trust_announce_ip: bool = False
    """Honour the announce `ip=` parameter (an IP literal). Off by default: the peer is listed at
    the TCP source address, so no client can list someone else's address. Turn it on only when
    the source address is wrong, e.g. agents reaching the tracker through NAT or an
    overlay/service proxy while peers must dial the node's own (hostNetwork) address; the agents
    must then be trusted, since any of them can list any address."""

    interval: int = 30
    """Seconds between announces we ask clients for. 30 s suits fast datacenter swarms."""

    min_interval: int = 10
    """Seconds a client must at least wait between announces (BEP 3 `min interval`)."""

    peer_ttl_factor: float = 2.5
    """A peer expires after interval x this seconds without an announce (two missed announces)."""

    default_numwant: int = 50
    """Peers returned when the client does not say how many it wants."""

    max_numwant: int = 200
    """Cap on `numwant`; more peers per response only costs bandwidth and CPU."""

    max_scrape_hashes: int = 256
    """Most info_hash values one scrape may ask about."""

    max_lease_holders: int = 1
    """Nodes that may hold an origin lease on one blob at once. 1 = the origin sees each byte once."""

    max_lease_ttl: int = 600
    """Longest lease TTL a node may ask for, seconds; heartbeats keep it alive."""

    lease_amnesty: float = 10.0
    """Seconds after the store lost the swarm state under a running tracker (a Redis restarted without
    its data: `Store.epoch` changed) during which leases go back only to the nodes that held them (their
    next heartbeat reclaims them), not to the first node that asks: that node would start the blob over
    from the origin while the holder finishes it, and the origin would send the blob twice."""

    quarantine_hold: float = 3600.0
    """Seconds after a node reported a blob's info dict wrong (`/v1/blobs/<id>/metainfo/report`) during
    which that same dict cannot be published again (a buggy node re-registering it, a naive poisoner);
    any other dict can. Bounded, because a report cannot be checked here (docs/security.md)."""

    max_body_bytes: int = 4 * MiB
    """Largest request body (metainfo, manifest). 4 MiB holds the piece hashes of a ~50 GB blob
    at 256 KiB pieces; larger requests get 413."""

    max_manifest_files: int = 100_000
    """Most files one manifest may list."""

    max_wait: float = 30.0
    """Longest long-poll on /v1/blobs/<id>/wait, seconds; clients re-ask after it."""

    wait_poll: float = 0.2
    """How often a long-poll re-reads the store, seconds (the store may be shared with other replicas)."""

    log_level: str = "INFO"
    """Logging level of the tracker process."""

    limits: ConnectionLimits = ConnectionLimits(
        max_connections=8192, max_per_client=256, max_url_bytes=20 << 10, max_head_bytes=24 << 10
    )
    """What the listener holds (servekit.limits): 8,192 connections, 256 per client address (an agent
    keeps a few; a load test or a NAT more), 10 s to send a request's headers, 5 s idle between requests,
    a body at 64 KiB/s after 10 s (--max-connections, --max-connections-per-client, --header-timeout,
    --body-timeout); a request target of 20 KiB and a head of 24 KiB: a scrape of `max_scrape_hashes`
    (256) info hashes is an 18 KiB target. Lowered to fit the open-file limit less `fd_reserve`."""

    probe_port: int | None = None
    """TCP port of the probe port (--probe-port): `/healthz` and `/readyz` only, under limits of its own
    (servekit.limits.PROBE_LIMITS), so kubelet's probes are answered while the main port is full of
    hostile connections. None = off (the chart turns it on and points its probes there)."""

    swarm_limits: SwarmLimits = SwarmLimits()
    """Swarms and peer entries announces may make the tracker hold (SwarmLimits), so a passkey holder
    announcing fresh infohashes cannot take its memory: 2.06 million swarms took it to 2.4 GB before."""

    fd_reserve: int = 256
    """Open files kept for the tracker's own work (the SQLite file, Redis connections, logs) beyond what
    its listener may hold."""

    @property
    def peer_ttl(self) -> float:
        """Seconds after the last announce at which a peer is dropped."""
        return self.interval * self.peer_ttl_factor

    def __post_init__(self) -> None:
        if self.db_path is not None and self.redis_url is not None:
            raise ConfigError("choose one store: --db PATH or --redis URL, not both")
        if not 1 <= self.interval <= 86400:
            raise ConfigError(f"--interval must be between 1 and 86400 seconds: {self.interval}")
        if not 0 <= self.min_interval <= self.interval:
            raise ConfigError(f"min interval must be between 0 and --interval: {self.min_interval}")
        if not 1 <= self.max_lease_holders <= 64:
            raise ConfigError(f"--max-lease-holders must be between 1 and 64: {self.max_lease_holders}")
        if self.token is None and not self.insecure_no_token:
            raise ConfigError(
                "no write token: pass --token-file FILE (or WEIGHTSWARM_TOKEN_FILE), "
                "or --insecure-no-token to accept unauthenticated writes"
            )
        if self.announce_passkey is None and not self.insecure_no_token:
            raise ConfigError(
                "no announce passkey: pass --announce-passkey-file FILE (or "
                "WEIGHTSWARM_ANNOUNCE_PASSKEY_FILE), or --insecure-no-token to accept anyone's announces"
            )
        if self.interop_passkey is not None and not _URL_SAFE.match(self.interop_passkey):
            raise ConfigError("--interop-passkey-file: only letters, digits and - . _ ~ (it is in a URL)")
        if self.announce_passkey is not None and not _URL_SAFE.match(self.announce_passkey):
            raise ConfigError(
                "--announce-passkey-file: the passkey travels in the announce URL path, so it may hold "
                "only letters, digits and - . _ ~"
            )
        seen: dict[str, str] = {}
        for option, secret in (
            ("--token-file", self.token),
            ("--publisher-token-file", self.publisher_token),
            ("--read-token-file", self.read_token),
            ("--announce-passkey-file", self.announce_passkey),
            ("--interop-passkey-file", self.interop_passkey),
        ):
            if secret is None:
                continue
            if secret in seen:
                # One secret in two roles would let its holder act in both (a node could publish).
                raise ConfigError(f"{seen[secret]} and {option} hold the same secret: each needs its own")
            seen[secret] = option


def read_secret_file(path: Path, option: str) -> str:
    """The first line of a secret file, stripped; a clear one-line error if unusable."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {option} {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{option} {path} is not UTF-8 text") from None
    secret = text.splitlines()[0].strip() if text else ""
    if not secret:
        raise ConfigError(f"{option} {path} is empty")
    if len(secret) < 8:
        raise ConfigError(f"{option} {path} holds a secret shorter than 8 characters")
    if any(c.isspace() or not c.isprintable() for c in secret):
        raise ConfigError(f"{option} {path}: the secret must be one printable word without spaces")
    return secret
