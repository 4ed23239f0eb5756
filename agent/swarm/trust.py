"""Which published metainfo a node still uses, and what it does about one that proved wrong.

Any holder of the tracker's agent token can publish a blob's metainfo, and the first one published is
the one every node downloads against. A node that publishes piece hashes of other bytes, and seeds
those bytes, would have every piece pass while the blob's own hash (sha256 / git sha1, the blob id)
fails once the torrent completes. That is proof the metainfo is wrong: the node drops the bytes,
bans the seeds that sent them (`Swarm.ban`), reports the metainfo (the tracker quarantines it) and
takes the blob through the origin-lease path as if no metainfo existed, so one node pulls it from the
origin and publishes the metainfo of bytes it verified (agent.fetch.sources.policy). The seeds are those the
swarm saw connected as seeds with payload sent (sampled as pieces pass, every half second): one that
sends a whole small blob and leaves between two samples goes unbanned, and its metainfo is still
reported and replaced.

Pieces that keep failing their hashes with none passing are weaker evidence: a swarm of corrupt
peers looks the same under a right metainfo. The node then goes the same way without a report; a
node that holds verified bytes and finds another dict published checks that dict against its bytes
(`describes`, at the dict's own piece size) and reports and replaces it only if they differ.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from agent.core.errors import IntegrityError, TrackerError, TrackerUnavailableError
from agent.core.metainfo import infohash
from agent.core.plan import FileEntry
from agent.swarm.session import Swarm
from agent.tracking.client import TrackerClient
from wirekit.bencode import bdecode

log = logging.getLogger(__name__)

BAN_SECONDS = 3600.0
"""How long a seed that served bytes matching a wrong metainfo is refused (`Swarm.ban`). Bounded: an
honest node that finished the same wrong torrent is a seed of it for as long as its own check takes."""
MAX_BAD_METAINFO = 3
"""Wrong metainfos one node meets for one blob before it takes the blob from the origin at once."""


class BadMetainfo(Exception):
    """The torrent of a published metainfo cannot give the blob's bytes."""

    def __init__(self, reason: str, infohash: str, proven: bool, seeds: frozenset[str] = frozenset()) -> None:
        super().__init__(reason)
        self.infohash = infohash
        self.proven = proven
        """Bytes matching every piece hash failed the blob id (or the dict does not describe the blob):
        the metainfo is wrong. False: pieces fail, which corrupt peers also cause."""
        self.seeds = seeds
        """Seeds that sent those bytes (proven only)."""


def check_info(blob: FileEntry, info: bytes) -> None:
    """IntegrityError unless `info` is a bencoded dict naming the blob, of the blob's size."""
    try:
        d = bdecode(info)
    except ValueError:
        raise IntegrityError(f"the tracker's metainfo for {blob.path} is not valid bencode") from None
    if not isinstance(d, dict) or d.get(b"name") != blob.blob_id.encode() or d.get(b"length") != blob.size:
        raise IntegrityError(
            f"the tracker's metainfo for {blob.path} does not describe blob {blob.blob_id} "
            f"of {blob.size} bytes"
        )


def describes(path: Path, blob: FileEntry, info: bytes) -> bool:
    """Whether `info` is a metainfo of the file at `path` (this node's verified copy of `blob`): its
    length, and every piece hash recomputed (SHA-1, at its own piece length)."""
    try:
        d = bdecode(info)
    except ValueError:
        return False
    if not isinstance(d, dict) or d.get(b"length") != blob.size:
        return False
    piece_length, pieces = d.get(b"piece length"), d.get(b"pieces")
    if not isinstance(piece_length, int) or piece_length <= 0 or not isinstance(pieces, bytes):
        return False
    with open(path, "rb") as fh:
        for at in range(0, len(pieces), 20):
            if hashlib.sha1(fh.read(piece_length)).digest() != pieces[at : at + 20]:
                return False
        return fh.read(1) == b""


class MetainfoTrust:
    """The metainfos this node found wrong (or suspect), per blob, for the life of the process.
    Thread-safe."""

    def __init__(self, swarm: Swarm, tracker: TrackerClient | None, node_id: str) -> None:
        self.swarm = swarm
        self.tracker = tracker
        self.node_id = node_id
        self._lock = threading.Lock()
        self._distrusted: dict[str, dict[str, bool]] = {}
        """blob id -> infohashes of its metainfo found wrong (True) or suspect (False)."""

    def usable(self, blob: FileEntry, info: bytes | None) -> bytes | None:
        """The tracker's metainfo for the blob, or None when there is none or it is wrong (a dict that
        does not describe the blob is reported) or this node found it wrong or suspect before."""
        if info is None:
            return None
        ih = infohash(info)
        try:
            check_info(blob, info)
        except IntegrityError as exc:
            self.distrust(blob, BadMetainfo(str(exc), ih, proven=True))
            return None
        with self._lock:
            if ih in self._distrusted.get(blob.blob_id, {}):
                return None
        return info

    def distrust(self, blob: FileEntry, bad: BadMetainfo) -> None:
        """Stop using a wrong (or suspect) metainfo of the blob; a wrong one is reported, and the seeds
        that served its bytes are banned."""
        with self._lock:
            seen = self._distrusted.setdefault(blob.blob_id, {})
            seen[bad.infohash] = seen.get(bad.infohash, False) or bad.proven
        if not bad.proven:
            log.warning("%s; taking the origin-lease path", bad)
            return
        log.error("wrong metainfo for %s: %s; reporting it and taking the origin-lease path", blob.path, bad)
        for address in sorted(bad.seeds):
            self.swarm.ban(address, BAN_SECONDS)
        self.report(blob, bad.infohash, str(bad))

    def trust_again(self, blob: FileEntry, ih: str) -> None:
        """This node's own verified bytes have metainfo `ih`: it was not wrong, whatever failed before."""
        with self._lock:
            self._distrusted.get(blob.blob_id, {}).pop(ih, None)

    def bad_count(self, blob: FileEntry) -> int:
        """Wrong metainfos (proven) this node met for the blob."""
        with self._lock:
            return sum(self._distrusted.get(blob.blob_id, {}).values())

    def report(self, blob: FileEntry, ih: str, reason: str) -> None:
        if self.tracker is None:
            return
        try:
            if self.tracker.report_metainfo(blob.blob_id, ih, reason, self.node_id):
                log.warning("%s: the tracker quarantined metainfo %s", blob.path, ih)
        except TrackerError as exc:
            log.warning("could not report the wrong metainfo %s of %s: %s", ih, blob.path, exc)

    def publish(self, path: Path, blob: FileEntry, info: bytes) -> None:
        """Publish the metainfo of this node's verified copy of the blob (at `path`). When the tracker
        has another dict for it, check that dict against these bytes: one they do not match is wrong,
        and is reported (the tracker quarantines it) and replaced; one they match (another piece size)
        stays."""
        if self.tracker is None:
            return
        for attempt in range(2):
            try:
                self.tracker.put_metainfo(blob.blob_id, info)
                return
            except TrackerError as exc:
                if exc.status != 409 or isinstance(exc, TrackerUnavailableError) or attempt:
                    log.warning(
                        "could not publish metainfo of %s (will retry when the tracker is back): %s",
                        blob.path,
                        exc,
                    )
                    return
            try:
                current = self.tracker.get_metainfo(blob.blob_id)
            except TrackerError as exc:
                log.warning("could not read the published metainfo of %s: %s", blob.path, exc)
                return
            if current is not None and describes(path, blob, current):
                return  # a right dict of the same bytes (another piece size): keep it
            if current is not None:
                reason = "its piece hashes do not match bytes verified end to end"
                self.report(blob, infohash(current), reason)
