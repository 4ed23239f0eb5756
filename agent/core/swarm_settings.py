"""The BitTorrent side of the agent's settings (`SwarmSettings`), a part of agent.core.settings `Settings`:
libtorrent's session, the peer gate, leases and the relay."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

MiB = 2**20


DISK_IO = ("mmap", "pread", "posix")
"""libtorrent's disk I/O back ends a node may choose (`SwarmSettings.disk_io`)."""


@dataclass(frozen=True)
class SwarmSettings:
    """The BitTorrent session (agent.swarm.session): tuned for a private datacenter swarm."""

    listen: str = "127.0.0.1:0"
    """HOST:PORT libtorrent listens on (--bt-listen); port 0 = any free port. Loopback by default (tests)."""

    upload_rate_limit: int = 0
    """Bytes/s uploaded to all peers together; 0 = unlimited. Applies to private/loopback peers too."""

    download_rate_limit: int = 0
    """Bytes/s downloaded from peers and web seeds together; 0 = unlimited."""

    connections_limit: int = 500
    """Open peer connections, all torrents together. A node seeds many blobs to few peers."""

    max_connections_per_torrent: int = 100
    """Peer connections per blob torrent; -1 = unlimited. Bounds memory when one blob is hot."""

    enable_dht: bool = False
    """DHT: off; peers come from the cluster tracker, and blobs must not leak to the public DHT."""

    enable_lsd: bool = False
    """Local service discovery multicast: off (the tracker knows every peer; LSD is noise on a DC LAN)."""

    enable_upnp: bool = False
    """UPnP port mapping: off (nodes are not behind a home router)."""

    enable_natpmp: bool = False
    """NAT-PMP port mapping: off (as UPnP)."""

    enable_utp: bool = False
    """uTP (incoming and outgoing): off; its congestion control yields to TCP, pointless on a DC link."""

    allow_multiple_connections_per_ip: bool | None = None
    """Several connections to and from one IP address; None = only when listening on loopback
    (`several_connections_per_ip`), where every agent of a demo or test shares 127.0.0.1. On a
    network each node has its own address, and one connection per address is what makes libtorrent's
    ban of a peer that sent bad pieces hold: with several allowed, its peer list is keyed by address
    and port, so the banned peer connecting in again from a new port is a new peer, and is let in."""

    send_buffer_watermark: int = 2 * MiB
    """Bytes queued per peer connection before reading from disk pauses (default 500 KB). Several
    times a DC link's bandwidth-delay product (10 Gb/s x 0.5 ms = 625 KB), and the kernel's socket
    buffer adds its own. It is anonymous memory per connection, which a lease holder serving many peers
    and blobs pays many times (benchmarks.md, "The BitTorrent path")."""

    send_buffer_low_watermark: int = 512 * 1024
    """Bytes per peer below which the send buffer is refilled, so a fast peer never drains it."""

    peer_receive_socket_buffer: int = 512 * 1024
    """The kernel's receive buffer of each peer connection (SO_RCVBUF; 0 = the kernel's autotuning, up
    to net.ipv4.tcp_rmem's maximum, 6-32 MiB). libtorrent sizes a connection's own receive buffer to what
    the kernel has queued for it, so an agent that falls behind its sockets (8 agents on 2 cores in the
    benchmark; one network thread at 100 Gb/s) copied each connection's backlog into anonymous memory,
    the largest part of its peak heap; 512 KiB cuts that in the same times (benchmarks.md, "Memory").
    512 KiB is a window of ~1 GB/s per connection at a 0.5 ms round trip, and a node has a connection
    per peer and blob. The kernel caps it at net.core.rmem_max (208 KiB on a stock kernel)."""

    max_queued_disk_bytes: int = 64 * MiB
    """Bytes received but not yet written before peers are throttled (default 100 MiB): 50 ms of a
    10 Gb/s link, which an NVMe drive or the page cache absorbs; more is only resident memory."""

    disk_io: str = "pread"
    """libtorrent's disk I/O: "pread" (pread/pwrite with a cache of its own), "mmap" (libtorrent's
    default on Linux: blocks are written into a memory map of the file) or "posix" (plain reads and
    writes). pread: warm starts faster than with mmap (benchmarks.md, "Settings measured with bench.swarm"),
    and a seeded file's pages no longer count in the agent's RSS."""

    aio_threads: int = 8
    """Disk I/O threads, at most one per usable CPU beyond two, none on a node of two CPUs or fewer
    (agent.swarm.ltkit.helper_threads). NVMe serves many parallel reads; more gain little. Writes into
    one file take turns on its inode lock, so on a small node a second thread spins on it rather than
    writing (benchmarks.md, "The BitTorrent path")."""

    hashing_threads: int = 4
    """Piece-hashing threads (libtorrent's default 1), bounded as `aio_threads`: SHA-1 of a 10 Gb/s
    stream needs more than one core, and on a small node extra threads only add context switches."""

    request_queue_time: int = 3
    """Seconds of outstanding requests per peer (queue depth = rate x this, up to `request_queue_limit`)."""

    request_queue_limit: int = 250
    """Most block requests a peer keeps in flight to this node: 250 x 16 KiB = 4 MiB a connection, ~3 ms
    of a 10 Gb/s link, and a node takes each blob from several peers at once. A node advertises it in its
    extension handshake (libtorrent's max_allowed_in_request_queue, default 2,000), and libtorrent caps
    its requests to a peer at what that peer advertises, over its own max_out_request_queue: the depth
    is set where the blocks come from, so both are set to this. At 2,000 (31 MiB a connection) blocks
    that waited in a deep queue at one peer were asked of another as well, and both copies came
    (benchmarks.md, "The BitTorrent path")."""

    unchoke_slots_limit: int = -1
    """Peers uploaded to at once; -1 = all. A private swarm has no free riders to punish with choking."""

    super_seed: bool = False
    """Seed complete blobs of more than one piece in libtorrent's super-seeding mode: each receiver is
    shown one piece at a time that no other receiver is being shown, so a lone seed sends each piece
    about once and the receivers trade the rest. Pays when one seed serves many receivers and the
    transfer is long (bench.swarm --super-seed); costs ~10 s at the start of each connection to the seed
    (libtorrent drops its first two HAVEs during the handshake and shows a first piece after 10 s)."""

    seed_choke_fastest_upload: bool = True
    """Seeds unchoke their fastest downloaders, not round robin (matters only if slots are limited)."""

    peer_timeout: int = 30
    """Seconds a silent peer is kept before it is dropped (default 120): DC peers are fast or gone."""

    web_seed_retry: int = 5
    """Seconds before a failed web seed (the origin) is tried again (default 30)."""

    min_announce_interval: int = 1
    """Floor, seconds, under the tracker's announce `interval` (libtorrent's default 300). libtorrent
    announces every max(interval, this); 300 s outlived our tracker's peer TTL (2.5 x 30 s), so
    seeders vanished from it. 1 s: the cluster's own tracker sets the pace with its `interval`."""

    tracker_backoff: int = 100
    """Percent by which the retry delay after failed announces grows (libtorrent default 250: up to an
    hour). Slower growth keeps a node findable soon after a tracker outage."""

    tracker_completion_timeout: int = 10
    """Seconds an announce may take in all before it counts as failed (default 30); a cluster
    tracker answers in milliseconds, and a failed one is retried."""

    tracker_receive_timeout: int = 5
    """Seconds without data from the tracker before an announce counts as failed (default 10)."""

    stop_tracker_timeout: int = 2
    """Seconds shutdown waits for the final `stopped` announces (default 5): a clean stop leaves the
    tracker's peer lists at once, and a dead tracker delays shutdown only this much."""

    seeder_grace: float = 3.0
    """Seconds an origin-lease holder whose metainfo is known first waits for its own announce to
    find a seeder, before adding the origin as web seed, when the tracker's grant does not count the
    blob's seeders (an older tracker; the count, taken after the grant, closes the same race between a
    seeder's announce and our tracker query). With no seeders the announce reply ends the wait."""

    lease_spread: float = 2.0
    """Seconds a node that already holds an origin lease waits before asking for another (blobs of
    16 MiB or more), so the leases of a model's shards spread over the nodes asking at once: one
    holder of most shards is the only source of every new piece, saturates its uplink and slows
    its own origin download. A lone node just takes each further lease this much later."""

    stall_timeout: float = 60.0
    """Seconds with no payload progress before status() says 'stalled' (the daemon then uses the origin)."""

    held_piece_recheck: float = 10.0
    """Seconds a downloading blob may go without progress while a piece has every block written and no
    hash verdict before its file is re-checked (`Swarm._recheck_held`): a verdict takes milliseconds."""

    resume_interval: float = 30.0
    """Seconds between periodic resume-data saves of torrents that changed; also saved on finish and close."""

    file_pool_size: int = 512
    """Open files kept by libtorrent (default 40): a node seeds hundreds of shards."""

    alert_queue_size: int = 10000
    """Alerts buffered between alert-loop turns before libtorrent drops them."""

    relay_fanout: int = 3
    """Streams of one arriving blob this node relays to other agents at once (agent.relay.directory); 0 turns
    the relay off (a blob then reaches other nodes only once its lease holder has it whole). Each stream
    runs at the origin's pace, so the node's uplink should carry this many times the origin rate."""

    relay_min_rate: int = 64 * 1024
    """Bytes a second a relay stream must bring, judged over each window of the relay's stall time (the
    lease holder's stall time), and a blob's whole relay likewise: a source below it is left for the next
    source, and a relay below it for BitTorrent or the origin lease (docs/security.md). "A byte within the
    stall time" let a source that sent a byte every few seconds hold a receiver for ever. Low next to any
    link, near the ~70 KB/s per origin connection below which a lease holder looks stalled too; 0: only
    a stream or relay that brings no byte in a window is left."""

    relay_seeds: bool = True
    """Blobs seeded whole are relay sources too (agent.relay.directory "Warm starts"): a node that wants a
    large blob some node holds whole takes it as a chain of relays, before BitTorrent. Needs the relay
    (`relay_fanout` > 0), and is off on a node with an `upload_rate_limit` (`chains_seeds`)."""

    origin_holders: int = 1
    """At most this many nodes pull disjoint parts of one large blob from the origin at once
    (agent.relay.directory "Parts"). How many do is measured per blob (agent.relay.admission): the first
    node leads and pulls the parts in order; a second probes with the last part, and the others join
    only if the lead kept its origin rate meanwhile, as from an origin that caps each client (a CDN's
    per-connection or per-IP limit), where a one-shard cold start was several times faster with 8 than with
    one holder. Otherwise (an origin that caps its total, a cluster behind one NAT address) the lead pulls
    the rest. 1 (one holder per blob, no parts) by default: with several blobs pulled at once from an
    origin capped in total, the lead's rate moves as other clients come and go, and the verdict was
    wrong for some shards (benchmarks.md, "An origin that caps each client: a blob in parts").
    Needs the relay (`relay_fanout` > 0)."""

    origin_part_min: int = 64 * MiB
    """Least bytes of such a part: a blob is split only when each part is at least this big."""

    origin_probe_seconds: float = 2.0
    """Seconds over which the lead of a blob in parts measures its origin rate, alone and then while a
    second node pulls a part (agent.relay.admission): two windows of half this that agree."""

    peer_gate: bool = True
    """Admit only the cluster's agents as peers (agent.swarm.gate). False (`agent serve --no-peer-gate`)
    admits anyone who reaches the port: for measuring what the gate costs, never for a cluster."""

    peer_gate_refresh: float = 2.0
    """Seconds between refreshes of the agents admitted by the peer gate (agent.swarm.gate); a
    refused connection refreshes at once, so a node that just joined waits well under this."""

    interop_public: bool = False
    """Let stock BitTorrent clients (no cluster credential) exchange bytes of models the origin
    reports public (--interop-public). Off: only authenticated agents get or give any byte."""

    ssrf_mitigation: bool = False
    """libtorrent's SSRF guard; off. libtorrent 2.x then refuses every web seed URL with a query string
    on a private address (10/8, 172.16/12, 192.168/16, ...): the signed CDN URL of an in-cluster or
    air-gapped `agent serve-hub` origin, so lease holders never got a byte from it (seen in the netns
    benchmark; loopback is not refused, so loopback tests miss it). It guards clients that open
    untrusted .torrent files; ours only contact URLs the agent itself chose (--tracker, the --origin's
    resolved redirect): metainfo from the tracker is a bare info dict, which carries no URL."""

    user_agent: str = "weightswarm/0.1"
    """User-Agent for trackers and web seeds."""

    peer_fingerprint: str = "-WS0100-"
    """Start of the 20-byte peer id (Azureus style), so other clients can recognise our agents."""

    @property
    def chains_seeds(self) -> bool:
        """`relay_seeds` in effect: the relay on, and no upload cap (`upload_rate_limit` is libtorrent's; a
        node capped so would pass a whole blob on over the relay at any rate)."""
        return self.relay_seeds and self.relay_fanout > 0 and not self.upload_rate_limit

    @property
    def several_connections_per_ip(self) -> bool:
        """`allow_multiple_connections_per_ip`, with None decided by `listen`: yes on loopback only."""
        if self.allow_multiple_connections_per_ip is not None:
            return self.allow_multiple_connections_per_ip
        host = self.listen.rpartition(":")[0].strip("[]")
        if host in ("localhost", "lo"):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:  # an interface name such as eth0
            return False
