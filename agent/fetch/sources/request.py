"""One blob of one daemon fetch, as the source policy (agent.fetch.sources.policy) obtains it: which blob,
where it goes, how its progress is told, and the ways this fetch brings bytes that the policy may call:
the origin engine (whole, or in parts with feeds), the relay receiver, the origin's URL for a web seed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent.cache.layout import RepoCache
from agent.core.errors import AuthError
from agent.core.parts import PartSink, Shares
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress
from agent.fetch.engine import install_downloaded
from agent.origin.answers import CdnRefusedError, host_of, same_host
from agent.origin.client import Origin
from agent.origin.location import FileLocation
from agent.origin.ranges import OriginSource
from agent.relay.receiver import RelayReceiver

Prefix = Callable[[int], None]
"""Told how far the blob is written from its start (readers stream that far)."""


class BlobRequest:
    """One blob to obtain for one fetch. The engines it runs count their bytes here (`engine_bytes`,
    `engine_resumed`) for the fetch's totals; used by the one thread that obtains the blob."""

    def __init__(
        self,
        plan: FetchPlan,
        entry: FileEntry,
        cache: RepoCache,
        progress: FileProgress,
        origin: OriginSource,
        relay: RelayReceiver | None,
        verify_safetensors: bool,
    ) -> None:
        self.plan, self.blob, self.cache, self.progress = plan, entry, cache, progress
        self._origin, self._relay = origin, relay
        self._verify_safetensors = verify_safetensors
        self.web_seed = WebSeedLocation(origin.client, plan, entry)
        """The blob's download URL at the origin, for a lease holder's web seed."""
        self.has_relay = relay is not None
        self.engine_bytes = 0
        """Bytes the origin engine pulled for this blob (a web seed's are counted by the swarm)."""
        self.engine_resumed = 0
        self._reported = 0
        self._lock = threading.Lock()

    def report(self, done: int) -> None:
        """The bytes of the blob present now, whichever engine brought them."""
        with self._lock:
            if done > self._reported:
                self.progress.advance(done - self._reported)
                self._reported = done

    def present(self) -> int | None:
        """The bytes present now (lease heartbeats report it), or None while the origin itself says "later"
        (`told_to_wait`: that is no stall). `progress.done` counts the origin engine's bytes too."""
        return None if self._origin.client.told_to_wait else self.progress.done

    def stage(self, stage: str) -> None:
        """Where the blob is: "lease", "origin", "peers", "verifying"."""
        self.progress.set_stage(stage)

    def from_origin(self, prefix: Prefix, shares: Shares | None = None) -> int:
        """The blob through the origin engine, installed as `blobs/<id>` with its sidecar; the bytes its
        feeds brought when it comes in `shares` (parts held elsewhere arrive from their relays)."""
        # A source of its own per blob: the shared one's counters also move with the other blobs
        # downloading at the same time, which would count their bytes here too.
        origin = self._origin
        one = OriginSource(origin.client, origin.settings, piece_hashes=origin.piece_hashes, turn=origin.turn)
        try:
            hashes = one.fetch_blob(
                self.plan, self.blob, self.cache, self.progress, prefix=prefix, shares=shares
            )
        finally:
            self.engine_bytes += one.bytes_received
            self.engine_resumed += one.bytes_resumed
        with self._lock:
            self._reported = self.blob.size
        install_downloaded(self.cache, self.blob, hashes, self._verify_safetensors)
        return one.bytes_relayed

    def from_relay(self, prefix: Prefix, chain: bool, pieces: bytes | None) -> int | None:
        """The blob from the nodes relaying it (agent.relay.receiver), installed; the bytes received, or
        None when they could not finish it (what arrived stays recorded for the origin engine)."""
        assert self._relay is not None
        chunk = self._origin.settings.chunk_size
        got = self._relay.receive(
            self.plan, self.blob, self.cache, chunk, self.progress, prefix, chain, pieces
        )
        if got is None:
            return None
        hashes, received = got
        with self._lock:
            self._reported = self.blob.size
        install_downloaded(self.cache, self.blob, hashes, self._verify_safetensors)
        return received

    def relay_part(self, key: str, sink: PartSink) -> bool:
        """One part of the blob from the nodes relaying it under `key`; True once the part is whole."""
        assert self._relay is not None
        return self._relay.feed(key, sink)


class WebSeedLocation:
    """A blob's download URL for the lease holder's web seed (agent.swarm.webseed `WebSeedOrigin`): the
    file's metadata at the origin (one HEAD; for an LFS file the signed CDN URL of its redirect), resolved
    again when the CDN refuses an expired one, as the origin engine's ranges are (agent.origin.location)."""

    def __init__(self, client: Origin, plan: FetchPlan, entry: FileEntry) -> None:
        self._client = client
        self._what = f"{plan.repo_id}/{entry.path}"
        # Resolved on first use (a metadata request at the origin): only a lease holder web-seeds.
        self._location = FileLocation(
            lambda: client.web_seed_url(plan.repo_id, plan.commit, entry.path) or "", what=entry.path
        )

    def __call__(self) -> str:
        """The current URL; "" when the origin offers no web seed."""
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
