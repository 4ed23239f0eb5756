"""libtorrent's settings for a private datacenter swarm, and small conversions to and from its types.

With agent.swarm.session, the only modules that import libtorrent (an import-linter contract).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import libtorrent as lt

from agent.core.cpus import usable_cpus
from agent.core.errors import SwarmError
from agent.core.swarm_settings import DISK_IO, SwarmSettings

CPUS_SPOKEN_FOR = 2
"""CPUs a node's own work needs before disk and hashing threads can run beside it rather than take
turns with it: libtorrent's network thread, and the daemon's threads (the relay, the sha256 of each
blob)."""


def helper_threads(wanted: int, cpus: int) -> int:
    """libtorrent's disk I/O or hashing threads on a node with `cpus` usable CPUs: `wanted`, less the
    CPUs spoken for; 0 runs those jobs on the network thread, as aria2c does. A thread that takes each
    16-KiB block from the network thread hands it back too: on 2 CPUs the context switches this costs
    made libtorrent's session dearer than aria2c's, and without the threads cheaper (benchmarks.md, "The
    BitTorrent path"). With more CPUs the threads are kept: they hash a fast link's
    stream on several cores and serve peers' reads from disk in parallel, which two CPUs cannot show."""
    return max(0, min(wanted, cpus - CPUS_SPOKEN_FOR))


def settings_pack(s: SwarmSettings) -> dict[str, Any]:
    """libtorrent's settings_pack for a node: one table (long because it is one table, each entry with
    its reason)."""
    cpus = usable_cpus()
    alerts = (
        lt.alert.category_t.error_notification
        | lt.alert.category_t.status_notification
        | lt.alert.category_t.storage_notification
        | lt.alert.category_t.peer_notification
        | lt.alert.category_t.tracker_notification
        | lt.alert.category_t.ip_block_notification
        # One alert per verified piece (256 KiB..16 MiB): cheap, and the moment to sample
        # per-connection counters (web seed vs peer bytes) before a connection goes away.
        | lt.alert.category_t.piece_progress_notification
    )
    return {
        "listen_interfaces": s.listen,
        # Connect from the address we listen on: the one the tracker saw announce, which is all
        # that other agents' peer gates admit (agent.swarm.gate). Any address: the OS picks.
        "outgoing_interfaces": _outgoing(s.listen),
        # The peer gate's IP filter is for peers; the tracker is the one the agent was given (and
        # where the gate learns who the agents are, so filtering it would lock everyone out).
        "apply_ip_filter_to_trackers": False,
        "enable_dht": s.enable_dht,
        "enable_lsd": s.enable_lsd,
        "enable_upnp": s.enable_upnp,
        "enable_natpmp": s.enable_natpmp,
        "enable_outgoing_utp": s.enable_utp,
        "enable_incoming_utp": s.enable_utp,
        # With uTP off there is nothing to balance TCP against.
        "mixed_mode_algorithm": int(lt.bandwidth_mixed_algo_t.prefer_tcp),
        "allow_multiple_connections_per_ip": s.several_connections_per_ip,
        "upload_rate_limit": s.upload_rate_limit,
        "download_rate_limit": s.download_rate_limit,
        "connections_limit": s.connections_limit,
        "send_buffer_watermark": s.send_buffer_watermark,
        "send_buffer_low_watermark": s.send_buffer_low_watermark,
        "max_queued_disk_bytes": s.max_queued_disk_bytes,
        "recv_socket_buffer_size": s.peer_receive_socket_buffer,
        "aio_threads": helper_threads(s.aio_threads, cpus),
        "hashing_threads": helper_threads(s.hashing_threads, cpus),
        "request_queue_time": s.request_queue_time,
        "max_out_request_queue": s.request_queue_limit,
        "max_allowed_in_request_queue": s.request_queue_limit,
        # Private swarm: every node is a cooperating agent, so tit-for-tat choking only slows it
        # down. fixed_slots with unlimited slots = unchoke everyone who is interested.
        "choking_algorithm": int(lt.choking_algorithm_t.fixed_slots_choker),
        "unchoke_slots_limit": s.unchoke_slots_limit,
        "seed_choking_algorithm": int(
            lt.seed_choking_algorithm_t.fastest_upload
            if s.seed_choke_fastest_upload
            else lt.seed_choking_algorithm_t.round_robin
        ),
        "peer_timeout": s.peer_timeout,
        "min_announce_interval": s.min_announce_interval,
        "tracker_backoff": s.tracker_backoff,
        "tracker_completion_timeout": s.tracker_completion_timeout,
        "tracker_receive_timeout": s.tracker_receive_timeout,
        "stop_tracker_timeout": s.stop_tracker_timeout,
        "urlseed_wait_retry": s.web_seed_retry,
        "file_pool_size": s.file_pool_size,
        "alert_queue_size": s.alert_queue_size,
        "alert_mask": int(alerts),
        "ssrf_mitigation": s.ssrf_mitigation,
        "user_agent": s.user_agent,
        "peer_fingerprint": s.peer_fingerprint,
        # Plaintext: RC4 "encryption" costs CPU and protects nothing inside a cluster.
        "out_enc_policy": int(lt.enc_policy.disabled),
        "in_enc_policy": int(lt.enc_policy.enabled),
        # Connect to new peers quickly: a cold start adds many peers at once.
        "connection_speed": 200,
        "smooth_connects": False,
        # The accept queue of the BitTorrent port (libtorrent's default: 5). Every node that starts
        # a model connects to every peer once per blob, so a node takes hundreds of connections at
        # once; past the queue the kernel drops each SYN and the peer's connect waits 1 s, then 3 s,
        # 7 s (benchmarks.md, "The swarm on shaped links (8 nodes)").
        "listen_queue_size": 512,
        # A peer that finishes a blob while connected to us sends "upload only" before its HAVEs
        # are counted, and libtorrent then drops it as an "uninteresting upload-only peer" and only
        # retries after min_reconnect_time: each blob fetched from a lease holder that had just
        # completed it waited for that (reproduced on loopback). Keep such connections,
        # reconnect within a second if one goes anyway, and close idle ones after a while instead.
        "close_redundant_connections": False,
        "min_reconnect_time": 1,
        "inactivity_timeout": 120,
    }


def session_params(s: SwarmSettings) -> Any:
    """What `lt.session` starts from: the settings pack and the disk I/O (`SwarmSettings.disk_io`)."""
    if s.disk_io not in DISK_IO:
        raise SwarmError(f"unknown disk I/O {s.disk_io!r}: one of {', '.join(DISK_IO)}")
    params = lt.session_params(cast(Any, settings_pack(s)))
    # The binding maps these names, and any other to its default without a word: hence the check.
    params.disk_io_constructor = f"{s.disk_io}_disk_io_constructor"
    return params


def torrent_info(info: bytes, what: str) -> Any:
    if not info.startswith(b"d"):
        raise SwarmError(f"invalid torrent info for {what}: not a bencoded dictionary")
    try:
        ti = lt.torrent_info(b"d4:info" + info + b"e")
    except RuntimeError as exc:
        raise SwarmError(f"invalid torrent info for {what}: {exc}") from None
    if ti.num_files() != 1:
        raise SwarmError(f"invalid torrent info for {what}: {ti.num_files()} files, expected one blob")
    return ti


def infohash_of(ti: Any) -> str:
    return str(ti.info_hashes().v1)


def _outgoing(listen: str) -> str:
    host = listen.rpartition(":")[0].strip("[]")
    return "" if host in ("", "0.0.0.0", "::") else host


def redact_tracker_url(url: str) -> str:
    """A tracker URL fit for a log: what follows /announce/ or /scrape/ (the passkey) becomes ***."""
    for route in ("/announce/", "/scrape/"):
        head, sep, _ = url.partition(route)
        if sep:
            return f"{head}{route}***"
    return url


def bdecode_dict(raw: bytes) -> dict[bytes, Any]:
    decoded = lt.bdecode(raw)
    if not isinstance(decoded, dict):
        raise RuntimeError("not a bencoded dictionary")
    return cast(dict[bytes, Any], decoded)


def load_resume(path: Path) -> tuple[Any, dict[bytes, Any]]:
    """(libtorrent's add_torrent_params, the whole dict with our keys) of a resume file."""
    raw = path.read_bytes()
    return lt.read_resume_data(raw), bdecode_dict(raw)


def fsync_file_and_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
