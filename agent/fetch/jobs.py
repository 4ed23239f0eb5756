"""Fetch jobs of the daemon: one per requested (repo, revision, filters), readable by the API and the
pod-status reporter while a worker thread fills them in.

The phases match what the Kubernetes reporter publishes (`Pending`, `Downloading`, `Ready`,
`Failed`), so `Job.status()` maps onto a pod annotation without translation.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol, get_args

from agent.core.errors import BusyError

Phase = Literal["Pending", "Downloading", "Ready", "Failed"]
TERMINAL: frozenset[str] = frozenset({"Ready", "Failed"})
Source = Literal["pending", "cache", "peers", "origin"]
Stage = Literal["queued", "lease", "locked", "origin", "peers", "verifying", "ready", "failed"]
"""Where a job (or one of its files) is now: waiting for its turn, waiting for another node's origin
lease, waiting for another writer of this node's cache (its `.locks/` file: agent.cache.locks), bytes
from the origin, bytes from peers, the end-to-end check, done. What a user asks of a slow
start is "which stage is slow": the pod status, `agent wait` and the metrics all show this one word."""
STAGES: frozenset[str] = frozenset(get_args(Stage))
STAGE_WORDS: dict[str, str] = {
    "queued": "queued (waiting for its turn on this node)",
    "lease": "waiting for the node that holds the origin lease",
    "locked": "waiting for another writer of this node's cache to finish the file",
    "origin": "downloading from the origin",
    "peers": "downloading from peers",
    "verifying": "verifying",
    "ready": "ready",
    "failed": "failed",
}
"""Each stage in words, for people reading `agent wait` and Events."""
_ACTIVE_STAGES: tuple[Stage, ...] = ("origin", "peers", "lease", "locked", "verifying", "queued")
"""A job's stage is the first of these that one of its unfinished files is in."""
_RATE_WINDOW = 10.0
"""Seconds of history behind a job's rate (and so its ETA): recent enough to follow a change of
source, long enough not to jump with every piece."""


@dataclass
class JobFile:
    path: str
    size: int
    blob_id: str = ""
    done: int = 0
    source: Source = "pending"
    stage: Stage = "queued"


@dataclass(frozen=True)
class JobKey:
    repo_id: str
    revision: str
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    requester: str = ""
    """A keyed hash of the requester's HF token, "node" when the node's token is lent, "" = anonymous:
    requests with different tokens never join each other's job (one token's refusal or grant is not
    another's). Never the token itself."""
    source: str = ""
    """The bucket URL of a model stored in object storage (agent.origin.bucket); "" for the hub's."""
    client: str | None = field(default=None, compare=False)
    """Who asked first (the per-client job limit); not part of the identity: others may join."""
    background: bool = field(default=False, compare=False)
    """Preheat work: it yields to every other job (`JobTable.must_yield`); a request for the same model
    that someone waits for joins it and makes it foreground (`Job.promote`)."""


@dataclass
class JobStatus:
    """A consistent copy of a job's state; safe to read without locks (the reporter's `ModelStatus`)."""

    job_id: str
    repo_id: str
    revision: str
    phase: Phase
    stage: Stage
    commit: str | None
    bytes_total: int
    bytes_done: int
    bytes_from_peers: int
    bytes_from_origin: int
    bytes_from_cache: int
    rate: float | None
    """Bytes per second over the last few seconds; None before there is enough to say."""
    eta_seconds: float | None
    """At `rate`, seconds until every byte is here; None without a rate."""
    background: bool
    partial: bool
    """--include/--exclude narrowed it (the HF endpoint's one-file jobs): not a whole model's time."""
    error: str | None
    exit_code: int | None
    """The CLI exit code of the failure (3 not found, 4 access refused, ...; agent.core.errors)."""
    snapshot: str | None
    files: list[JobFile]
    created: float
    finished: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RequestModel(Protocol):
    """How the API, the HF endpoint and the pod watcher ask the node for a model (the daemon's
    `request_model`): a request equal to a running one, with the same token, joins its job.

    `token`: the requester's HF token; `lend`: without one, fetch with the node's token (only the
    channels docs/security.md allows); `client`: who asks, for the per-client job limit (None: the
    node itself, not limited); `background`: preheat work, which yields to every other job. Raises
    `BusyError` when the node or the client has too many jobs. `source`: the bucket URL a model in
    object storage is read from ("" for the hub's), one of the node's `daemon.buckets`."""

    def __call__(
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
    ) -> Job: ...


_ids = itertools.count(1)


class Job:
    """Mutable job state behind one lock. Writers: the job's worker; readers: anyone."""

    def __init__(self, key: JobKey) -> None:
        self.key = key
        # Unguessable: a pod on the pods' socket must not read other requests' jobs by counting.
        self.id = f"{int(time.time()):x}-{next(_ids)}-{secrets.token_hex(6)}"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._phase: Phase = "Pending"
        self._commit: str | None = None
        self._error: str | None = None
        self._exit_code: int | None = None
        self._snapshot: str | None = None
        self._files: dict[str, JobFile] = {}
        self._peers = 0
        self._origin = 0
        self._cached = 0
        self._created = time.time()
        self._finished: float | None = None
        self._ended: float | None = None
        """When it finished, by the monotonic clock (`since_finished`; `_finished` is for people)."""
        self._background = key.background
        self._claimed = False
        self._on_end: list[Callable[[], None]] = []
        """Called once when the job is Ready or Failed (`on_end`)."""
        self._samples: deque[tuple[float, int]] = deque()
        """(monotonic time, bytes done) at most every quarter second, over `_RATE_WINDOW`."""

    # -- writers (the worker) -------------------------------------------------------------

    def set_plan(self, commit: str, files: list[JobFile]) -> None:
        with self._lock:
            self._commit = commit
            self._files = {f.path: f for f in files}
            self._phase = "Downloading"
            self._sample()
            self._changed.notify_all()

    def file_stage(self, path: str, stage: Stage) -> None:
        with self._lock:
            f = self._files.get(path)
            if f is not None and f.stage != "ready":
                f.stage = stage

    def claim(self) -> bool:
        """True for the one worker that runs this job (a promoted job is handed to two queues)."""
        with self._lock:
            claimed, self._claimed = self._claimed, True
            return not claimed

    def promote(self) -> None:
        """Someone waits for this model now: it no longer yields to other jobs."""
        with self._lock:
            self._background = False

    def file_progress(self, path: str, done: int, source: Source | None = None) -> None:
        with self._lock:
            f = self._files.get(path)
            if f is None:
                return
            f.done = max(f.done, min(done, f.size))
            if source is not None:
                f.source = source
                f.stage = "ready"
            self._sample()

    def add_bytes(self, *, peers: int = 0, origin: int = 0, cache: int = 0) -> None:
        with self._lock:
            self._peers += peers
            self._origin += origin
            self._cached += cache

    def finish(self, snapshot: str) -> None:
        with self._lock:
            self._snapshot = snapshot
            for f in self._files.values():
                f.done = f.size
            ended = self._end("Ready")
        for fn in ended:
            fn()

    def fail(self, error: str, exit_code: int = 1) -> None:
        with self._lock:
            self._error = error
            self._exit_code = exit_code
            ended = self._end("Failed")
        for fn in ended:
            fn()

    def _end(self, phase: Phase) -> list[Callable[[], None]]:
        """Enter terminal `phase` and wake `wait`ers (hold the lock); the `on_end` callbacks to call once
        the lock is released."""
        self._phase = phase
        self._finished, self._ended = time.time(), time.monotonic()
        self._changed.notify_all()
        ended, self._on_end = self._on_end, []
        return ended

    def since_finished(self) -> float | None:
        """Seconds since the job finished (None while it runs), immune to wall-clock steps."""
        with self._lock:
            return None if self._ended is None else time.monotonic() - self._ended

    def _sample(self) -> None:
        """Record bytes done now (hold the lock)."""
        now = time.monotonic()
        if self._samples and now - self._samples[-1][0] < 0.25:
            return
        self._samples.append((now, sum(f.done for f in self._files.values())))
        while len(self._samples) > 2 and now - self._samples[1][0] > _RATE_WINDOW:
            self._samples.popleft()

    def _rate(self, done: int) -> float | None:
        """Bytes/s from the oldest sample in the window to now (hold the lock): a stall shows as a
        falling rate, not as the last burst's."""
        if not self._samples:
            return None
        t0, done0 = self._samples[0]
        elapsed = time.monotonic() - t0
        return (done - done0) / elapsed if elapsed >= 1.0 else None

    def _stage(self, files: list[JobFile]) -> Stage:
        if self._phase == "Pending":
            return "queued"
        if self._phase == "Ready":
            return "ready"
        if self._phase == "Failed":
            return "failed"
        busy = {f.stage for f in files if f.stage != "ready"}
        # Every file in: the index checks and refs/ are what is left.
        return next((stage for stage in _ACTIVE_STAGES if stage in busy), "verifying")

    # -- readers --------------------------------------------------------------------------

    @property
    def background(self) -> bool:
        with self._lock:
            return self._background and self._phase not in TERMINAL

    @property
    def done(self) -> bool:
        with self._lock:
            return self._phase in TERMINAL

    def on_end(self, fn: Callable[[], None]) -> None:
        """Call `fn` once the job is Ready or Failed: now if it is, else from the thread that ends it
        (so `fn` must be quick and must not take this job's lock). `forget` takes it back."""
        with self._lock:
            if self._phase not in TERMINAL:
                self._on_end.append(fn)
                return
        fn()

    def forget(self, fn: Callable[[], None]) -> None:
        """Take back an `on_end` callback that is no longer wanted (a long poll that timed out)."""
        with self._lock, contextlib.suppress(ValueError):
            self._on_end.remove(fn)

    def wait(self, timeout: float) -> bool:
        """Block until the job is Ready or Failed, at most `timeout` seconds; True when it is."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._phase not in TERMINAL:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def status(self) -> JobStatus:
        with self._lock:
            files = [replace(f) for f in self._files.values()]
            total = sum(f.size for f in files)
            done = sum(f.done for f in files)
            rate = self._rate(done) if self._phase == "Downloading" else None
            return JobStatus(
                job_id=self.id,
                repo_id=self.key.repo_id,
                revision=self.key.revision,
                phase=self._phase,
                stage=self._stage(files),
                commit=self._commit,
                bytes_total=total,
                bytes_done=done,
                bytes_from_peers=self._peers,
                bytes_from_origin=self._origin,
                bytes_from_cache=self._cached,
                rate=rate,
                eta_seconds=(total - done) / rate if rate else None,
                background=self._background,
                partial=bool(self.key.include or self.key.exclude),
                error=self._error,
                exit_code=self._exit_code,
                snapshot=self._snapshot,
                files=files,
                created=self._created,
                finished=self._finished,
            )


@dataclass
class JobTable:
    """Jobs by id, with a bounded history of finished ones; dedupes active jobs by key."""

    history: int = 200
    _jobs: OrderedDict[str, Job] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get_or_create(
        self, key: JobKey, max_jobs: int | None = None, max_per_client: int | None = None
    ) -> tuple[Job, bool]:
        """The active job for `key` (a second request joins it), else a new one; True when new.

        A new job is refused (`BusyError`) when `max_jobs` are running, or `max_per_client` of
        `key.client`'s (a key without a client is not limited per client)."""
        with self._lock:
            active = [j for j in self._jobs.values() if not j.done]
            for job in active:
                if job.key == key:
                    return job, False
            if not key.background:
                # Preheat work queues behind one worker; it never keeps a waiting pod's request out.
                active = [j for j in active if not j.background]
            if max_jobs is not None and len(active) >= max_jobs:
                raise BusyError(f"the agent is running {len(active)} fetch jobs, its limit; retry later")
            mine = sum(1 for j in active if key.client is not None and j.key.client == key.client)
            if max_per_client is not None and key.client is not None and mine >= max_per_client:
                raise BusyError(f"you have {mine} fetch jobs running on this agent, the limit; retry later")
            job = Job(key)
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if j.done]
            for old in finished[: max(0, len(finished) - self.history)]:
                del self._jobs[old.id]
            return job, True

    def must_yield(self, job: Job) -> bool:
        """Whether `job` is background work while another job is not: preheat yields to the models
        someone waits for (before each blob, and the origin engine mid-range: agent.origin.ranges.Turn)."""
        if not job.background:
            return False
        with self._lock:
            others = [j for j in self._jobs.values() if j is not job]
        return any(not j.done and not j.background for j in others)

    def wait_turn(self, job: Job, stop: threading.Event, poll: float = 0.2) -> None:
        """Block while `job` must yield (see `must_yield`), or until `stop`."""
        while self.must_yield(job) and not stop.is_set():
            stop.wait(poll)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())
