"""What pods ask for and what we tell them: the pod-annotation contract, free of Kubernetes.

A pod asks its node's agent for models with the annotation

    weightswarm.io/models: "org/name[@rev][, org/other[@rev] ...]"

and reads progress back from `weightswarm.io/status`, a JSON object keyed "org/name@rev".
This module parses and validates the request, encodes the status, and offers a
`RequestTracker` so the daemon fetches each model once however many pods ask. It does
not import `kubernetes`, so the daemon and the tests use it without a cluster.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from agent.cache.layout import check_revision
from agent.core.errors import AnnotationError, ConfigError
from agent.fetch.jobs import JobStatus
from agent.origin.bucket_url import split_bucket_url
from agent.origin.oci.reference import is_oci_url, parse_oci_url

MODELS_ANNOTATION = "weightswarm.io/models"
STATUS_ANNOTATION = "weightswarm.io/status"

DEFAULT_REVISION = "main"
MAX_REPO_ID_LENGTH = 96  # the Hub's limit (huggingface_hub.utils.validate_repo_id)
MAX_REVISION_LENGTH = 255  # a git ref name component limit; plenty for branches, tags, refs/pr/N
MAX_MODELS_PER_POD = 64  # bounds the work one annotation can cause

# As the Hub: letters, digits, '-', '_', '.'; each part starts and ends with a letter, digit
# or '_' ("\b" in the Hub's regex); '--' and '..' are reserved. We require the namespace,
# because an un-namespaced id is ambiguous in a hub cache shared by every pod on the node.
_REPO_PART = re.compile(r"^\w(?:[\w.-]*\w)?$", re.ASCII)
# Branches, tags, "refs/pr/N" and commits; git's ref rules minus the exotic parts.
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
_SEPARATORS = re.compile(r"[,\n]")

Phase = Literal["Pending", "Downloading", "Ready", "Failed"]
FINAL_PHASES: frozenset[str] = frozenset({"Ready", "Failed"})
_PHASE_STAGES = {"Pending": "queued", "Ready": "ready", "Failed": "failed"}
"""The stage of a status that has no job behind it (a bad annotation, a refused request)."""


@dataclass(frozen=True, order=True)
class ModelRef:
    """One requested model: a Hub repo id and a revision (branch, tag or 40-hex commit); or a repo id the
    model is cached as and the bucket URL it is read from ("org/name=s3://bucket/prefix")."""

    repo_id: str
    revision: str = DEFAULT_REVISION
    source: str = ""

    @property
    def key(self) -> str:
        """"org/name@rev": the key in the status annotation and in logs."""
        return f"{self.repo_id}@{self.revision}"

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class PodKey:
    """A pod, identified by uid: a pod deleted and recreated under the same name is a new pod."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class ModelStatus:
    """Progress of one model for one pod, as shown in the status annotation."""

    phase: Phase
    bytes_done: int = 0
    bytes_total: int = 0
    bytes_from_peers: int = 0
    bytes_from_origin: int = 0
    error: str | None = None
    snapshot: str | None = None
    stage: str | None = None
    """queued, lease, locked, origin, peers, verifying, ready, failed (agent.fetch.jobs.Stage)."""
    rate: float | None = None
    """Bytes/s over the last seconds."""
    eta_seconds: float | None = None
    commit: str | None = None

    @classmethod
    def of_job(cls, st: JobStatus) -> ModelStatus:
        return cls(
            phase=st.phase,
            bytes_done=st.bytes_done,
            bytes_total=st.bytes_total,
            bytes_from_peers=st.bytes_from_peers,
            bytes_from_origin=st.bytes_from_origin,
            error=st.error,
            snapshot=st.snapshot,
            stage=st.stage,
            rate=st.rate,
            eta_seconds=st.eta_seconds,
            commit=st.commit,
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "phase": self.phase,
            "stage": self.stage or _PHASE_STAGES.get(self.phase),
            "bytesDone": self.bytes_done,
            "bytesTotal": self.bytes_total,
            "bytesFromPeers": self.bytes_from_peers,
            "bytesFromOrigin": self.bytes_from_origin,
            # Whole numbers: a status that changes in the 10th digit would be patched for nothing.
            "rateBytesPerSecond": None if self.rate is None else round(self.rate),
            "etaSeconds": None if self.eta_seconds is None else round(self.eta_seconds),
            "error": self.error,
        }
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot
        return out


def encode_status(statuses: Mapping[str, ModelStatus]) -> str:
    """The `weightswarm.io/status` value: compact JSON, keys sorted so equal states compare equal."""
    return json.dumps(
        {key: st.to_json() for key, st in statuses.items()}, sort_keys=True, separators=(",", ":")
    )


def _check_repo_id(entry: str, repo_id: str) -> None:
    if not repo_id:
        raise AnnotationError(entry, "missing repo id")
    if len(repo_id) > MAX_REPO_ID_LENGTH:
        raise AnnotationError(entry, f"repo id longer than {MAX_REPO_ID_LENGTH} characters")
    parts = repo_id.split("/")
    if len(parts) != 2:
        raise AnnotationError(entry, "repo id must be exactly 'org/name'")
    for part in parts:
        if not _REPO_PART.match(part):
            raise AnnotationError(
                entry, "repo id parts use letters, digits, '-', '_', '.' and start/end with a letter or digit"
            )
    if "--" in repo_id or ".." in repo_id:
        raise AnnotationError(entry, "repo id must not contain '--' or '..'")
    if repo_id.endswith(".git"):
        raise AnnotationError(entry, "repo id must not end with '.git'")


def _check_revision(entry: str, revision: str) -> str:
    if not revision:
        raise AnnotationError(entry, "empty revision after '@'")
    if _COMMIT.match(revision):
        return revision.lower()  # commits are lower-case hex in the cache layout (snapshots/<commit>)
    if len(revision) > MAX_REVISION_LENGTH:
        raise AnnotationError(entry, f"revision longer than {MAX_REVISION_LENGTH} characters")
    try:
        check_revision(revision)  # the cache's own rule: it becomes `refs/<revision>`, as huggingface_hub's
    except ConfigError:
        raise AnnotationError(entry, "revision must be a branch, tag, refs/pr/N or 40-hex commit") from None
    if not _REVISION.match(revision):
        raise AnnotationError(entry, "revision must be a branch, tag, refs/pr/N or 40-hex commit")
    return revision


def parse_model_ref(entry: str) -> ModelRef:
    """One "org/name[@rev]" or "org/name=s3://bucket/prefix" (already stripped) to a `ModelRef`; raises
    `AnnotationError`."""
    if any(c.isspace() for c in entry):
        raise AnnotationError(entry, "whitespace inside an entry (separate models with ',')")
    model, eq, source = entry.partition("=")
    if eq and is_oci_url(source):
        try:
            ref = parse_oci_url(source)
        except ConfigError as exc:
            raise AnnotationError(entry, str(exc)) from None
        _check_repo_id(entry, model)
        return ModelRef(model, revision=ref.revision, source=ref.url)
    if eq:
        try:
            scheme, bucket, prefix = split_bucket_url(source)
        except ConfigError as exc:
            raise AnnotationError(entry, str(exc)) from None
        _check_repo_id(entry, model)
        return ModelRef(model, source=f"{scheme}://{bucket}/{prefix}".rstrip("/"))
    repo_id, at, revision = entry.partition("@")
    _check_repo_id(entry, repo_id)
    if not at:
        return ModelRef(repo_id)
    return ModelRef(repo_id, _check_revision(entry, revision))


def parse_models_annotation(value: str) -> list[ModelRef]:
    """Parse `weightswarm.io/models`: comma- or newline-separated entries, in order, without duplicates.

    Whitespace around entries and empty entries (a trailing comma) are ignored; any bad entry
    rejects the whole annotation, so a typo is reported rather than half-fetched.
    """
    refs: list[ModelRef] = []
    seen: set[ModelRef] = set()
    for raw in _SEPARATORS.split(value):
        entry = raw.strip()
        if not entry:
            continue
        ref = parse_model_ref(entry)
        if ref not in seen:
            seen.add(ref)
            refs.append(ref)
    if not refs:
        raise AnnotationError(value.strip(), "no models listed")
    if len(refs) > MAX_MODELS_PER_POD:
        raise AnnotationError(value.strip(), f"more than {MAX_MODELS_PER_POD} models in one pod")
    return refs


class RequestTracker:
    """Which pods want which model, so each model is fetched once however many pods ask.

    Thread-safe. `set_pod` returns the models that nobody wanted before (start fetching
    them) and `remove_pod` the ones that nobody wants any more (they may be unpinned).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pod: dict[PodKey, frozenset[ModelRef]] = {}
        self._by_model: dict[ModelRef, set[PodKey]] = {}

    def set_pod(self, pod: PodKey, models: Iterable[ModelRef]) -> tuple[list[ModelRef], list[ModelRef]]:
        """Record the pod's whole wish list; returns (newly wanted models, no longer wanted models)."""
        wanted = frozenset(models)
        with self._lock:
            old = self._by_pod.get(pod, frozenset())
            self._by_pod[pod] = wanted
            added = [m for m in sorted(wanted - old) if not self._by_model.get(m)]
            for m in wanted - old:
                self._by_model.setdefault(m, set()).add(pod)
            removed = self._drop(pod, old - wanted)
        return added, removed

    def remove_pod(self, pod: PodKey) -> list[ModelRef]:
        """Forget the pod; returns the models no other pod wants."""
        with self._lock:
            old = self._by_pod.pop(pod, frozenset())
            return self._drop(pod, old)

    def pods_for(self, model: ModelRef) -> set[PodKey]:
        """The pods waiting for `model` (a copy)."""
        with self._lock:
            return set(self._by_model.get(model, ()))

    def models_for(self, pod: PodKey) -> frozenset[ModelRef]:
        with self._lock:
            return self._by_pod.get(pod, frozenset())

    def _drop(self, pod: PodKey, models: Iterable[ModelRef]) -> list[ModelRef]:
        orphaned = []
        for m in sorted(models):
            pods = self._by_model.get(m)
            if pods is None:
                continue
            pods.discard(pod)
            if not pods:
                del self._by_model[m]
                orphaned.append(m)
        return orphaned
