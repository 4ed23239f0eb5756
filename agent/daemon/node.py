"""`agent serve`: the node daemon. Wiring and lifecycle, no policy (that is agent.fetch.sources.policy).

Construction builds every part (the BitTorrent session first) and hands each only what it uses:
callables and small parts, never the daemon. Start-up, in order: seeding of every complete blob
already in the cache (agent.swarm.seeding: resume data, else the sidecar's piece hashes, no
re-hash); the supervised background tasks (tracker probe / re-registration, piece backfill,
eviction, the pod watcher); the HTTP API last, so `/readyz` answers only when the node can serve.
Shutdown runs the other way round, each step bounded by `daemon.shutdown_timeout`.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cache.eviction import repo_id_of, scan_repo
from agent.cache.layout import RepoCache, StateDir, check_repo_id
from agent.cache.partials import partials_of, sweep_partials
from agent.core.errors import ConfigError, WeightswarmError
from agent.core.modelnames import ModelNames
from agent.core.plan import SMALL_FILE_BYTES
from agent.core.progress import human_bytes
from agent.core.settings import Settings, default_admin_socket
from agent.daemon.arenas import limit_malloc_arenas, trim_loop
from agent.daemon.listeners import (
    ApiServer,
    listener_limits,
    split_hostport,
    tcp_listener,
    unix_listener,
)
from agent.daemon.nodeops import NodeOps, label_key
from agent.daemon.threadnames import name_os_threads
from agent.fetch.job import FetchContext, run_fetch_job
from agent.fetch.jobs import Job, JobKey, JobTable
from agent.fetch.layers import clear_layers
from agent.fetch.sources.policy import SourcePolicy
from agent.http.api import ADMIN, PODS, NodeApi, create_app
from agent.origin.bucket_url import allowed_bucket
from agent.origin.chunks import Turn
from agent.origin.oci.reference import allowed_registry, is_oci_url, parse_oci_url
from agent.relay.directory import RelayDirectory, relay_credential
from agent.relay.receiver import RelayReceiver
from agent.swarm.gate import PeerGate
from agent.swarm.seeding import Seeder
from agent.swarm.session import Swarm
from agent.tracking.client import TrackerClient
from servekit.limits import ConnectionLimits

if TYPE_CHECKING:
    from agent.kube.podsync import PodSync

log = logging.getLogger(__name__)

_RESTART_DELAY = (1.0, 30.0)
"""Backoff bounds (seconds) before a failed background task runs again."""
_JOBS_AT_ONCE = 4


class Supervisor:
    """Endless background tasks: a failure is logged at once and the task restarts after a backoff;
    a task that returns while the daemon runs is an error too (it should loop until `stop`)."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._threads: list[threading.Thread] = []
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()

    def spawn(self, name: str, task: Callable[[threading.Event], None]) -> None:
        t = threading.Thread(target=self._run, args=(name, task), name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _run(self, name: str, task: Callable[[threading.Event], None]) -> None:
        delay = _RESTART_DELAY[0]
        while not self._stop.is_set():
            try:
                task(self._stop)
                if self._stop.is_set():
                    return
                problem = "returned unexpectedly"
                log.error("background task %s %s; restarting it in %.0fs", name, problem, delay)
            except Exception as exc:
                problem = f"failed: {type(exc).__name__}: {exc}"
                log.exception("background task %s failed; restarting it in %.0fs", name, delay)
            with self._lock:
                self._failing[name] = problem
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, _RESTART_DELAY[1])
            with self._lock:
                self._failing.pop(name, None)

    def problems(self) -> list[str]:
        with self._lock:
            return [f"{name} {problem}" for name, problem in self._failing.items()]

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("background task %s did not stop within %.0fs", t.name, timeout)


class Daemon:
    """One node's agent: BitTorrent session, tracker client, fetch jobs, API.

    Complete when constructed: the session, the tracker client, the seeder, the fetch policy, the
    node operations, the pod watcher (with `--kube`) and the API server are built here, each handed
    only the parts it uses; `start()` restores seeding and starts the tasks and the API.
    """

    def __init__(self, settings: Settings) -> None:
        s = self.settings = settings
        for d in (s.cache_dir, s.state_dir):
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create {d}: {exc.strerror}") from None
        self.jobs = JobTable(history=s.daemon.job_history)
        self._stop = threading.Event()
        self._supervisor = Supervisor(self._stop)
        self._executor = ThreadPoolExecutor(max_workers=_JOBS_AT_ONCE, thread_name_prefix="job")
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preheat")
        """Preheat work, one model at a time, each yielding to every other job (`JobTable.wait_turn`)."""
        self._token_key = secrets.token_bytes(32)
        """Keys the hash that tells requesters' tokens apart (JobKey.requester); never leaves memory."""
        self._public_memo: tuple[tuple[frozenset[str], frozenset[tuple[str, str]]], set[str]] | None = None
        """The last `_public_torrents` answer and what it was computed from."""
        self._tracker_up: bool | None = None
        """The last probe's answer; None before the first."""
        self.servers: list[ApiServer] = []
        """The channels (docs/security.md): the admin socket, the pods' socket, the network."""
        self.swarm = Swarm(s.swarm, StateDir(s.state_dir).resume)
        try:
            # Several agents may share a host (tests, the demo): the BitTorrent port tells them apart.
            self.node_id = f"{s.daemon.node_name}:{self.swarm.listen_port}"
            self.tracker = (
                TrackerClient(s.daemon.tracker_url, s.daemon.tracker_token, s.daemon)
                if s.daemon.tracker_url
                else None
            )
            self.seeder = Seeder(self.swarm, self.tracker, s.cache_dir, s.state_dir)
            credential = relay_credential(s)
            relay = (
                RelayDirectory(self.tracker, lambda: self.api_server.port, credential, self.swarm.admits)
                if self.tracker is not None and credential is not None
                else None
            )
            """This node among the relay sources of the blobs it pulls or receives (agent.relay.directory)."""
            if relay is not None and s.swarm.chains_seeds:
                relay.seeds = self._relay_seeds
            self.fetcher = SourcePolicy(
                s, self.swarm, self.tracker, self.node_id, self.seeder.remember, relay=relay
            )
            stall, connect = self.fetcher.holder_stall, s.origin.connect_timeout
            self.relay = RelayReceiver(relay, stall, connect, s.swarm.relay_min_rate) if relay else None
            self.names = ModelNames(label_key(s), self._is_public)
            """How metrics and log lines name a model (agent.core.modelnames); asked only once jobs run."""
            self.ops = NodeOps(
                s, self.jobs, self.swarm, self.seeder, self.tracker, self.request_model,
                self.fetcher.arrivals, self.fetcher.holder_stall, self.names,
            )
            """Metrics, eviction, the HF-compatible endpoint and admin routes (agent.daemon.nodeops)."""
            self._fetch = FetchContext(
                s, self.fetcher, self.tracker, self.ops.before_fetch, self.seeder.held,
                self._turn_of, self.names, self.relay, stopping=self._stop,
            )
            public = self._public_torrents if s.swarm.interop_public else None
            self.gate = PeerGate(self.swarm, self.tracker, s.swarm.peer_gate_refresh, public)
            """Admits BitTorrent peers: the cluster's agents only (agent.swarm.gate)."""
            self.podsync = self._pod_sync() if s.kube.enabled else None
            """The pod watcher and status reporter (agent.kube.podsync) with `--kube`."""
            node = NodeApi(self.request_model, self.jobs, self.list_models, self.problems)
            self.admin_socket = s.daemon.admin_socket or default_admin_socket(s.state_dir)
            network_limits, local = listener_limits(s)
            admin = create_app(node, ADMIN, self.ops.admin_routers())
            self._serve(admin, self.admin_socket, 0o600, "--admin-socket", local)
            if s.daemon.pods_socket is not None:
                self._serve(create_app(node, PODS), s.daemon.pods_socket, 0o666, "--pods-socket", local)
            network = create_app(node, None, self.ops.network_routers())
            listener = tcp_listener(s.daemon.api_listen, "--api-listen")
            probes = tcp_listener(s.daemon.probe_listen, "--probe-listen") if s.daemon.probe_listen else None
            self.api_server = ApiServer(network, listener, s.daemon.api_listen, network_limits, probes)
            self.servers.append(self.api_server)
        except BaseException:
            for server in self.servers:
                server.stop(0)
            self.swarm.close()
            raise

    def _serve(self, app: Any, path: Path, mode: int, what: str, limits: ConnectionLimits) -> None:
        self.servers.append(ApiServer(app, unix_listener(path, mode, what), str(path), limits))

    def _pod_sync(self) -> PodSync:
        from agent.kube.podsync import PodSync  # loads the kubernetes client only when it is used

        podsync = PodSync(
            self.settings.kube, self.request_model, self.ops.pin_for_pods, self.names,
            cache_dir=self.settings.cache_dir,
        )
        self.ops.evictor.cannot_fit_hooks.append(podsync.on_cache_full)
        if podsync.fleet is not None:
            self.ops.metrics.preheat_counts = podsync.fleet.phase_counts
        return podsync

    def _relay_seeds(self) -> list[str]:
        """The blobs this node seeds whole that the relay offers (those it would relay while arriving)."""
        out = []
        for blob_id, ih in self.seeder.held().items():
            try:
                if self.swarm.status(ih).total >= SMALL_FILE_BYTES:
                    out.append(blob_id)
            except WeightswarmError:
                pass  # removed meanwhile
        return out

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        started = time.monotonic()
        # Before any torrent or fetch: a partial that is being resumed is not stale.
        sweep_partials(s.cache_dir, s.state_dir, s.ops.partial_max_age)
        clear_layers(s.state_dir)  # the last run's layers were seeded for its peers; nothing seeds them now
        self.gate.refresh()  # before any torrent: who may connect
        restored = self.seeder.restore()
        log.info("seeding %d blobs (%.2fs to restore)", restored, time.monotonic() - started)
        self._supervisor.spawn("backfill-pieces", self.seeder.backfill)
        self._supervisor.spawn("malloc-trim", trim_loop)
        if s.swarm.peer_gate:
            self._supervisor.spawn("peer-gate", self.gate.run)
        tracker = self.tracker
        if tracker is not None:
            self._supervisor.spawn("tracker-probe", lambda stop: self._probe_tracker(tracker, stop))
        self.ops.start(self._supervisor.spawn)
        if self.podsync is not None:
            self.podsync.start(self._supervisor.spawn)
        for server in self.servers:
            server.start(timeout=s.daemon.shutdown_timeout)
        log.info(
            "agent %s serving %s, BitTorrent on port %d",
            self.node_id,
            ", ".join(server.where for server in self.servers),
            self.swarm.listen_port,
        )

    def stop(self) -> None:
        """Ordered shutdown: API, jobs, background tasks, BitTorrent session (saves resume data), tracker."""
        timeout = self.settings.daemon.shutdown_timeout
        self._stop.set()
        self.fetcher.arrivals.close()  # streams end now, not at their stall timeout
        for server in self.servers:
            server.stop(timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._background.shutdown(wait=False, cancel_futures=True)
        self._supervisor.join(timeout)  # the pod watcher and status loop stop here...
        if self.podsync is not None:
            self.podsync.close(timeout)  # ...then the last statuses are flushed to the pods
        self.ops.stop()
        self.swarm.close(timeout)
        if self.relay is not None:
            self.relay.close()
        if self.tracker is not None:
            self.tracker.close()

    @property
    def api_host(self) -> str:
        return split_hostport(self.settings.daemon.api_listen, "--api-listen")[0]

    @property
    def api_url(self) -> str:
        """The network listener: probes, metrics, the HF-compatible endpoint."""
        return f"http://{self.api_host}:{self.api_server.port}"

    @property
    def admin_url(self) -> str:
        """The admin channel, for AgentClient and `agent ... --agent`."""
        return f"unix://{self.admin_socket}"

    def wait(self, timeout: float | None = None) -> bool:
        """Block until `request_stop()`; True once stopping."""
        return self._stop.wait(timeout)

    def request_stop(self) -> None:
        self._stop.set()

    # -- the tracker ----------------------------------------------------------------------

    def _probe_tracker(self, tracker: TrackerClient, stop: threading.Event) -> None:
        """Watch the tracker; when it comes (back) up, re-register every blob this node holds. Keep this
        node listed as a relay source of the blobs it streams (`RelayDirectory.refresh`).

        Periodic announces are libtorrent's own (at the tracker's `interval`, see
        `SwarmSettings.min_announce_interval`). This loop only shortens an outage: libtorrent
        backs off after failed announces, so without the forced re-announce on down→up a node
        could stay unlisted long after the tracker is back, and metainfo published while it
        was down would be missing.
        """
        again = False
        seen, epoch = tracker.outages, None
        while True:
            up = tracker.healthy()
            if up and again:
                # A restarted tracker forgot every peer, and the nodes re-register at their own probe
                # ticks: a download that announced first was told of no seeder. Once more, one probe
                # later, every torrent hears of the seeders that came back meanwhile.
                self.swarm.force_reannounce()
            # An outage between two probes counts too: this node's requests saw it (libtorrent's own
            # announces then back off, and its seeds would stay unlisted for a while). So does a new
            # epoch: the tracker lost its state (a Redis restarted without its data) with no request
            # of this node failing.
            missed = up and self._tracker_up and (tracker.outages != seen or tracker.epoch != epoch)
            again = up and (missed or (not self._tracker_up and self._tracker_up is not None))
            lost = bool(up and (not self._tracker_up or missed))
            if lost:
                seen, epoch = tracker.outages, tracker.epoch
                self.seeder.reregister(tracker)
            if up and self.relay is not None:
                self.relay.directory.refresh(lost)
            if self._tracker_up is not None and up != self._tracker_up:
                log.warning("tracker %s is %s", tracker.base_url, "back" if up else "unreachable")
            self._tracker_up = up
            if stop.wait(self.settings.daemon.tracker_probe_interval):
                return

    # -- jobs (the hook for the API, the HF endpoint and the pod watcher) -----------------

    def request_model(
        self,
        repo_id: str,
        revision: str = "main",
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        token: str | None = None,
        *,
        lend: bool = False,
        client: str | None = None,
        background: bool = False,
        source: str = "",
    ) -> Job:
        """Fetch a model into the cache through the swarm; a request equal to a running one joins it.

        `token`: the requester's HF token, used for this job's origin calls; it lives only in the
        job's worker (never in the job, its key, a log or on disk). Without one, `lend` fetches with
        the node's token (the channels that may: docs/security.md). `client` (None: the node itself)
        counts against `daemon.max_jobs_per_client`; every job counts against `daemon.max_jobs`.
        `background`: preheat work, run one at a time and yielding to the rest; a foreground request
        that joins such a job makes it foreground."""
        check_repo_id(repo_id)
        if source and is_oci_url(source):
            source = allowed_registry(source, self.settings.daemon.registries)
            revision = parse_oci_url(source).revision if revision == "main" else revision
        elif source:
            source = allowed_bucket(source, self.settings.daemon.buckets)
        if self._stop.is_set():
            raise ConfigError("the agent is shutting down")
        if token:
            requester = hmac.new(self._token_key, token.encode(), "sha256").hexdigest()[:32]
        else:
            requester = "node" if lend and self.settings.origin.token else ""
        key = JobKey(repo_id, revision, tuple(include), tuple(exclude), requester, source, client, background)
        d = self.settings.daemon
        job, new = self.jobs.get_or_create(key, d.max_jobs, d.max_jobs_per_client)
        if new:
            (self._background if background else self._executor).submit(self._run_job, job, token, lend)
        elif not background and job.background:
            job.promote()
            # It may still be queued behind other preheat work: a foreground worker takes it now
            # (whichever worker claims it first runs it).
            self._executor.submit(self._run_job, job, token, lend)
        return job

    def _turn_of(self, job: Job) -> Turn:
        """How `job` steps aside while it is background work and other jobs run (agent.fetch.jobs)."""
        # Asked by every origin worker every 0.1 s: the answer is shared for that long.
        memo: list[tuple[float, bool]] = [(float("-inf"), False)]

        def due() -> bool:
            at, answer = memo[0]
            if time.monotonic() - at >= 0.1:
                answer = self.jobs.must_yield(job)
                memo[0] = (time.monotonic(), answer)
            return answer

        return Turn(due, lambda: self.jobs.wait_turn(job, self._stop))

    def _run_job(self, job: Job, token: str | None, lend: bool) -> None:
        if not job.claim():
            return
        began = time.monotonic()
        # The job's error is its requester's, and names the model; the log names it as metrics do.
        scrub = self.names.scrubber(job.key.repo_id, job.key.revision, job.key.source)
        try:
            run_fetch_job(self._fetch, job, token, lend)
        except WeightswarmError as exc:
            # An expected failure is one line (no traceback): what the operator reads at INFO or WARNING.
            what = f"{job.key.repo_id}@{job.key.revision}"
            log.warning("%s", scrub(f"fetch of {what} failed after {time.monotonic() - began:.1f}s: {exc}"))
            job.fail(str(exc), exc.exit_code)
        except Exception as exc:
            trace = "".join(traceback.format_exception(exc)).rstrip()
            what = f"{job.key.repo_id}@{job.key.revision}"
            log.error("%s", scrub(f"fetch of {what} failed unexpectedly\n{trace}"))
            job.fail(f"internal error: {type(exc).__name__}: {exc}")
        else:
            done = job.status()
            log.info(
                "%s: ready in %.1fs (commit %s): %s from peers, %s from the origin, %s cached",
                self.names.label(job.key.repo_id, job.key.revision, job.key.source),
                time.monotonic() - began,
                (done.commit or "-")[:12],
                human_bytes(done.bytes_from_peers),
                human_bytes(done.bytes_from_origin),
                human_bytes(done.bytes_from_cache),
            )
        finally:
            self.ops.job_finished(job)

    def _is_public(self, repo_id: str) -> bool:
        """The origin last reported the repo public (a fresh entitlement record)."""
        return repo_id in self._fetch.entitlements.public_repos()

    def _public_torrents(self) -> set[str]:
        """Infohashes of the held blobs of models the origin last reported public (--interop-public).

        Asked at every gate refresh; the cache is scanned again only when what is held or what is
        public changed (a new blob lands in a snapshot only as it becomes held)."""
        held = self.seeder.held()
        public = frozenset(self._fetch.entitlements.public_repos())
        inputs = (public, frozenset(held.items()))
        if self._public_memo is not None and self._public_memo[0] == inputs:
            return self._public_memo[1]
        out: set[str] = set()
        for repo_id in public:
            repo = scan_repo(RepoCache(self.settings.cache_dir, self.settings.state_dir, repo_id).root)
            for snap in repo.snapshots.values() if repo is not None else ():
                out.update(held[b] for b in snap.files.values() if b in held)
        self._public_memo = (inputs, out)
        return out

    # -- views ----------------------------------------------------------------------------

    def problems(self) -> list[str]:
        out = self._supervisor.problems()
        if not self.swarm.healthy:
            out.append("BitTorrent session not running")
        if self._stop.is_set():
            out.append("shutting down")
        return out

    def held_blobs(self) -> dict[str, str]:
        """blob id -> infohash of every blob this node seeds."""
        return self.seeder.held()

    def list_models(self) -> list[dict[str, Any]]:
        """Models in the cache: revisions, snapshots with file counts and sizes, blobs seeded, partials."""
        held = self.held_blobs()
        models: list[dict[str, Any]] = []
        for repo_dir in sorted(self.settings.cache_dir.glob("models--*")):
            repo_id = repo_id_of(repo_dir.name)
            refs = {
                str(p.relative_to(repo_dir / "refs")): p.read_text().strip()
                for p in sorted((repo_dir / "refs").rglob("*"))
                if p.is_file()
            }
            snapshots = []
            for snap in sorted((repo_dir / "snapshots").glob("*")):
                files = [p for p in snap.rglob("*") if p.is_symlink() or p.is_file()]
                blobs = {Path(p.resolve()).name for p in files if p.exists()}
                snapshots.append(
                    {
                        "commit": snap.name,
                        "path": str(snap),
                        "files": len(files),
                        "bytes": sum(p.stat().st_size for p in files if p.exists()),
                        "seeding": sum(1 for b in blobs if b in held),
                    }
                )
            partials = partials_of(repo_dir, self.settings.state_dir)
            models.append({"repo_id": repo_id, "refs": refs, "snapshots": snapshots, "partials": partials})
        return models


def serve_forever(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT, then shut down in order."""
    limit_malloc_arenas()  # before any thread starts
    name_os_threads()
    daemon = Daemon(settings)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        daemon.start()
        # One line on stdout so scripts know the daemon is ready and where (ports may be 0 = any).
        print(
            f"agent {daemon.node_id} ready: api http://{daemon.api_host}:{daemon.api_server.port} "
            f"bt-port {daemon.swarm.listen_port}",
            flush=True,
        )
        while not daemon.wait(1.0):
            pass
    finally:
        daemon.stop()
