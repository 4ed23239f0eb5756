"""Settings: nested dataclasses, built once (by the CLI) and passed down.

No other module reads `os.environ`; `from_env_defaults` is the one place that maps the
Hugging Face environment variables (`HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN`,
`HF_TOKEN_PATH`, `HF_HUB_OFFLINE`) onto defaults, as `huggingface_hub` does. `WEIGHTSWARM_<OPTION>`
variables are handled by the CLI layer (every option has one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.swarm_settings import SwarmSettings
from servekit.limits import ConnectionLimits

DEFAULT_ORIGIN = "https://huggingface.co"
MiB = 2**20


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (as huggingface_hub)."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """`$XDG_STATE_HOME/weightswarm`, else `~/.local/state/weightswarm`: never inside the hub cache."""
    xdg = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg).expanduser() / "weightswarm"


def default_origin(env: Mapping[str, str]) -> str:
    """`$HF_ENDPOINT`, else https://huggingface.co."""
    return (env.get("HF_ENDPOINT") or DEFAULT_ORIGIN).rstrip("/")


def default_offline(env: Mapping[str, str]) -> bool:
    """`$HF_HUB_OFFLINE` (else `$TRANSFORMERS_OFFLINE`) set to a true value, as huggingface_hub reads them
    ("1", "ON", "YES", "TRUE")."""
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in {"1", "ON", "YES", "TRUE"}


def default_token(env: Mapping[str, str]) -> str | None:
    """`$HF_TOKEN` (or the legacy `$HUGGING_FACE_HUB_TOKEN`), else the token file huggingface_hub
    reads (`$HF_TOKEN_PATH`, else `$HF_HOME/token`, else `~/.cache/huggingface/token`: what
    `hf auth login` writes, and how the chart mounts a Secret), else anonymous."""
    token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token
    if env.get("HF_TOKEN_PATH"):
        path = Path(env["HF_TOKEN_PATH"]).expanduser()
    else:
        cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(env.get("HF_HOME") or Path(cache) / "huggingface").expanduser() / "token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class OriginSettings:
    """How the agent talks to the origin hub (huggingface.co or any HF-compatible hub)."""

    endpoint: str = DEFAULT_ORIGIN
    """Base URL of the hub, no trailing slash. Default https://huggingface.co."""

    token: str | None = field(default=None, repr=False)
    """Bearer token for gated/private repos. Never logged, never written to disk (repr=False)."""

    connect_timeout: float = 10.0
    """Seconds to wait for a TCP/TLS connection to the origin or its CDN."""

    read_timeout: float = 30.0
    """Seconds without a byte before a connection counts as dropped and its range is retried."""

    max_retries: int = 6
    """Attempts per request (per range) for 429, 5xx and dropped connections before giving up."""

    answer_within: float = 60.0
    """Seconds a request is tried again while the origin answers nothing at all (refused, unknown host,
    silent), from its first try; then it fails. Each try waits at most a third of it (connect and read
    timeouts), so a silent origin is asked three times in the bound, each said at WARNING."""

    backoff_base: float = 0.5
    """First retry delay in seconds; doubles per attempt, with full jitter, capped at backoff_max."""

    backoff_max: float = 30.0
    """Longest delay between retries, seconds; a server's Retry-After is honoured up to this."""

    patience: float = 0.0
    """Seconds a request keeps being asked again after its bounded retries while the origin stays
    unavailable (429, 5xx, refused or dropped connections), counted from its last progress. 0 for a
    lone `agent fetch` (it reports the error); a daemon job gets `daemon.origin_patience`."""

    user_agent: str = "weightswarm/0.1"
    """User-Agent sent to the origin."""

    offline: bool = False
    """`HF_HUB_OFFLINE=1` (as huggingface_hub): never ask the origin; a revision complete in the cache
    is served from it, anything else fails at once. Default off."""

    max_json_bytes: int = 64 * MiB
    """Bytes an API answer of the origin (a revision's file list, a tree page, model info) may have: a
    hostile origin's endless JSON is refused before it is parsed (the Hub's largest repos list ~2 MB)."""

    oci_plain_http: tuple[str, ...] = ()
    """OCI registries (HOST:PORT) spoken to over plain HTTP (--oci-plain-http, as oras's --plain-http);
    every other registry over HTTPS only. None by default."""

    oci_auth_file: Path | None = None
    """The docker config whose `auths` hold registry credentials: $REGISTRY_AUTH_FILE (podman, skopeo),
    else $DOCKER_CONFIG/config.json, else ~/.docker/config.json. None: anonymous."""


def default_oci_auth_file(env: Mapping[str, str]) -> Path:
    """Where registry credentials are read, as podman/skopeo (REGISTRY_AUTH_FILE) and docker
    (DOCKER_CONFIG) look."""
    if env.get("REGISTRY_AUTH_FILE"):
        return Path(env["REGISTRY_AUTH_FILE"]).expanduser()
    if env.get("DOCKER_CONFIG"):
        return Path(env["DOCKER_CONFIG"]).expanduser() / "config.json"
    return Path("~/.docker/config.json").expanduser()


@dataclass(frozen=True)
class FetchSettings:
    """How a fetch downloads: parallelism, chunking, what to verify."""

    connections_per_file: int = 8
    """Parallel HTTP range requests per file. CDNs cap per-connection speed, so >1 pays off."""

    files_at_once: int = 4
    """Files downloaded concurrently. Total connections = files_at_once x connections_per_file."""

    chunk_size: int = 4 * MiB
    """Bytes per range request; also the unit of resume. Readers of a blob still arriving (HF clients, the
    relay to other nodes) get its contiguous prefix, which lags the download front by up to
    connections_per_file x chunk_size: 4 MiB keeps that near 32 MiB (16 MiB made the nodes after a
    lease holder finish seconds after it) and requests still few (~8 a second per 30 MB/s)."""

    min_free_bytes: int = 64 * MiB
    """Head-room kept free on the cache filesystem beyond what the download needs."""

    verify_safetensors: bool = True
    """Parse headers of downloaded *.safetensors files and check index json shard lists."""

    origin_min_rate: float = 32 * 1024
    """Bytes/s a blob must bring over each `origin_rate_window`, or it fails (agent.origin.headway): an
    origin must not hold a blob's reservation by sending a trickle. Time the origin said "later" (429,
    5xx) does not count; 32 KiB/s is far below any origin a model is pulled from."""

    origin_rate_window: float = 60.0
    """Seconds over which a blob's bytes from the origin are measured against `origin_min_rate`, and
    within which `origin_short_answers` meagre answers end it."""

    origin_short_answers: int = 8
    """Answers of one blob ending early having brought under 1 MiB each, within `origin_rate_window`,
    that make the origin's listed length a lie (the partial goes): each answer ending at a new byte must
    not look like headway."""


DEFAULT_API_LISTEN = "127.0.0.1:7470"
ADMIN_SOCKET_NAME = "admin.sock"
"""The admin channel's socket in the state dir, unless --admin-socket says otherwise."""


def default_admin_socket(state_dir: Path) -> Path:
    return state_dir / ADMIN_SOCKET_NAME


HF_TOKEN_HEADER = "X-HF-Token"
"""The requester's HF token on the agent API's `POST /v1/fetch`. Not `Authorization`: that is for
naming the caller to the agent, this names the caller to the origin."""


@dataclass(frozen=True)
class DaemonSettings:
    """`agent serve`: the node daemon's tracker, identity, API and fetch policy."""

    tracker_url: str | None = None
    """Base URL of the tracker (http://host:port), no trailing slash. None = origin only, no swarm."""

    tracker_token: str | None = field(default=None, repr=False)
    """Bearer token for tracker writes, read from --tracker-token-file. Never logged (repr=False)."""

    node_name: str = "localhost"
    """This node's name (default the hostname); with the BitTorrent port it forms the lease node id."""

    api_listen: str = DEFAULT_API_LISTEN
    """HOST:PORT of the network listener: probes, `/metrics` and the HF-compatible endpoint only
    (model requests and admin actions are on the unix sockets). Loopback by default."""

    probe_listen: str | None = None
    """HOST:PORT of the probe port (--probe-listen): `/healthz` and `/readyz` only, under limits of its own
    (servekit.limits.PROBE_LIMITS), so kubelet's probes are answered while --api-listen is full of
    hostile connections. None = off (the chart turns it on and points its probes there)."""

    tracker_connect_timeout: float = 3.0
    """Seconds to connect to the tracker; short so a dead tracker falls back to the origin quickly."""

    tracker_read_timeout: float = 10.0
    """Seconds to wait for a tracker answer (the long-poll adds its own timeout on top)."""

    wait_poll_seconds: float = 20.0
    """Length of one `/v1/blobs/{id}/wait` long-poll; the tracker caps it (~30 s)."""

    max_wait_seconds: float = 1800.0
    """Longest a node waits for another node's origin download before fetching from the origin itself."""

    lease_ttl: float = 30.0
    """Origin lease time-to-live, seconds; renewed every ttl/3 while the holder downloads."""

    lease_stall_min: float = 15.0
    """Least seconds a lease holder's reported bytes may stay the same before a waiting node takes its
    lease over. The bound is two heartbeat periods (2/3 lease_ttl: 20 s by default), but not less than
    this: the origin engine's bytes show in 1 MiB reads per connection, and a holder at 70 KB/s per
    connection must still count as progressing (taking its lease over adds an origin download)."""

    tracker_probe_interval: float = 5.0
    """Seconds between tracker health probes; a down→up transition re-registers what this node holds."""

    origin_patience: float = 600.0
    """Seconds a daemon job's origin requests keep asking an origin that rate-limits (429) or is
    unavailable (5xx, dropped connections) after the client's own bounded retries, counted from the
    request's last progress (`OriginSettings.patience`): for a job pods wait on, that is a wait, not a
    failure, and a lease holder keeps its partial blob and its lease meanwhile."""

    tracker_outage_grace: float = 30.0
    """Seconds a tracker outage may last before a blob with no peer progress goes to the origin. Until
    then the node keeps swarming with the peers it knows and asks the tracker again: a tracker restart
    must not send every node to the origin (N nodes x the model, and a likely 429)."""

    shutdown_timeout: float = 10.0
    """Seconds each component gets to stop at shutdown before the next one is stopped anyway."""

    job_history: int = 200
    """Finished jobs kept for `GET /v1/jobs/{id}`; older ones are forgotten first."""

    tracker_passkey: str | None = field(default=None, repr=False)
    """Announce passkey the tracker requires (--tracker-passkey-file): libtorrent announces to
    `<tracker>/announce/<passkey>`. Never logged (repr=False)."""

    publisher_token: str | None = field(default=None, repr=False)
    """The tracker's publisher-role token (--publisher-token-file): only it may register manifests of
    hub-less models (`agent publish`). None: this node cannot publish. Never logged (repr=False)."""

    admin_socket: Path | None = None
    """Unix socket of the node's admin channel (--admin-socket): every route (publish, rm, forget,
    fetch with the node's token, jobs, ls). Mode 0600: only the agent's user, i.e. the node's own CLI
    and operator, can connect. None = `<state-dir>/admin.sock`."""

    pods_socket: Path | None = None
    """Unix socket of the pods' channel (--pods-socket): request a model and follow its job, with the
    pod's own HF token (never the node's). Mode 0666: the credential is being able to mount the
    directory it lives in (the chart: a hostPath only workload pods mount). None = off."""

    metrics_on_network: bool = True
    """Serve `/metrics` on --api-listen too (for Prometheus); the admin channel always has it."""

    publish_roots: tuple[Path, ...] = ()
    """Directories `agent publish` may read from (--publish-root, repeatable); empty = publishing off."""

    buckets: tuple[str, ...] = ()
    """Bucket prefixes (s3://, gs://, az://) this node reads models from for a request (--bucket), with its
    own cloud credentials; a request naming any other bucket URL is refused. None by default: a pod that
    may ask the agent for a model must not reach whatever the node's identity can read."""

    registries: tuple[str, ...] = ()
    """OCI registry prefixes (oci://HOST[:PORT]/PREFIX) this node reads models from for a request
    (--registry), with its own registry credentials; any other oci:// reference is refused. None by default,
    as for buckets."""

    publish_unchecked_ids: bool = False
    """Publish even when the origin cannot say whether it knows the repo id (an air-gapped cluster;
    --publish-unchecked-ids). Off: a repo id the origin knows, or one it cannot be asked about, is refused."""

    publisher_public_key: bytes | None = field(default=None, repr=False)
    """PEM of the publisher's Ed25519 public key (--publisher-public-key-file): a hub-less model's
    manifest is planned from only when its signature verifies. None: hub-less models are refused."""

    publisher_signing_key: bytes | None = field(default=None, repr=False)
    """PEM of the publisher's Ed25519 private key (--publisher-signing-key-file): `agent publish`
    signs the manifests it registers. Never logged (repr=False)."""

    max_jobs: int = 64
    """Fetch jobs running at once, all channels together; more get 429 (disk and links are finite)."""

    max_jobs_per_client: int = 8
    """Fetch jobs one client may have running (a client: the pods' socket, one HF-endpoint client IP);
    the admin channel is not limited."""

    api_limits: ConnectionLimits = ConnectionLimits()
    """What the network listener holds (servekit.limits): 1,024 connections, 64 per client address, 10 s
    to send a request's headers, 5 s idle between requests, a head of 16 KiB, a body at 64 KiB/s after
    10 s (--api-max-connections, --api-max-connections-per-client, --api-header-timeout,
    --api-keepalive-timeout, --api-body-timeout; the unix sockets take the same). Anyone who can
    reach --api-listen can open connections: these caps keep them from the agent's own descriptors."""

    local_max_connections: int = 128
    """Connections each unix socket (admin, pods) holds at most: its own budget, so the network listener
    never starves it (nor it the network)."""

    fd_reserve: int | None = None
    """Open files kept for the agent's own work (libtorrent's peers and files, origin connections, the
    cache and state files) beyond what its listeners may hold (--fd-reserve). None: libtorrent's
    connections_limit + file_pool_size + the origin engine's connections + 256. The listeners' caps are
    lowered to fit the open-file limit (raised to its hard limit at start) less this."""


@dataclass(frozen=True)
class KubeSettings:
    """Pods in and out (agent.kube.pods_in, pods_out): which pods, how often, how patient."""

    enabled: bool = False
    """Watch this node's pods and report on them (--kube; `auto` = on when running in a cluster)."""

    node_name: str = ""
    """Node whose pods are watched (spec.nodeName; the chart passes the downward-API value). Required."""

    namespace: str | None = None
    """Watch only this namespace; None = all namespaces (needs a ClusterRole, not a Role)."""

    kubeconfig: Path | None = None
    """Kubeconfig file; None = in-cluster service account, else ~/.kube/config (for a laptop)."""

    status_min_interval: float = 2.0
    """Least seconds between status patches of one pod; progress in between is coalesced (latest wins).
    A model reaching Ready or Failed is patched at once."""

    watch_timeout: int = 300
    """timeoutSeconds of one watch request; the server then ends it and the watcher re-watches.
    Bounds how long a silently dead connection can go unnoticed."""

    request_timeout: float = 30.0
    """Seconds for a list, patch or event request (a watch waits watch_timeout plus this)."""

    backoff_base: float = 1.0
    """First reconnect delay in seconds after an API error or dropped watch; doubles, with jitter."""

    backoff_max: float = 60.0
    """Longest reconnect delay, seconds: an API server outage costs at most this much extra latency."""

    poll_interval: float = 1.0
    """Seconds between looks at the fetch jobs pods wait for (agent.kube.podsync); the status patches
    themselves are further limited by status_min_interval."""

    preheat: bool = True
    """Follow ModelPreheat objects and keep the models that select this node (--kube-preheat)."""

    node_labels: bool = True
    """Label this node with the models it holds, for node affinity (--kube-node-labels)."""

    preheat_status_interval: float = 10.0
    """Least seconds between progress writes of this node's entry on one ModelPreheat (a new phase is
    written at once): with a thousand nodes, every write is also a node list for the counts."""

    preheat_retry: float = 60.0
    """Seconds after a failed preheat fetch before this node tries it again."""


@dataclass(frozen=True)
class OpsSettings:
    """Node operations: the HF-compatible endpoint, cache eviction and pins (agent.daemon.nodeops)."""

    cache_max_bytes: int | None = None
    """Most bytes of blobs kept in the hub cache (--cache-max-bytes); None = no size limit."""

    cache_max_disk_percent: float | None = 85.0
    """Evict while the cache's filesystem is fuller than this percent (--cache-max-disk-percent; 100 = off):
    85 by default, so requests can never fill the node's disk until the kubelet evicts workloads. It counts
    the whole filesystem (what `df` shows), other files on it too, not the cache alone."""

    pins: tuple[str, ...] = ()
    """`REPO[@REV]` entries never evicted (--pin, repeatable); no @REV pins every revision of the repo."""

    eviction_interval: float = 30.0
    """Seconds between eviction passes; a fetch that needs room also triggers one at once."""

    access_ttl: float = 60.0
    """Seconds a client token's access decision from the origin is reused (keyed by a hash of the token)."""

    public_ttl: float = 600.0
    """Seconds the origin's word that a repo is public (not gated, not private) is trusted without asking."""

    partial_max_age: float = 7 * 86400.0
    """Seconds a partial download (`blobs/<id>.incomplete` and its resume record) may go untouched before
    the daemon's start removes it: no fetch came back for it (agent.cache.partials)."""

    hf_fetch_timeout: float = 3600.0
    """Longest an HF-endpoint GET of a file the node does not have waits for its first byte (then 504),
    and longest a streaming response waits for the next one (then it is cut short)."""


@dataclass(frozen=True)
class Settings:
    """Everything the agent needs, built once by the CLI."""

    cache_dir: Path
    """Hugging Face hub cache directory (models--org--name/...). vLLM mounts it read-only."""

    state_dir: Path
    """The agent's own state (resume records, digests, databases); never inside cache_dir."""

    origin: OriginSettings = field(default_factory=OriginSettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    swarm: SwarmSettings = field(default_factory=SwarmSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    ops: OpsSettings = field(default_factory=OpsSettings)

    @classmethod
    def from_env_defaults(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Defaults from the HF environment variables, then explicit overrides (None = default)."""
        env = os.environ if env is None else env
        given = {k: v for k, v in overrides.items() if v is not None}
        cache_dir = Path(str(given.pop("cache_dir", default_cache_dir(env)))).expanduser()
        state_dir = Path(str(given.pop("state_dir", default_state_dir(env)))).expanduser()
        origin = given.pop("origin", None)
        if origin is None:
            origin = OriginSettings(
                endpoint=default_origin(env), token=default_token(env), offline=default_offline(env),
                oci_auth_file=default_oci_auth_file(env),
            )
        fetch = given.pop("fetch", None) or FetchSettings()
        if given:
            raise TypeError(f"unknown settings: {sorted(given)}")
        assert isinstance(origin, OriginSettings) and isinstance(fetch, FetchSettings)
        return cls(cache_dir=cache_dir, state_dir=state_dir, origin=origin, fetch=fetch)
