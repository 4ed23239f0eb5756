"""The source policy as a `BlobSource` for one daemon fetch (agent.fetch.engine): each blob obtained by
agent.fetch.sources.policy, through a `BlobRequest` that carries this fetch's origin engine and relay."""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent.cache.layout import RepoCache
from agent.core.errors import IntegrityError
from agent.core.hashing import BlobHashes
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress
from agent.fetch.sources.policy import BlobOrigin, BlobOutcome, SourcePolicy
from agent.fetch.sources.request import BlobRequest
from agent.origin.ranges import OriginSource
from agent.relay.receiver import RelayReceiver


class SwarmSource:
    """The policy as a `BlobSource` for one fetch (agent.fetch.engine).

    Unlike the origin source it installs each blob itself (libtorrent renames the finished file
    to `blobs/<id>`, and the origin path must publish and seed right after installing), so the
    engine finds the blob complete and only links the snapshot.
    """

    name = "swarm"

    def __init__(
        self,
        policy: SourcePolicy,
        origin: OriginSource,
        verify_safetensors: bool = True,
        on_blob: Callable[[FileEntry, BlobOutcome, int], None] | None = None,
        relay: RelayReceiver | None = None,
    ) -> None:
        self.policy = policy
        self.origin = origin
        self.relay = relay
        self.verify_safetensors = verify_safetensors
        self._on_blob = on_blob
        """Called as each blob completes: (entry, outcome, bytes the origin engine pulled for it)."""
        self._lock = threading.Lock()
        self.bytes_from_peers = 0
        self.bytes_from_origin = 0
        self._resumed = 0
        self.sources: dict[str, BlobOrigin] = {}
        """repo path -> where its bytes came from, for job status."""

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return self.bytes_from_peers + self.bytes_from_origin

    @property
    def bytes_resumed(self) -> int:
        with self._lock:
            return self._resumed

    def fetch_blob(
        self, plan: FetchPlan, entry: FileEntry, cache: RepoCache, progress: FileProgress
    ) -> BlobHashes:
        req = BlobRequest(plan, entry, cache, progress, self.origin, self.relay, self.verify_safetensors)
        try:
            outcome = self.policy.obtain(req)
        finally:
            with self._lock:
                self.bytes_from_origin += req.engine_bytes
                self._resumed += req.engine_resumed
        req.report(entry.size)
        with self._lock:
            self.sources[entry.path] = outcome.source
            self.bytes_from_peers += outcome.bytes_from_peers
            self.bytes_from_origin += outcome.bytes_from_origin
        if self._on_blob is not None:
            self._on_blob(entry, outcome, req.engine_bytes)
        digest = cache.read_sidecar(entry.blob_id)
        if digest is None:
            raise IntegrityError(f"{entry.path}: no digest recorded after its download; retry the fetch")
        return BlobHashes(entry.blob_id, digest.size, digest.xxh3, digest.piece_length, digest.pieces)
