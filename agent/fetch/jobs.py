"""Fetch jobs of the daemon: one per requested (repo, revision, filters), readable by the API and the
pod-status reporter while a worker thread fills them in.

The phases match what the Kubernetes reporter publishes (`Pending`, `Downloading`, `Ready`,
`Failed`), so `Job.status()` maps onto a pod annotation without translation.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from agent.core.errors import BusyError

Phase = Literal["Pending", "Downloading", "Ready", "Failed"]
TERMINAL: frozenset[str] = frozenset({"Ready", "Failed"})
Source = Literal["pending", "cache", "peers", "origin"]


@dataclass
class JobFile:
    path: str
    size: int
    blob_id: str = ""
    done: int = 0
    source: Source = "pending"


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
    client: str | None = field(default=None, compare=False)
    """Who asked first (the per-client job limit); not part of the identity: others may join."""


@dataclass
class JobStatus:
    """A consistent copy of a job's state; safe to read without locks (the reporter's `ModelStatus`)."""

    job_id: str
    repo_id: str
    revision: str
    phase: Phase
    commit: str | None
    bytes_total: int
    bytes_done: int
    bytes_from_peers: int
    bytes_from_origin: int
    bytes_from_cache: int
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
    node itself, not limited). Raises `BusyError` when the node or the client has too many jobs."""

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

    # -- writers (the worker) -------------------------------------------------------------

    def set_plan(self, commit: str, files: list[JobFile]) -> None:
        with self._lock:
            self._commit = commit
            self._files = {f.path: f for f in files}
            self._phase = "Downloading"
            self._changed.notify_all()

    def file_progress(self, path: str, done: int, source: Source | None = None) -> None:
        with self._lock:
            f = self._files.get(path)
            if f is None:
                return
            f.done = max(f.done, min(done, f.size))
            if source is not None:
                f.source = source

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
            self._phase = "Ready"
            self._finished = time.time()
            self._changed.notify_all()

    def fail(self, error: str, exit_code: int = 1) -> None:
        with self._lock:
            self._error = error
            self._exit_code = exit_code
            self._phase = "Failed"
            self._finished = time.time()
            self._changed.notify_all()

    # -- readers --------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        with self._lock:
            return self._phase in TERMINAL

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
            files = [JobFile(f.path, f.size, f.blob_id, f.done, f.source) for f in self._files.values()]
            return JobStatus(
                job_id=self.id,
                repo_id=self.key.repo_id,
                revision=self.key.revision,
                phase=self._phase,
                commit=self._commit,
                bytes_total=sum(f.size for f in files),
                bytes_done=sum(f.done for f in files),
                bytes_from_peers=self._peers,
                bytes_from_origin=self._origin,
                bytes_from_cache=self._cached,
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

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())
