"""One daemon fetch job: plan at the origin, blobs through the swarm, snapshot in the hub cache.

Planning (agent.fetch.planning) asks the origin first, and the tracker's manifest only where that
widens no access; the origin fetch engine (agent.fetch.engine) does the disk-space check, the
snapshot links, the index checks and `refs/`; the swarm source (agent.fetch.sources.policy) decides per blob
where the bytes come from and installs each blob itself (libtorrent finishes a blob in place
under its final name, so there is no temp file for the engine to move).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from agent.cache.layout import RepoCache, StateDir
from agent.cache.listings import ListingIds
from agent.cache.locks import blob_lock
from agent.cache.provenance import Provenance
from agent.core.errors import AuthError, NotFoundError, TrackerError, WaitTimeoutError
from agent.core.modelnames import ModelNames, Scrub
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress, Progress
from agent.core.settings import OriginSettings, Settings
from agent.fetch.bucket import BucketIndex, unknown
from agent.fetch.cached import cached_plan, plan_or_cached
from agent.fetch.engine import FetchEngine
from agent.fetch.entitlement import Entitlements, NotEntitledError
from agent.fetch.jobs import STAGES, Job, JobFile
from agent.fetch.layers import layered, unpack_layers
from agent.fetch.planning import plan_fetch
from agent.fetch.sources.policy import BlobOutcome, SourcePolicy
from agent.fetch.sources.swarm_source import SwarmSource
from agent.origin.answers import CdnRefusedError
from agent.origin.chunks import Turn
from agent.origin.client import Origin
from agent.origin.kinds import open_origin
from agent.origin.ranges import OriginSource
from agent.relay.receiver import RelayReceiver
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchContext:
    """What a daemon's fetch jobs need from the node; built once by the daemon."""

    settings: Settings
    fetcher: SourcePolicy
    tracker: TrackerClient | None
    before_fetch: Callable[[FetchPlan], None]
    """Makes room for a plan's missing blobs under the cache limit, or raises `CacheFullError`."""
    held_blobs: Callable[[], dict[str, str]]
    """blob id -> infohash of what the node seeds (for the manifest it publishes)."""
    turn_of: Callable[[Job], Turn]
    """When the job must step aside for others, and how it waits (preheat work: `JobTable.must_yield`)."""
    names: ModelNames
    """How a job's log lines name its model: as the metrics do (agent.core.modelnames)."""
    relay: RelayReceiver | None = None
    """Takes blobs from the nodes relaying them while they arrive (agent.relay.directory); None: off."""
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set when the daemon stops: a job waiting out the origin gives up at once."""
    entitlements: Entitlements = dataclasses.field(init=False)
    """What the origin allowed this node's requests (agent.fetch.entitlement), from `--state-dir`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "entitlements", Entitlements(StateDir(self.settings.state_dir)))


class JobProgress(Progress):
    """The engine's progress sink, writing into a job instead of a terminal."""

    def __init__(self, job: Job) -> None:
        super().__init__(quiet=True)
        self.job = job

    def _advance(self, fp: FileProgress, n: int) -> None:
        super()._advance(fp, n)
        self.job.file_progress(fp.name, fp.done)

    def _stage(self, fp: FileProgress, stage: str) -> None:
        if stage in STAGES:
            self.job.file_stage(fp.name, stage)  # type: ignore[arg-type]

    def _finish(self, fp: FileProgress, failed: bool) -> None:
        super()._finish(fp, failed)
        if failed:
            self.job.file_stage(fp.name, "failed")
        elif fp.source == "cache":  # another writer of the cache brought it while this job waited
            self.job.file_progress(fp.name, fp.size, "cache")
            self.job.add_bytes(cache=fp.size)


class SwarmFetchEngine(FetchEngine):
    """The engine with a source that installs blobs itself: no temp file to check and move. Background
    work starts no blob while it must step aside (`turn`); a wait for another writer's lock ends when
    the daemon stops (`stopping`)."""

    def __init__(
        self,
        settings: Settings,
        source: SwarmSource,
        progress: Progress,
        turn: Turn,
        stopping: threading.Event,
        per_file: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(settings, source, progress, per_file)
        self.turn = turn
        self.stopping = stopping

    def _fetch_one(self, plan: FetchPlan, cache: RepoCache, entry: FileEntry) -> str:
        self.turn.wait()
        fp = self.progress.start_file(entry.path, entry.size)
        try:
            # As FetchEngine: a CLI or huggingface_hub writing the blob into this cache finishes it first;
            # the job says so meanwhile (a held `.locks/` file is otherwise an unexplained stall).
            locked = functools.partial(fp.set_stage, "locked")
            with blob_lock(cache.cache_dir, cache.repo_id, entry.blob_id, self.stopping, locked):
                if self.stopping.is_set():
                    raise WaitTimeoutError(f"{entry.path}: the agent is stopping")
                if not cache.adopt_blob(entry.blob_id, entry.size):
                    self.source.fetch_blob(plan, entry, cache, fp)
                else:
                    self.found.add(entry.blob_id)
                    fp.source = "cache"
        except BaseException:
            fp.fail()
            raise
        fp.finish()
        return entry.blob_id


def origin_for_request(settings: Settings, token: str | None, lend: bool) -> tuple[OriginSettings, str]:
    """The origin settings one request runs with, and which token that is, in words for errors.

    The requester's own token wins; without one the node's token is lent only where the channel
    the request came through allows it (`lend`: the admin socket and pod annotations, see
    docs/security.md), else the request is anonymous."""
    patient = dataclasses.replace(settings.origin, patience=settings.daemon.origin_patience)
    if token:
        return dataclasses.replace(patient, token=token), "the requester's token"
    if lend and settings.origin.token:
        return patient, "the node's token (the request brought none)"
    return dataclasses.replace(patient, token=None), "no token (pass one with --token or HF_TOKEN)"


def run_fetch_job(ctx: FetchContext, job: Job, token: str | None = None, lend: bool = False) -> None:
    """Run one job to its end (Ready, or an exception the caller records on the job)."""
    settings = ctx.settings
    f = settings.fetch
    origin, which = origin_for_request(settings, token, lend)
    if job.key.source:
        # A bucket model: read with this node's cloud credentials (agent.origin.bucket), never a hub token.
        origin = dataclasses.replace(origin, endpoint=job.key.source, token=None)
        which = f"this node's credentials for {job.key.source}"
    scrub = ctx.names.scrubber(job.key.repo_id, job.key.revision, job.key.source)
    client = open_origin(origin, f.connections_per_file * f.files_at_once, ctx.stopping, scrub)
    try:
        _run(ctx, job, client, scrub)
    except CdnRefusedError:
        raise  # the origin granted access and its download host refused a signed URL: no token is at fault
    except (AuthError, NotFoundError, NotEntitledError) as exc:
        raise type(exc)(f"{exc} [the agent fetched with {which}]") from None
    finally:
        client.close()


def _run(ctx: FetchContext, job: Job, client: Origin, scrub: Scrub) -> None:
    settings = ctx.settings
    f = settings.fetch
    key = job.key
    # Planning asks the origin without patience (an unavailable origin sends it to the tracker's
    # manifest at once); only when neither can plan it does the job wait for the origin.
    # A revision the cache holds whole is served from it when the origin cannot be asked (one quick
    # try, not the retries and the patience): a node that holds a model starts its pods through an outage.
    cached = cached_plan(settings, key.repo_id, key.revision, key.include, key.exclude, scrub)

    def ask(origin: Origin, standby: bool) -> FetchPlan:
        return plan_fetch(
            origin,
            None if standby else ctx.tracker,
            key.repo_id,
            key.revision,
            key.include,
            key.exclude,
            entitlements=ctx.entitlements,
            publisher_key=settings.daemon.publisher_public_key,
            scrub=scrub,
        )

    what = f"{key.repo_id}@{key.revision}"
    plan = client.patiently(lambda: plan_or_cached(client.settings, client, cached, ask, what, scrub))
    cache = RepoCache(settings.cache_dir, settings.state_dir, plan.repo_id)
    ctx.before_fetch(plan)  # make room under the cache limit, or refuse (CacheFullError)
    read_here: set[str] = set()
    received: set[str] = set()
    listed = plan
    if unknown(plan):
        plan, read_here, received = _identify(ctx, job, client, plan, scrub)
    identified = plan
    turn = ctx.turn_of(job)
    if layered(plan):
        plan, unpacked = _unpack(ctx, job, client, plan, turn)
        read_here |= unpacked
    files = [JobFile(e.path, e.size, e.blob_id) for e in plan.files]
    for fp in files:
        if fp.blob_id in read_here:
            fp.done, fp.source, fp.stage = fp.size, "origin", "ready"
        elif fp.blob_id in received:
            fp.done, fp.source, fp.stage = fp.size, "peers", "ready"
        elif cache.adopt_blob(fp.blob_id, fp.size):
            fp.done, fp.source, fp.stage = fp.size, "cache", "ready"
    job.set_plan(plan.commit, files)
    job.add_bytes(cache=sum(fp.size for fp in files if fp.source == "cache"))

    def on_blob(entry: FileEntry, outcome: BlobOutcome, engine_bytes: int) -> None:
        # Live counters: the API and the pod reporter see peers vs origin bytes as blobs land.
        for e in plan.files:
            if e.blob_id == entry.blob_id:
                job.file_progress(e.path, e.size, outcome.source)
        job.add_bytes(peers=outcome.bytes_from_peers, origin=outcome.bytes_from_origin + engine_bytes)

    origin = OriginSource(client, f, turn=turn)
    source = SwarmSource(ctx.fetcher, origin, f.verify_safetensors, on_blob, ctx.relay)
    result = SwarmFetchEngine(
        settings, source, JobProgress(job), turn, ctx.stopping, origin.streams_per_file
    ).run(plan)
    if listed is not identified:
        # Every blob is verified against the ids the commit was planned by: the next listing of the same
        # objects (a new commit that changed others) is planned by content here, whoever reads the rest.
        ListingIds(settings.state_dir).learnt(listed, identified)
    if not plan.from_cache:
        fetched = dataclasses.replace(plan, files=result.files)
        Provenance(settings.state_dir, scrub).record(client.endpoint, fetched)
    _publish_manifest(ctx, plan, scrub)
    job.finish(str(result.snapshot_path))


def _identify(
    ctx: FetchContext, job: Job, client: Origin, plan: FetchPlan, scrub: Scrub
) -> tuple[FetchPlan, set[str], set[str]]:
    """A bucket plan with its content ids (agent.fetch.bucket), the blobs this node read to learn them and
    those it took from the reader's relay; the job shows the read's progress file by file."""
    job.set_plan(plan.commit, [JobFile(e.path, e.size, e.blob_id) for e in plan.files])
    index = BucketIndex(
        ctx.settings, ctx.fetcher, client, JobProgress(job), lambda p: _publish_manifest(ctx, p, scrub),
        ctx.stopping, scrub, ctx.relay,
    )
    try:
        return index.identify(plan), index.read_here, index.received_here
    finally:
        job.add_bytes(origin=index.bytes_from_origin, peers=index.bytes_from_peers)


def _unpack(
    ctx: FetchContext, job: Job, client: Origin, plan: FetchPlan, turn: Turn
) -> tuple[FetchPlan, set[str]]:
    """A registry plan with its tar layers unpacked (agent.fetch.layers): each layer through the swarm as
    any blob (leases, relay, peers), kept in the state dir and seeded for the peers while the daemon runs;
    and the blobs of the files unpacked from them. The job shows the layers' progress meanwhile."""
    f = ctx.settings.fetch
    job.set_plan(plan.commit, [JobFile(e.path, e.size, e.blob_id) for e in plan.files])

    def on_layer(entry: FileEntry, outcome: BlobOutcome, engine_bytes: int) -> None:
        job.file_progress(entry.path, entry.size, outcome.source)
        job.add_bytes(peers=outcome.bytes_from_peers, origin=outcome.bytes_from_origin + engine_bytes)

    def fetch_layers(layers: FetchPlan, where: Settings) -> None:
        origin = OriginSource(client, f, turn=turn)
        source = SwarmSource(ctx.fetcher, origin, f.verify_safetensors, on_layer, ctx.relay)
        progress = JobProgress(job)
        SwarmFetchEngine(where, source, progress, turn, ctx.stopping, origin.streams_per_file).run(layers)

    key = job.key
    unpacked = unpack_layers(ctx.settings, plan, key.include, key.exclude, fetch_layers, keep=True)
    before = {e.blob_id for e in plan.files}
    return unpacked, {e.blob_id for e in unpacked.files if e.blob_id not in before}


def _publish_manifest(ctx: FetchContext, plan: FetchPlan, scrub: Scrub) -> None:
    """Tell the tracker what this commit holds (its model list and swarm health use it); not when
    the plan came from its manifest (a published model's is the publisher's alone to write), and
    not after a fetch that --include/--exclude narrowed: a commit's manifest is written once, so a
    partial one would stand for the whole commit forever."""
    tracker = ctx.tracker
    if tracker is None or plan.from_tracker or plan.from_cache:
        return
    if {e.path for e in plan.files} != plan.all_paths:
        return
    held = ctx.held_blobs()
    files = [
        {"path": e.path, "size": e.size, "blob_id": e.blob_id, "infohash": held.get(e.blob_id)}
        for e in plan.files
    ]
    try:
        tracker.put_manifest(plan.repo_id, plan.commit, plan.revision, files)
    except TrackerError as exc:
        log.info("%s", scrub(f"manifest of {plan.repo_id}@{plan.commit[:12]} not published: {exc}"))
