"""The `agent` command line. Every option is also read from `WEIGHTSWARM_<OPTION>`.

Commands build a `Settings` once and hand it down; expected failures print one line to
stderr and exit non-zero (see `agent.core.errors`), never a traceback.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from agent.cli.common import choose_daemon, handle_errors, interruptible, local_agent_url, with_origin
from agent.cli.ops import register
from agent.core.settings import Settings
from agent.core.swarm_settings import DISK_IO
from clikit import SectionedCommand, env_option

# The headings that `agent fetch --help` and `agent serve --help` list their options under (the
# same in docs/configuration.md, which scripts/config_doc.py generates); each option names its own.
CACHE = "Cache and state"
ORIGIN = "Origin"
SWARM = "Tracker and swarm"
BITTORRENT = "BitTorrent"
CHANNELS = "Channels and connection limits"
EVICTION = "Eviction"
PUBLISHING = "Publishing"
KUBE = "Kubernetes"
LOGGING = "Logging"
WANTED = "What to fetch"
DAEMON = "Agent daemon"
OUTPUT = "Output"
SERVE_SECTIONS = (CACHE, ORIGIN, SWARM, BITTORRENT, CHANNELS, EVICTION, PUBLISHING, KUBE)
FETCH_SECTIONS = (WANTED, CACHE, ORIGIN, DAEMON, OUTPUT)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="weightswarm", prog_name="agent",
                      message="%(prog)s (weightswarm) %(version)s")
@env_option("--log-level", section=LOGGING,
            default="WARNING", help="Logging level (DEBUG, INFO, WARNING, ERROR).")
@env_option("--log-format", section=LOGGING,
            default="text", show_default=True, type=click.Choice(["text", "json"]),
            help="Log lines as text or as one JSON object per line (tokens are redacted either way).")
def main(log_level: str, log_format: str) -> None:
    """weightswarm node agent: model weights into a Hugging Face hub cache, peer to peer."""
    from agent.cli.logs import setup_logging

    setup_logging(log_level, log_format)


@main.command("fetch", cls=SectionedCommand, sections=FETCH_SECTIONS)
@click.argument("repo_id", metavar="REPO_ID[@REV]")
@env_option("--repo-id", "as_repo_id", section=WANTED, metavar="ORG/NAME",
            help="With a bucket URL (s3://, gs://, az://) or an oci:// reference for REPO_ID: the repo id "
                 "it is cached as.")
@env_option("--revision", section=WANTED,
            help="Branch, tag or commit to fetch (or REPO_ID@REV) [default: main].")
@env_option("--include", section=WANTED,
            multiple=True, metavar="GLOB", help="Only files matching (repeatable, fnmatch).")
@env_option("--exclude", section=WANTED,
            multiple=True, metavar="GLOB", help="Skip files matching (repeatable, fnmatch).")
@env_option("--cache-dir", section=CACHE, type=click.Path(path_type=Path, file_okay=False),
            help="Hub cache directory [default: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub].")
@env_option("--state-dir", section=CACHE, type=click.Path(path_type=Path, file_okay=False),
            help="The agent's resume/digest state [default: ~/.local/state/weightswarm].")
@env_option("--origin", section=ORIGIN,
            metavar="URL", help="Hub endpoint [default: $HF_ENDPOINT or https://huggingface.co].")
@env_option("--token", section=ORIGIN,
            metavar="TOKEN", help="Hub token for gated/private repos [default: $HF_TOKEN].")
@env_option("--origin-timeout", section=ORIGIN, type=click.FloatRange(min=1), metavar="SECONDS",
            help="Give up on an origin that answers nothing (refused, unknown host, silent) after this "
                 "long, with exit 8 [60].")
@env_option("--connections-per-file", section=ORIGIN,
            type=click.IntRange(1, 64), help="Parallel ranges per file [8].")
@env_option("--files-at-once", section=ORIGIN,
            type=click.IntRange(1, 64), help="Files downloaded concurrently [4].")
@env_option("--oci-plain-http", section=ORIGIN, metavar="HOST:PORT,...",
            help="OCI registries spoken to over plain HTTP, comma-separated (as oras's --plain-http); "
                 "every other one over HTTPS only.")
@env_option("--quiet", section=OUTPUT,
            is_flag=True, default=False, help="No progress output; the snapshot path only.")
@env_option("--agent", "agent_url", section=DAEMON, metavar="URL",
            help="Hand the fetch to the agent daemon at URL: its admin socket, unix:///PATH ('off' = "
                 "standalone) [default: the admin socket of the default state dir, "
                 "unix://~/.local/state/weightswarm/admin.sock, if it answers and no --cache-dir, "
                 "--state-dir or --origin is given].")
@handle_errors
def fetch_command(repo_id: str, as_repo_id: str | None, revision: str | None, include: tuple[str, ...],
                  exclude: tuple[str, ...], cache_dir: Path | None, state_dir: Path | None,
                  origin: str | None, token: str | None, origin_timeout: float | None,
                  connections_per_file: int | None, files_at_once: int | None, oci_plain_http: str | None,
                  quiet: bool, agent_url: str | None) -> None:
    """Download REPO_ID (org/name) into the hub cache, verified; print the snapshot path last.

    REPO_ID may be a bucket URL (s3://bucket/prefix, gs://, az://) with --repo-id ORG/NAME: the model
    stored there in the Hugging Face layout, read with this machine's cloud credentials; or an OCI
    reference (oci://REGISTRY[:PORT]/REPOSITORY:TAG or @sha256:DIGEST, a ModelPack or ORAS artifact)
    with --repo-id ORG/NAME, read with the docker config's registry credentials.

    Ctrl-C or SIGTERM stops within a second, keeping partial files: the same command resumes them.
    Handed to the agent daemon, the fetch goes on there; the same command follows it again.

    Exit codes: 0 verified, 1 any other failure, 2 usage, 3 not found, 4 refused (gated, wrong token),
    5 disk full or cache unusable, 6 bad content, 7 the agent daemon stopped before it finished, 8 origin
    unreachable or failing, 9 agent daemon unreachable or refusing, 130 interrupted (143 on SIGTERM)."""
    from agent.core.progress import Progress, human_bytes
    from agent.origin.bucket_url import is_bucket_url
    from agent.origin.oci.reference import is_oci_url, parse_oci_url, plain_http_hosts

    source = ""
    if is_oci_url(repo_id):
        if not as_repo_id:
            raise click.UsageError("an oci:// reference needs --repo-id ORG/NAME: the id it is cached as")
        source, repo_id = parse_oci_url(repo_id).url, as_repo_id
        revision = revision or parse_oci_url(source).revision
    elif not is_bucket_url(repo_id) and "@" in repo_id:
        repo_id, _, at_rev = repo_id.partition("@")
        if revision is not None and revision != at_rev:
            raise click.UsageError(f"REPO_ID@{at_rev} and --revision {revision} disagree; give one")
        revision = at_rev or revision
    revision = revision or "main"
    if is_bucket_url(repo_id):
        if not as_repo_id:
            raise click.UsageError("a bucket URL needs --repo-id ORG/NAME: the id the model is cached as")
        source, repo_id = repo_id, as_repo_id
    elif as_repo_id and not source:
        raise click.UsageError("--repo-id goes with a bucket URL (s3://, gs://, az://) or an oci:// "
                               "reference in place of REPO_ID")
    settings = Settings.from_env_defaults(cache_dir=cache_dir, state_dir=state_dir)
    daemon_url = choose_daemon(agent_url, explicit_local=bool(cache_dir or state_dir or origin))
    if daemon_url is not None:
        from agent.http.client import fetch_via_agent

        # The user's token (--token, else $HF_TOKEN) goes with the request: the daemon fetches with it.
        with interruptible(f"the agent at {daemon_url} keeps fetching {repo_id}@{revision}; run the same "
                           "command again to follow it"):
            status = fetch_via_agent(daemon_url, repo_id, revision, include, exclude, Progress(quiet=quiet),
                                     token=token or settings.origin.token, source=source)
        click.echo(status["snapshot"])
        return

    from agent.fetch.engine import fetch_snapshot  # not on the daemon's path: it starts faster without

    settings = with_origin(settings, source or origin, None if source else token)
    settings = replace(
        settings,
        origin=replace(settings.origin, answer_within=origin_timeout or settings.origin.answer_within,
                       oci_plain_http=plain_http_hosts(oci_plain_http)),
        fetch=replace(settings.fetch,
                      connections_per_file=connections_per_file or settings.fetch.connections_per_file,
                      files_at_once=files_at_once or settings.fetch.files_at_once),
    )
    progress = Progress(quiet=quiet)
    with interruptible(f"partial files kept in {settings.cache_dir}; run the same command again to "
                       "resume") as before_exit:
        result = fetch_snapshot(settings, repo_id, revision, include, exclude, progress, before_exit)
    if not result.downloaded:
        progress.message(f"{repo_id}@{result.commit[:12]}: all {len(result.files)} files already in the "
                         "cache; nothing downloaded")
    else:
        progress.message(f"{repo_id}@{result.commit[:12]}: {len(result.downloaded)} files fetched, "
                         f"{human_bytes(result.bytes_from_origin)} from the origin, "
                         f"{human_bytes(result.bytes_cached)} already cached")
    click.echo(str(result.snapshot_path))


@main.command("serve-hub")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@env_option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@env_option("--port", default=8080, show_default=True, type=int, help="TCP port (0 = any free port).")
@env_option("--token-file", type=click.Path(path_type=Path, dir_okay=False),
            help="File with accepted bearer tokens, one per line (default: accept any token).")
@env_option("--gated", multiple=True, metavar="REPO_ID", help="Repo whose files need a token (repeatable).")
@env_option("--private", multiple=True, metavar="REPO_ID", help="Repo hidden without a token (repeatable).")
@env_option("--rate-total", metavar="BYTES_PER_S", help="Cap on all connections together, e.g. 40MB.")
@env_option("--rate-per-connection", metavar="BYTES_PER_S", help="Cap per connection (as a CDN), e.g. 10MB.")
@env_option("--rate-per-client", metavar="BYTES_PER_S", help="Cap per client address (as a CDN), e.g. 40MB.")
@env_option("--access-log", is_flag=True,
            help="A line per request on stderr: client, method, path, Range, status (no query, no token).")
@env_option("--answers", type=click.Choice(["2026", "2024"]), default="2026", show_default=True,
            help="Answer as huggingface.co does now (small files: 307 to /api/resolve-cache/; LFS: 302 with "
                 "Xet headers to a signed, expiring URL on the CDN port; rate limits) or as in 2024 (small "
                 "files direct; LFS: 302 to /_cdn/ on the same port; no limits).")
@env_option("--cdn-port", default=0, show_default=True, type=int,
            help="Port of the CDN listener that serves the signed LFS URLs in 2026: another origin, on "
                 "--host like the hub (0 = any free port; its URL is printed on stderr at start). Open it "
                 "wherever --port is reachable.")
@env_option("--cdn-url-ttl", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
            help="Seconds a signed LFS URL stays valid; a request that starts later gets a 403 "
                 "[default: 3600 in 2026, as the Hub's X-Amz-Expires; 86400 in 2024].")
@env_option("--streams-per-file", default=0, show_default=True, type=click.IntRange(min=0),
            help="Bodies of one file the CDN sends one client address at once; one more gets a 403, as the "
                 "Hub's download host refuses multi-threaded downloads (0 = any number).")
@env_option("--rate-limits/--no-rate-limits", default=None, envvar="WEIGHTSWARM_RATE_LIMITS",
            help="The Hub's request limits per client and 5-minute window (anonymous IP: 500 api, 3,000 "
                 "resolvers; token: 1,000 / 5,000), 429 with RateLimit headers past them "
                 "[default: on in 2026, off in 2024].")
@handle_errors
def serve_hub_command(
    directory: Path,
    host: str,
    port: int,
    token_file: Path | None,
    gated: tuple[str, ...],
    private: tuple[str, ...],
    rate_total: str | None,
    rate_per_connection: str | None,
    rate_per_client: str | None,
    access_log: bool,
    answers: str,
    cdn_port: int,
    cdn_url_ttl: float | None,
    rate_limits: bool | None,
    streams_per_file: int,
) -> None:
    """Serve a directory as a Hugging Face-compatible hub, e.g. for air-gapped clusters.

    DIRECTORY holds one folder per repo, DIRECTORY/<org>/<name>/, with the files of its `main`
    branch. Clients use it as HF_ENDPOINT (or `agent fetch --origin URL`). Prints the URL once
    listening (and, on stderr, the CDN's); runs until SIGTERM or SIGINT.

    By default it answers as huggingface.co does now: LFS files redirect to signed URLs on a second
    port (--cdn-port) that clients treat as another host, so that port must be reachable too.
    """
    from agent.hub.serve import serve_hub

    serve_hub(directory, host=host, port=port, token_file=token_file, gated=gated, private=private,
              rate_total=rate_total, rate_per_connection=rate_per_connection, rate_per_client=rate_per_client,
              access_log=access_log, answers=answers, cdn_port=cdn_port, cdn_url_ttl=cdn_url_ttl,
              rate_limits=rate_limits, streams_per_file=streams_per_file)


@main.command("make-test-model")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.argument("repo_id")
@env_option("--size", default="64MiB", show_default=True, help="Tensor bytes in total, e.g. 64MiB, 2GB.")
@env_option("--shards", default=4, show_default=True, type=click.IntRange(min=1), help="Safetensors shards.")
@env_option("--seed", default=0, show_default=True, type=int, help="Seed of the deterministic contents.")
@env_option("--dtype", default="F16", show_default=True, help="safetensors dtype (F16, BF16, F32, ...).")
@handle_errors
def make_test_model_command(
    directory: Path, repo_id: str, size: str, shards: int, seed: int, dtype: str
) -> None:
    """Write a deterministic random safetensors model to DIRECTORY/<org>/<name>/ (for serve-hub)."""
    from agent.hub.serve import make_test_model

    click.echo(make_test_model(directory, repo_id, size=size, shards=shards, seed=seed, dtype=dtype))


@main.command("serve", cls=SectionedCommand, sections=SERVE_SECTIONS)
@env_option("--cache-dir", section=CACHE, type=click.Path(path_type=Path, file_okay=False),
            help="Hub cache directory [default: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub].")
@env_option("--state-dir", section=CACHE, type=click.Path(path_type=Path, file_okay=False),
            help="Resume data, digests [default: ~/.local/state/weightswarm].")
@env_option("--tracker", section=SWARM,
            metavar="URL", help="Tracker base URL, e.g. http://tracker:6969 [default: none].")
@env_option("--tracker-token-file", section=SWARM, type=click.Path(path_type=Path, dir_okay=False),
            help="File holding the tracker's agent-role token (reads, metainfo, leases).")
@env_option("--tracker-passkey-file", section=SWARM, type=click.Path(path_type=Path, dir_okay=False),
            help="File holding the tracker's announce passkey (BitTorrent announces and scrapes).")
@env_option("--publisher-token-file", section=PUBLISHING, type=click.Path(path_type=Path, dir_okay=False),
            help="File holding the tracker's publisher-role token; without it `agent publish` is refused.")
@env_option("--origin", section=ORIGIN,
            metavar="URL", help="Hub endpoint [default: $HF_ENDPOINT or https://huggingface.co].")
@env_option("--token", section=ORIGIN,
            metavar="TOKEN", help="Hub token for gated/private repos [default: $HF_TOKEN].")
@env_option("--origin-timeout", section=ORIGIN, type=click.FloatRange(min=1), metavar="SECONDS",
            help="Give up on an origin that answers nothing (refused, unknown host, silent) after this "
                 "long [60].")
@env_option("--bucket", "buckets", section=ORIGIN, multiple=True, metavar="URL",
            help="A bucket prefix (s3://, gs://, az://) requests may read models from, with this node's "
                 "cloud credentials (repeatable; none by default).")
@env_option("--registry", "registries", section=ORIGIN, multiple=True, metavar="oci://HOST[:PORT]/PREFIX",
            help="An OCI registry prefix requests may read models from, with this node's docker config "
                 "credentials (repeatable; none by default).")
@env_option("--oci-plain-http", section=ORIGIN, metavar="HOST:PORT,...",
            help="OCI registries spoken to over plain HTTP, comma-separated; others over HTTPS only.")
@env_option("--bt-listen", section=BITTORRENT, default="0.0.0.0:6881", show_default=True, metavar="HOST:PORT",
            help="BitTorrent listen address (port 0 = any free port).")
@env_option("--api-listen", section=CHANNELS,
            default="127.0.0.1:7470", show_default=True, metavar="HOST:PORT",
            help="Network listener: probes, /metrics and the HF-compatible endpoint only.")
@env_option("--api-max-connections", section=CHANNELS,
            default=1024, show_default=True, type=click.IntRange(16),
            help="Connections --api-listen holds at once; more are answered 503 and closed (lowered to fit "
                 "the open-file limit less --fd-reserve).")
@env_option("--api-max-connections-per-client", section=CHANNELS,
            default=64, show_default=True, type=click.IntRange(1),
            help="Connections one client address may hold on --api-listen.")
@env_option("--api-header-timeout", section=CHANNELS,
            default=10.0, show_default=True, type=click.FloatRange(min=0.1),
            metavar="SECONDS", help="Time a connection has to send a request's headers (every listener).")
@env_option("--api-keepalive-timeout", section=CHANNELS,
            default=5.0, show_default=True, type=click.FloatRange(min=0.1),
            metavar="SECONDS", help="Time a connection may sit idle between requests (every listener).")
@env_option("--api-body-timeout", section=CHANNELS,
            default=10.0, show_default=True, type=click.FloatRange(min=0.1),
            metavar="SECONDS", help="Time a request's announced body has to start arriving, after which "
                                    "it must average 64 KiB/s (every listener); else 408 and close.")
@env_option("--probe-listen", section=CHANNELS, metavar="HOST:PORT",
            help="Probe port: /healthz and /readyz only, with connection limits of its own, so probes are "
                 "answered while --api-listen is flooded [default: off].")
@env_option("--fd-reserve", section=CHANNELS, type=click.IntRange(0), metavar="N",
            help="Open files kept for the agent's own work beyond its listeners' caps [default: libtorrent's "
                 "peers and files + the origin connections + 256].")
@env_option("--admin-socket", section=CHANNELS, type=click.Path(path_type=Path, dir_okay=False),
            help="Unix socket (mode 0600) of the admin channel: every route, for this node's CLI "
                 "[default: STATE_DIR/admin.sock].")
@env_option("--pods-socket", section=CHANNELS, type=click.Path(path_type=Path, dir_okay=False),
            help="Unix socket (mode 0666) where pods that mount its directory request models with their "
                 "own HF token [default: off].")
@env_option("--metrics-on-network/--no-metrics-on-network", section=CHANNELS, default=True, show_default=True,
            help="Serve /metrics on --api-listen as well as on the admin socket.")
@env_option("--publish-root", "publish_roots", section=PUBLISHING, multiple=True,
            type=click.Path(path_type=Path, file_okay=False),
            help="Directory `agent publish` may read (repeatable) [default: none, publishing is off].")
@env_option("--publish-unchecked-ids", section=PUBLISHING, is_flag=True, default=False,
            help="Publish a repo id even when the origin cannot be asked whether it has it (air-gapped).")
@env_option("--publisher-public-key-file", section=PUBLISHING,
            type=click.Path(path_type=Path, dir_okay=False),
            help="The publisher's Ed25519 public key (PEM): hub-less models must be signed by it.")
@env_option("--publisher-signing-key-file", section=PUBLISHING,
            type=click.Path(path_type=Path, dir_okay=False),
            help="The publisher's Ed25519 private key (PEM), to sign what `agent publish` registers.")
@env_option("--interop-public", section=SWARM, is_flag=True, default=False,
            help="Let stock BitTorrent clients exchange bytes of models the origin reports public.")
@env_option("--peer-gate/--no-peer-gate", section=SWARM, default=True, show_default=True,
            help="Admit only the cluster's agents as BitTorrent peers; off only to measure its cost.")
@env_option("--relay-fanout", section=SWARM, type=click.IntRange(min=0), metavar="N",
            help="Streams of one arriving blob relayed to other agents at once (0 = no relay) [3].")
@env_option("--relay-min-rate", section=SWARM, type=click.IntRange(min=0), metavar="BYTES_PER_S",
            help="A relay source slower than this over the relay's stall time is left for another source "
                 "or way (0 = only one that sends no byte is) [65536].")
@env_option("--relay-seeds/--no-relay-seeds", section=SWARM, default=True, show_default=True,
            help="Offer blobs seeded whole as relay sources, and take a blob some node has whole as a "
                 "chain of relays before BitTorrent (a warm start at the links' full rate).")
@env_option("--origin-holders", section=ORIGIN, type=click.IntRange(min=1), metavar="N",
            help="At most this many nodes pull disjoint parts of one large blob from the origin at "
                 "once; how many do is measured per blob (1 = one holder, no parts) [1].")
@env_option("--origin-part-min", section=ORIGIN, type=click.IntRange(min=1), metavar="BYTES",
            help="Least bytes of such a part; smaller blobs have one holder [67108864].")
@env_option("--disk-io", section=BITTORRENT, type=click.Choice(DISK_IO),
            help="libtorrent's disk I/O: pread/pwrite, a memory map of each file, or plain "
                 "reads and writes [pread].")
@env_option("--super-seed/--no-super-seed", section=BITTORRENT, default=False, show_default=True,
            help="Seed complete blobs in libtorrent's super-seeding mode: a lone seed sends each piece "
                 "about once to many receivers, at ~10 s more per connection.")
@env_option("--peer-socket-buffer", section=BITTORRENT, type=click.IntRange(min=0), metavar="BYTES",
            help="The kernel's receive buffer of each peer connection, which bounds the agent's own "
                 "buffer per connection (0 = the kernel's autotuning) [524288].")
@env_option("--node-name", section=SWARM, metavar="NAME", help="This node's name [default: the hostname].")
@env_option("--upload-rate-limit", section=BITTORRENT, type=click.IntRange(min=0), metavar="BYTES_PER_S",
            help="BitTorrent upload cap, bytes/s (0 = unlimited); a capped node passes no whole blob on "
                 "over the relay (--relay-seeds is off there).")
@env_option("--download-rate-limit", section=BITTORRENT, type=click.IntRange(min=0), metavar="BYTES_PER_S",
            help="BitTorrent download cap, bytes/s (0 = unlimited).")
@env_option("--stall-timeout", section=SWARM, type=click.FloatRange(min=1), metavar="SECONDS",
            help="No progress from peers for this long -> the origin-lease path [60].")
@env_option("--lease-ttl", section=SWARM,
            type=click.FloatRange(min=3), metavar="SECONDS", help="Origin lease TTL [30].")
@env_option("--resume-interval", section=BITTORRENT, type=click.FloatRange(min=0.5), metavar="SECONDS",
            help="Resume data saved this often while downloading: progress a crash can lose [30].")
@env_option("--cache-max-bytes", section=EVICTION,
            metavar="BYTES", help="Evict LRU blobs to keep the cache under this size.")
@env_option("--cache-max-disk-percent", section=EVICTION,
            type=click.FloatRange(1, 100), default=85.0, show_default=True,
            metavar="PERCENT", help="Evict LRU blobs while the cache's filesystem (all of it, as df "
                                    "counts) is fuller than this (100 = off).")
@env_option("--pin", "pins", section=EVICTION,
            multiple=True, metavar="REPO[@REV]", help="Never evict this model (repeatable).")
@env_option("--kube", section=KUBE,
            default="auto", show_default=True, type=click.Choice(["auto", "on", "off"]),
            help="Watch this node's pods for weightswarm.io/models and report status on them "
                 "(auto = on inside a cluster, i.e. when KUBERNETES_SERVICE_HOST is set).")
@env_option("--kubeconfig", section=KUBE, type=click.Path(path_type=Path, dir_okay=False),
            help="Kubeconfig for the pod watcher [default: the pod's service account, else ~/.kube/config].")
@env_option("--watch-namespace", section=KUBE, metavar="NAMESPACE",
            help="Watch pods of this namespace only (a Role suffices) [default: all namespaces].")
@env_option("--kube-preheat", section=KUBE, default="on", show_default=True, type=click.Choice(["on", "off"]),
            help="With --kube: keep the models of the ModelPreheat objects that select this node.")
@env_option("--kube-node-labels", section=KUBE,
            default="on", show_default=True, type=click.Choice(["on", "off"]),
            help="With --kube: label this node model.weightswarm.io/<name>.<hash>=<commit> for each "
                 "requested model it holds (see `agent label-key`).")
@handle_errors
def serve_command(kube: str, cache_max_bytes: str | None, cache_max_disk_percent: float,
                  pins: tuple[str, ...], **options: Any) -> None:
    """Run the node daemon: seed the cache, fetch through the swarm, serve the node's channels."""
    from agent.daemon.node import serve_forever
    from agent.daemon.serve_settings import build_serve_settings

    # The one place that decides "am I in a cluster": kubelet sets this in every container.
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    settings = build_serve_settings(kube=kube == "on" or (kube == "auto" and in_cluster), **options)
    from agent.cli.ops import with_ops_settings

    serve_forever(with_ops_settings(settings, cache_max_bytes, cache_max_disk_percent, pins))


@main.command("wait")
@click.argument("model", metavar="REPO_ID[@REV] | REPO_ID=BUCKET_URL")
@env_option("--timeout", default=3600.0, show_default=True, type=click.FloatRange(min=0), metavar="SECONDS",
            help="Give up (exit 7) when the model is not complete by then.")
@env_option("--agent", "agent_url", metavar="URL",
            help="The node's agent: in a pod its pods' socket, unix:///run/weightswarm/pods.sock "
                 "[default: the admin socket of the default state dir].")
@env_option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
            help="Hub cache checked directly while the agent is unreachable "
                 "[default: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub].")
@env_option("--token", metavar="TOKEN",
            help="Hub token the agent fetches a gated/private repo with [default: $HF_TOKEN].")
@env_option("--quiet", is_flag=True, default=False, help="No progress output; the snapshot path only.")
@handle_errors
def wait_command(model: str, timeout: float, agent_url: str | None, cache_dir: Path | None, token: str | None,
                 quiet: bool) -> None:
    """Block until REPO_ID[@REV] is complete on this node (an init container's job); print its path last.

    Asks the agent to fetch it (so no pod annotation is needed) and shows its progress; while the
    agent is unreachable, checks the hub cache itself. Exit 0 when complete, non-zero with the
    reason on failure or timeout.

    Exit codes: 0 complete, 1 any other failure, 2 usage (a malformed model reference), 3 not found,
    4 refused (gated, wrong token), 5 disk full or cache unusable, 6 bad content, 7 timed out (--timeout)
    or the agent stopped first, 8 origin unreachable or failing, 9 the agent refused the request,
    130 interrupted (143 on SIGTERM).
    """
    from agent.cli.wait import wait_for_model
    from agent.core.progress import Progress
    from agent.http.client import agent_url as normalise
    from agent.kube.requests import parse_model_ref

    ref = parse_model_ref(model.strip())
    settings = Settings.from_env_defaults(cache_dir=cache_dir)
    snapshot = wait_for_model(ref, timeout=timeout, agent_url=normalise(agent_url or local_agent_url()),
                              cache_dir=settings.cache_dir, progress=Progress(quiet=quiet),
                              token=token or settings.origin.token)
    click.echo(str(snapshot))


@main.command("label-key")
@click.argument("model", metavar="REPO_ID[@REV]")
@handle_errors
def label_key_command(model: str) -> None:
    """Print the node label key that marks nodes holding REPO_ID[@REV], for node affinity."""
    from agent.kube.labels import model_label_key
    from agent.kube.requests import parse_model_ref

    click.echo(model_label_key(parse_model_ref(model.strip()).key))


@main.command("ls")
@env_option("--agent", "agent_url", metavar="URL",
            help="The agent daemon to ask [default: the admin socket of the default state dir].")
@env_option("--json", "as_json", is_flag=True, default=False,
            help="Print the daemon's (with --cluster: the tracker's) JSON answer.")
@env_option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
            help="List this hub cache directly, without a daemon [default: ask the daemon, else the "
                 "default cache].")
@env_option("--cluster", is_flag=True, default=False,
            help="List every model the tracker knows and which nodes (BitTorrent ip:port) hold it, "
                 "instead of this node's cache (--agent and --cache-dir are then unused).")
@env_option("--tracker", metavar="URL", help="With --cluster: the tracker's base URL, e.g. http://tracker:6969.")
@env_option("--tracker-token-file", type=click.Path(path_type=Path, dir_okay=False),
            help="With --cluster: file holding the tracker's agent-role token (node addresses are "
                 "the agents' alone).")
@handle_errors
def ls_command(agent_url: str | None, as_json: bool, cache_dir: Path | None, cluster: bool,
               tracker: str | None, tracker_token_file: Path | None) -> None:
    """List the models in the agent's cache: repo, revision -> commit, files, size, blobs seeded.

    With --cluster, the models the tracker knows instead: per commit its complete copies in the swarm
    and the nodes holding every file (HOLDERS, their BitTorrent ip:port)."""
    import json

    from agent.core.progress import human_bytes

    if cluster:
        from agent.cli.ops import cluster_models, cluster_rows

        known = cluster_models(tracker, tracker_token_file)
        if as_json:
            click.echo(json.dumps({"models": known}, indent=2))
            return
        click.echo(f"{'REPO':<40} {'REVISIONS':<12} {'COMMIT':<12} {'FILES':>5} {'SIZE':>11} {'COPIES':>6} "
                   "HOLDERS")
        for repo, refs, commit, files, size, copies, holders in cluster_rows(known):
            click.echo(f"{repo:<40} {refs:<12} {commit:<12} {files:>5} {human_bytes(size):>11} {copies:>6} "
                       f"{holders}")
        return

    from agent.cli.ops import list_models

    models = list_models(agent_url, cache_dir)
    if as_json:
        click.echo(json.dumps(models, indent=2))
        return
    click.echo(f"{'REPO':<40} {'REVISION':<12} {'COMMIT':<12} {'FILES':>5} {'SIZE':>11} {'SEEDING':>7}")
    for m in models:
        by_commit = {c: r for r, c in m["refs"].items()}
        for snap in m["snapshots"]:
            rev = by_commit.get(snap["commit"], "-")
            click.echo(f"{m['repo_id']:<40} {rev:<12} {snap['commit'][:12]:<12} "
                       f"{snap['files']:>5} {human_bytes(snap['bytes']):>11} {snap['seeding']:>7}")
        # A download that did not finish holds disk too: SIZE is what it holds, then the file it is.
        for p in m.get("partials") or []:
            listed = f" of {human_bytes(p['size'])}" if p["size"] else ""
            click.echo(f"{m['repo_id']:<40} {'(partial)':<12} {p['commit'][:12]:<12} {1:>5} "
                       f"{human_bytes(p['bytes']):>11} {'-':>7}  {p['path']}{listed}")


register(main)  # the node-ops commands: rm, verify, publish
