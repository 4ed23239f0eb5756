"""The libtorrent adapter: with agent.swarm.ltkit (settings, conversions), the only libtorrent importer.

One torrent per blob. The torrent's single file is the blob, saved straight into the hub
cache's `blobs/` directory, so a complete blob is seeded from the cache with no copy.

While a download runs the file is named `<blob id>.incomplete` (huggingface_hub treats
`blobs/<id>` as complete once it exists); after libtorrent has hash-checked every piece it
is renamed to `<blob id>`, fsynced, and only then reported complete (state "seeding").

Web seeds (BEP 19) and headers: `torrent_info.add_url_seed(url, auth, headers)` passes
extra headers, and libtorrent follows redirects, but it re-sends the *same* headers to the
redirect target (another host: the CDN). A bearer token for the Hub would leak to the
CDN, so `download()` refuses a web seed that has an Authorization header; the daemon
resolves the Hub's redirect itself and passes the final signed CDN URL, which needs no
auth. (See `WebSeed`.)

Resume data lives in `resume_dir/<infohash>.resume` (libtorrent's bencoded format plus
our keys `weightswarm-final-name` and `weightswarm-clean`), written atomically. Web seed URLs
are stripped from it: signed URLs expire and are credentials of a sort.

Crash safety: only `close()` writes resume data marked clean (after pausing the session, so
it is the last word). An unfinished download whose resume data is not clean (the process was
killed) is re-checked against its piece hashes when it is added again: every verified piece
the `.incomplete` file holds counts, not just those in the last periodic save.

Announces: libtorrent obeys the tracker's `interval` only above its `min_announce_interval`
(default 300 s, longer than our tracker keeps a silent peer), so SwarmSettings lowers that
floor; seeders then stay listed with no re-announce loop of our own.

Thread safety: libtorrent's session and handles are thread-safe; our per-torrent records
are guarded by one lock, and waiters sleep on its condition.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import libtorrent as lt

from agent.core.errors import SwarmError, WaitTimeoutError
from agent.core.swarm_settings import SwarmSettings
from agent.swarm.alerts import CLEAN_KEY, FINAL_NAME_KEY, RESUME_SUFFIX, TICK, AlertLoop
from agent.swarm.filter import PeerFilter
from agent.swarm.ltkit import (
    infohash_of,
    load_resume,
    session_params,
    torrent_info,
)
from agent.swarm.status import BlobStatus, Records, TorrentRecord, WebSeed

log = logging.getLogger(__name__)

__all__ = ["INCOMPLETE_SUFFIX", "RESUME_SUFFIX", "Swarm"]

INCOMPLETE_SUFFIX = ".incomplete"
_CLOSE_TIMEOUT = 10.0


class Swarm:
    """A libtorrent session seeding and fetching blobs. Several may live in one process."""

    def __init__(self, settings: SwarmSettings, resume_dir: Path) -> None:
        self.settings = settings
        self.resume_dir = Path(resume_dir)
        self.resume_dir.mkdir(parents=True, exist_ok=True)
        self._records = Records()
        self._lock, self._changed = self._records.lock, self._records.changed
        self._torrents = self._records.by_infohash
        self._closed = False
        try:
            self._ses = lt.session(session_params(settings))
        except (RuntimeError, KeyError) as exc:
            raise SwarmError(f"cannot start the BitTorrent session on {settings.listen}: {exc}") from None
        # libtorrent exempts private and loopback addresses from rate limits by default (its
        # "local" peer class). In a datacenter every peer is private, and the operator's limit
        # is meant for them: put every address in the global class only.
        everyone = 1 << lt.session.global_peer_class_id
        classes = lt.ip_filter()
        classes.add_rule("0.0.0.0", "255.255.255.255", everyone)
        classes.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", everyone)
        self._ses.set_peer_class_filter(classes)
        self.peers = PeerFilter(self._ses, settings, self._records)
        """Who may connect (agent.swarm.filter; the peer gate and the trust checks drive it)."""
        self._alerts = AlertLoop(self._ses, settings, self.resume_dir, self._records, self.peers, self.status)
        self._alerts.start()

    # -- who may connect (agent.swarm.filter) ------------------------------------------------

    def admit(self, addresses: Iterable[str]) -> None:
        self.peers.admit(addresses)

    def admits(self, address: str) -> bool:
        return self.peers.admits(address)

    def open_to_all(self, infohashes: set[str]) -> None:
        self.peers.open_to_all(infohashes)

    def resolve_web_seed_hosts(self) -> None:
        self.peers.resolve_web_seed_hosts()

    def ban(self, address: str, seconds: float) -> None:
        self.peers.ban(address, seconds)

    def banned(self) -> list[str]:
        return self.peers.banned()

    @property
    def blocked(self) -> threading.Event:
        """Set when the IP filter refused someone: the peer gate looks again at once (a new agent)."""
        return self.peers.blocked

    @property
    def loop_failures(self) -> int:
        """Times the alert loop failed and was restarted."""
        return self._alerts.loop_failures

    @property
    def healthy(self) -> bool:
        """False once the alert loop has died for good (completion would no longer be seen)."""
        return self._alerts.alive or self._closed

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def listen_port(self) -> int:
        return int(self._ses.listen_port())

    def __enter__(self) -> Swarm:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        """Save resume data for every torrent (bounded wait), stop the alert loop, end the session."""
        if self._closed:
            return
        self._closed = True
        self._ses.pause()
        alerts = self._alerts
        alerts.final_saves = True
        for rec in self._records.values():
            alerts.request_save(rec, flush=True)
        deadline = time.monotonic() + timeout
        with self._changed:
            while alerts.pending_saves and alerts.alive:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("resume data of %d torrents not saved by close", len(alerts.pending_saves))
                    break
                self._changed.wait(left)
        alerts.stop(timeout=max(1.0, deadline - time.monotonic()))
        with self._lock:
            self._torrents.clear()
        del self._ses  # the session's destructor waits for its threads

    # -- adding torrents ---------------------------------------------------------------------

    def seed(self, blob_path: Path, info: bytes, trackers: Sequence[str] = (), checked: bool = False) -> str:
        """Seed a complete blob without hashing it now; returns the infohash (hex). Idempotent.

        `checked`: this node computed `info`'s piece hashes from this file's bytes (the origin engine's
        pass, `agent publish`), so every piece is taken as had, as for a blob it downloaded by BitTorrent.
        Otherwise, without resume data, the torrent is added in seed mode: libtorrent checks each piece
        the first time a peer asks for it, so a corrupt file, or a metainfo of other bytes (the relay
        takes the tracker's piece hashes), is caught without a start-up re-hash. Those checks read and
        hash each piece once more, most of a seed's CPU (benchmarks.md, "The BitTorrent path").
        """
        blob_path = Path(blob_path)
        ti = torrent_info(info, blob_path.name)
        ih = infohash_of(ti)
        with self._lock:
            if ih in self._torrents:
                return ih
        try:
            size = blob_path.stat().st_size
        except FileNotFoundError:
            raise SwarmError(f"cannot seed {blob_path}: file does not exist") from None
        if size != ti.total_size():
            raise SwarmError(
                f"cannot seed {blob_path}: size {size} differs from the metainfo's {ti.total_size()}"
            )
        atp = self._read_resume(ih)[0]
        if atp is None or atp.ti is None or not all(atp.have_pieces or [False]):
            atp = lt.add_torrent_params()
            if checked:
                atp.have_pieces = [True] * ti.num_pieces()
            else:
                atp.flags |= lt.torrent_flags.seed_mode
        atp.ti = ti
        atp.save_path = str(blob_path.parent)
        if blob_path.name != ti.name():
            atp.renamed_files = {0: blob_path.name}
        atp.trackers = list(trackers)
        self._add(atp, ih, blob_path.parent, blob_path.name, blob_path.name, complete=True)
        return ih

    def download(
        self,
        dest_dir: Path,
        blob_id: str,
        info: bytes,
        trackers: Sequence[str] = (),
        web_seeds: Sequence[WebSeed] = (),
        peers: Sequence[tuple[str, int]] = (),
        incomplete_name: str | None = None,
    ) -> str:
        """Start fetching blob `blob_id` into `dest_dir`; returns the infohash. Idempotent.

        Until every piece is verified the file is `dest_dir/<incomplete_name>` (default
        `<blob_id>.incomplete`); then it becomes `dest_dir/<blob_id>` and status is "seeding".
        """
        dest_dir = Path(dest_dir)
        ti = torrent_info(info, blob_id)
        for ws in web_seeds:
            self.peers.admit_web_seed(ws, blob_id)
            ti.add_url_seed(ws.url, "", list(ws.headers.items()))
        ih = infohash_of(ti)
        with self._lock:
            existing = self._torrents.get(ih)
        if existing is not None:
            if web_seeds and not existing.web_seeded:
                self._count_all_as_peers(existing)
            existing.web_seeded = existing.web_seeded or bool(web_seeds)
            for ws in web_seeds:
                existing.handle.add_url_seed(ws.url)
            for host, port in peers:
                existing.handle.connect_peer((host, port))
            return ih
        incomplete = incomplete_name or blob_id + INCOMPLETE_SUFFIX
        dest_dir.mkdir(parents=True, exist_ok=True)
        resumed, clean = self._read_resume(ih)
        if resumed is not None and resumed.ti is None:
            resumed = None
        atp = resumed if resumed is not None else lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(dest_dir)
        atp.renamed_files = {0: incomplete}
        atp.trackers = list(trackers)
        # Web seeds travel in `ti` (with their headers); atp.url_seeds would add them again bare.
        atp.url_seeds = []
        if resumed is not None and not clean:
            self._forget_pieces(atp, incomplete)
        rec = self._add(atp, ih, dest_dir, blob_id, incomplete, complete=False)
        rec.web_seeded = bool(web_seeds)
        for host, port in peers:
            rec.handle.connect_peer((host, port))
        return ih

    def _count_all_as_peers(self, rec: TorrentRecord) -> None:
        """A torrent that gains its first web seed: every payload byte so far came from peers (those of
        pieces that failed their check included, from peers since banned), and the split by subtraction
        that starts now (`status`) must not count them as the web seed's."""
        payload = int(rec.handle.status().total_payload_download)
        seen = {
            (str(p.ip[0]), int(p.ip[1])): int(p.total_download)
            for p in rec.handle.get_peer_info()
            if p.connection_type == lt.peer_info.standard_bittorrent
        }
        with self._lock:
            rec.peer_bytes, rec.peer_seen = payload, seen

    def swap_web_seed(self, infohash: str, old: str, new: WebSeed) -> None:
        """Replace a downloading torrent's web seed `old` by `new` (a renewed URL, agent.swarm.webseed): the
        pieces it has stay. Removed first: a new web seed of the same URL starts with the file (the
        refused one was marked as lacking it). `new.headers` are not sent (libtorrent's handle takes none)."""
        rec = self._get(infohash)
        self.peers.admit_web_seed(new, rec.final_name)
        rec.handle.remove_url_seed(old)
        rec.handle.add_url_seed(new.url)

    def restore(self, trackers: Sequence[str] = ()) -> list[str]:
        """Re-add every torrent in resume_dir whose data file exists, without re-hashing it, announcing
        to `trackers` (resume data keeps none: the URL holds the passkey, which may change).

        Exception: an unfinished download left by a crash is re-checked (see the module docstring)."""
        restored: list[str] = []
        for path in sorted(self.resume_dir.glob("*" + RESUME_SUFFIX)):
            ih = path.name[: -len(RESUME_SUFFIX)]
            with self._lock:
                if ih in self._torrents:
                    continue
            try:
                atp, ours = load_resume(path)
                final = ours.get(FINAL_NAME_KEY)
            except (OSError, RuntimeError) as exc:
                log.warning("skipping unreadable resume file %s: %s", path, exc)
                continue
            if atp.ti is None or not final:
                log.warning("skipping resume file %s: no metainfo or final name", path)
                continue
            final_name = final.decode()
            save_path = Path(atp.save_path)
            current = dict(atp.renamed_files).get(0, atp.ti.name())
            if not (save_path / current).exists():
                log.info("not restoring %s: %s is gone", ih, save_path / current)
                path.unlink(missing_ok=True)
                continue
            # Only a verified (or seeded) blob ever has its final name: that is completeness.
            complete = current == final_name
            atp.flags &= ~(lt.torrent_flags.paused | lt.torrent_flags.auto_managed)
            atp.trackers = list(trackers)
            if not complete and not ours.get(CLEAN_KEY):
                self._forget_pieces(atp, current)
            self._add(atp, ih, save_path, final_name, current, complete=complete)
            restored.append(ih)
        return restored

    def _read_resume(self, ih: str) -> tuple[Any, bool]:
        """(libtorrent's add_torrent_params or None, whether close() wrote it)."""
        try:
            atp, ours = load_resume(self.resume_dir / (ih + RESUME_SUFFIX))
            return atp, bool(ours.get(CLEAN_KEY))
        except (OSError, RuntimeError):
            return None, False

    @staticmethod
    def _forget_pieces(atp: Any, name: str) -> None:
        # The resume data predates the crash: pieces verified after its last save are on disk but
        # not in it. Without a piece list libtorrent hashes the partial file (holes read as zeros,
        # fast) and recovers all of them; re-downloading them from peers would cost the network
        # what a local read costs the disk. Not force_recheck() after adding: libtorrent ignores
        # it while the torrent still checks its resume data, then trusts the stale list (seen in
        # CI, and in plain adds on an idle machine).
        log.info("re-checking unfinished %s after an unclean stop", name)
        atp.have_pieces = []
        atp.verified_pieces = []
        atp.unfinished_pieces = {}

    def _add(
        self, atp: Any, ih: str, save_path: Path, final: str, current: str, complete: bool
    ) -> TorrentRecord:
        if self._closed:
            raise SwarmError("the BitTorrent session is closed")
        # Not auto-managed: libtorrent's queueing would pause torrents beyond active_limit,
        # and a node must seed every blob it has.
        atp.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        # Set or cleared here, never taken from resume data (which keeps the flag): turning the setting
        # off turns it off for the seeds a restart restores.
        if complete and self.settings.super_seed and atp.ti.num_pieces() > 1:
            atp.flags |= lt.torrent_flags.super_seeding
        else:
            atp.flags &= ~lt.torrent_flags.super_seeding
        # A complete blob is the cache's, verified: libtorrent never writes to it. Without upload mode, a
        # piece failing its check in seed mode (a file changed on disk, a forged metainfo) takes the torrent
        # into a recheck, after which it downloads what it then lacks into that file, from any peer whose
        # bytes match the metainfo.
        if complete:
            atp.flags |= lt.torrent_flags.upload_mode
        else:
            atp.flags &= ~lt.torrent_flags.upload_mode
        atp.max_connections = self.settings.max_connections_per_torrent
        # Under the lock, so the alert loop (`_record_for`) cannot see this torrent's alerts before
        # its record exists: a small blob can be fetched from LAN peers before this thread gets the
        # GIL back, and its dropped torrent_finished_alert left it "finishing" for ever (benchmark).
        with self._changed:
            try:
                handle = self._ses.add_torrent(atp)
            except RuntimeError as exc:
                raise SwarmError(f"libtorrent refused torrent {ih}: {exc}") from None
            total = atp.ti.total_size()
            rec = TorrentRecord(
                handle,
                ih,
                save_path,
                final,
                current,
                total=total,
                complete=complete,
                piece_length=atp.ti.piece_length(),
            )
            self._torrents[ih] = rec
            self._changed.notify_all()
        self._alerts.request_save(rec)
        return rec

    # -- queries and control -----------------------------------------------------------------

    def torrents(self) -> list[str]:
        with self._lock:
            return list(self._torrents)

    def _get(self, ih: str) -> TorrentRecord:
        with self._lock:
            rec = self._torrents.get(ih)
        if rec is None:
            raise SwarmError(f"no torrent {ih} in this session")
        return rec

    def status(self, infohash: str) -> BlobStatus:
        rec = self._get(infohash)
        st = rec.handle.status()
        with self._lock:
            if st.total_wanted_done != rec.last_done:
                rec.last_done = st.total_wanted_done
                rec.last_progress = time.monotonic()
            payload = int(st.total_payload_download)
            peers = min(rec.peer_bytes, payload) if rec.web_seeded else payload
            return BlobStatus(
                infohash=infohash,
                state=self._state(rec, st),
                path=rec.save_path / rec.final_name,
                total=rec.total,
                done=int(st.total_wanted_done),
                num_peers=int(st.num_peers),
                num_seeds=int(st.num_seeds),
                bytes_from_peers=peers,
                bytes_from_web_seeds=payload - peers,
                bytes_uploaded=int(st.total_payload_upload),
                hash_failures=rec.hash_failures,
                banned_peers=rec.banned_peers,
                error=rec.error or (st.errc.message() if st.errc.value() else None),
                last_progress_monotonic=rec.last_progress,
                swarm_seeders=int(st.num_complete),
                web_seed_errors=rec.web_seed_errors,
                web_seed_error=rec.web_seed_error,
                web_seed_refusal=rec.web_seed_refusal,
                pieces=int(st.num_pieces),
                seed_sources=frozenset(rec.seed_sources),
                rechecks=rec.rechecks,
            )

    def verified_prefix(self, infohash: str) -> int:
        """Bytes from the start of the blob covered by pieces that passed their hash check, as read back
        from the file.

        libtorrent says a piece passed once its hash of the received blocks matches; its disk backend
        writes them milliseconds later (the check may pass before the file even exists). A reader of
        the file in that window got zeros, and the HF endpoint streamed them to a client, which kept a
        corrupt model. So each piece is read back and hashed against the metainfo, once (called while
        someone streams the blob: by one thread per blob)."""
        rec = self._get(infohash)
        if rec.complete:
            return rec.total
        pieces = rec.handle.status(lt.torrent_handle.query_pieces).pieces
        first_missing = next((i for i, have in enumerate(pieces) if not have), len(pieces))
        n = rec.pieces_on_disk
        if n < first_missing:
            ti = rec.handle.torrent_file()
            try:
                fd = os.open(rec.save_path / rec.current_name, os.O_RDONLY)
            except FileNotFoundError:
                return n * rec.piece_length
            except OSError as exc:
                raise SwarmError(f"cannot read {rec.current_name}: {exc.strerror}") from None
            try:
                while n < first_missing:
                    data = os.pread(fd, rec.piece_length, n * rec.piece_length)
                    if hashlib.sha1(data, usedforsecurity=False).digest() != ti.hash_for_piece(n):
                        break  # not written yet: asked again at the next look
                    n += 1
            finally:
                os.close(fd)
            rec.pieces_on_disk = n
        return min(rec.total, n * rec.piece_length)

    def read_ahead(self, infohash: str, offset: int, nbytes: int) -> None:
        """Ask for the pieces covering [offset, offset + nbytes) first, in order (a reader streams them).

        Piece deadlines, libtorrent's streaming mode: the rest of the blob still comes rarest-first, so
        one node reading in order does not make every node want the same pieces at once."""
        rec = self._get(infohash)
        if rec.complete or nbytes <= 0:
            return
        first = offset // rec.piece_length
        last = min((offset + nbytes - 1) // rec.piece_length, (rec.total - 1) // rec.piece_length)
        for n, piece in enumerate(range(first, last + 1)):
            rec.handle.set_piece_deadline(piece, 200 * (n + 1))

    def _state(self, rec: TorrentRecord, st: Any) -> str:
        if rec.error or st.errc.value():
            return "error"
        if st.state in (lt.torrent_status.checking_files, lt.torrent_status.checking_resume_data):
            return "checking"
        if rec.complete:
            return "seeding"
        if st.is_finished:
            return "finishing"
        if st.paused:
            return "paused"
        if time.monotonic() - rec.last_progress > self.settings.stall_timeout:
            return "stalled"
        return "downloading"

    def wait(self, infohash: str, timeout: float) -> BlobStatus:
        """Block until the blob is complete (final name, flushed) or failed; at most `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(infohash)
            if status.state in ("seeding", "error"):
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeoutError(
                    f"blob torrent {infohash} not complete after {timeout:.0f}s "
                    f"({status.done}/{status.total} bytes, {status.num_peers} peers, state {status.state})"
                )
            with self._changed:
                self._changed.wait(min(left, TICK))

    def remove(self, infohash: str, delete_files: bool = False) -> None:
        """Stop seeding/fetching; forget its resume data; with delete_files also its data file."""
        with self._lock:
            rec = self._torrents.pop(infohash, None)
            self._alerts.pending_saves.discard(infohash)
        if rec is None:
            return
        flags = lt.session.delete_files if delete_files else 0
        self._ses.remove_torrent(rec.handle, flags)
        (self.resume_dir / (infohash + RESUME_SUFFIX)).unlink(missing_ok=True)

    def force_reannounce(self, infohash: str | None = None) -> None:
        with self._lock:
            recs = list(self._torrents.values()) if infohash is None else [self._torrents[infohash]]
        for rec in recs:
            rec.handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)

    def add_peer(self, infohash: str, host: str, port: int) -> None:
        self._get(infohash).handle.connect_peer((host, port))
