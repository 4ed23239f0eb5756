"""The swarm as a `BlobSource` for one daemon fetch (agent.fetch.engine): the per-blob policy of
agent.swarm.policy, with the origin engine (agent.origin.ranges) as the fallback it is handed."""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent.cache.layout import RepoCache
from agent.core.errors import AuthError, IntegrityError
from agent.core.hashing import BlobHashes
from agent.core.parts import Shares
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress
from agent.fetch.engine import install_downloaded
from agent.fetch.relay import RelayReceiver
from agent.origin.answers import CdnRefusedError, host_of, same_host
from agent.origin.client import OriginClient
from agent.origin.location import FileLocation
from agent.origin.ranges import OriginSource
from agent.swarm.policy import BlobOrigin, BlobOutcome, SwarmFetcher


class SwarmSource:
    """The swarm as a `BlobSource` for one fetch (agent.fetch.engine): the policy above per blob.

    Unlike the origin source it installs each blob itself (libtorrent renames the finished file
    to `blobs/<id>`, and the origin path must publish and seed right after installing), so the
    engine finds the blob complete and only links the snapshot.
    """

    name = "swarm"

    def __init__(
        self,
        fetcher: SwarmFetcher,
        origin: OriginSource,
        verify_safetensors: bool = True,
        on_blob: Callable[[FileEntry, BlobOutcome, int], None] | None = None,
        relay: RelayReceiver | None = None,
    ) -> None:
        self.fetcher = fetcher
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
        reported = 0

        def on_progress(done: int) -> None:
            nonlocal reported
            if done > reported:
                progress.advance(done - reported)
                reported = done

        engine_bytes = 0

        def from_engine(prefix: Callable[[int], None], shares: Shares | None = None) -> int:
            nonlocal reported, engine_bytes
            # A source of its own per blob: the shared one's counters also move with the other
            # blobs downloading at the same time, which would count their bytes here too.
            origin = self.origin
            one = OriginSource(
                origin.client, origin.settings, piece_hashes=origin.piece_hashes, turn=origin.turn
            )
            try:
                hashes = one.fetch_blob(plan, entry, cache, progress, prefix=prefix, shares=shares)
            finally:
                engine_bytes = one.bytes_received
                with self._lock:
                    self.bytes_from_origin += one.bytes_received
                    self._resumed += one.bytes_resumed
            reported = entry.size
            install_downloaded(cache, entry, hashes, self.verify_safetensors)
            return one.bytes_relayed

        def from_origin(prefix: Callable[[int], None]) -> None:
            from_engine(prefix)

        relay = self.relay

        def from_relay(prefix: Callable[[int], None], patient: bool, pieces: bytes | None) -> int | None:
            nonlocal reported
            assert relay is not None
            got = relay.receive(plan, entry, cache, self.origin, progress, prefix, patient, pieces)
            if got is None:
                return None
            hashes, received = got
            reported = entry.size
            install_downloaded(cache, entry, hashes, self.verify_safetensors)
            return received

        def present() -> int | None:
            # `progress.done` counts the origin engine's bytes too: a lease holder's heartbeats report
            # it, or no count (progress) while the origin itself says "later" (`told_to_wait`).
            return None if self.origin.client.told_to_wait else progress.done

        outcome = self.fetcher.obtain(
            cache,
            entry,
            from_origin,
            WebSeedLocation(self.origin.client, plan, entry),
            on_progress,
            present=present,
            relay_download=from_relay if relay is not None else None,
            stage=progress.set_stage,
            parted=(from_engine, relay.feed) if relay is not None else None,
        )
        on_progress(entry.size)
        with self._lock:
            self.sources[entry.path] = outcome.source
            self.bytes_from_peers += outcome.bytes_from_peers
            self.bytes_from_origin += outcome.bytes_from_origin
        if self._on_blob is not None:
            self._on_blob(entry, outcome, engine_bytes)
        digest = cache.read_sidecar(entry.blob_id)
        if digest is None:
            raise IntegrityError(f"{entry.path}: no digest recorded after its download; retry the fetch")
        return BlobHashes(entry.blob_id, digest.size, digest.xxh3, digest.piece_length, digest.pieces)


class WebSeedLocation:
    """A blob's download URL for the lease holder's web seed (agent.swarm.webseed `WebSeedOrigin`): the
    file's metadata at the origin (one HEAD; for an LFS file the signed CDN URL of its redirect), resolved
    again when the CDN refuses an expired one, as the origin engine's ranges are (agent.origin.location)."""

    def __init__(self, client: OriginClient, plan: FetchPlan, entry: FileEntry) -> None:
        self._client = client
        self._what = f"{plan.repo_id}/{entry.path}"
        self._location = FileLocation(
            lambda: client.patiently(lambda: client.file_metadata(plan.repo_id, plan.commit, entry.path)).url,
            what=entry.path,
        )

    def __call__(self) -> str:
        return self._location.url

    def worked(self, url: str) -> None:
        self._location.worked(url)

    def refused(self, url: str, reason: str) -> str:
        host = host_of(url)
        if same_host(url, self._client.endpoint):
            # Not a signed URL of the CDN's: resolving again would give the same one.
            raise AuthError(f"{self._what}: the origin refused its web seed ({reason})")
        error = CdnRefusedError(
            f"{self._what}: the origin's download host {host} refused the web seed's signed URL ({reason}); "
            "the origin itself granted access",
            host,
        )
        return self._location.refused(url, error)
