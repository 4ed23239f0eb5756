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
from urllib.parse import urlsplit

import libtorrent as lt

from agent.cache.layout import write_atomic
from agent.core.errors import SwarmError, WaitTimeoutError
from agent.core.settings import SwarmSettings
from agent.swarm.ltkit import (
    bdecode_dict,
    fsync_file_and_dir,
    infohash_of,
    load_resume,
    redact_tracker_url,
    session_params,
    torrent_info,
)
from agent.swarm.status import BlobStatus, TorrentRecord, WebSeed, WebSeedRefusal
from agent.swarm.webseed import WebSeedHosts, check_credentials, http_status

log = logging.getLogger(__name__)

RESUME_SUFFIX = ".resume"
_BLOCKED = 1
"""`ip_filter` access flag: blocked (libtorrent's ip_filter::blocked)."""
_BY_IP_FILTER = 0
"""`peer_blocked_alert.reason` when the IP filter refused the peer."""
INCOMPLETE_SUFFIX = ".incomplete"
_FINAL_NAME_KEY = b"weightswarm-final-name"
_CLEAN_KEY = b"weightswarm-clean"
_TICK = 0.25  # seconds: alert wait bound, so close() stops the loop promptly
_BLOCK_FINISHED = 3
"""`get_download_queue()` block state: written (libtorrent's block_info::finished)."""
_POLL_PEERS = 0.5  # seconds between per-peer counter polls (web seed vs peer bytes)
_CLOSE_TIMEOUT = 10.0
_MAX_LOOP_RESTARTS = 20


class Swarm:
    """A libtorrent session seeding and fetching blobs. Several may live in one process."""

    def __init__(self, settings: SwarmSettings, resume_dir: Path) -> None:
        self.settings = settings
        self.resume_dir = Path(resume_dir)
        self.resume_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._torrents: dict[str, TorrentRecord] = {}
        self._pending_saves: set[str] = set()
        self._stop = threading.Event()
        self._closed = False
        self._final_saves = False
        """Set by close() once the session is paused: resume data saved from then on is clean."""
        self.loop_failures = 0
        """Times the alert loop failed and was restarted (each one is logged with its traceback)."""
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
        self._banned: dict[str, float] = {}
        """Addresses refused whatever the gate admits (`ban`) -> when the ban ends (monotonic)."""
        self._admitted: frozenset[str] = frozenset()
        self._web_hosts = WebSeedHosts()
        self.blocked = threading.Event()
        """Set when the IP filter refused someone: the peer gate looks again at once (a new agent)."""
        self._apply_ip_filter()
        self._thread = threading.Thread(target=self._supervise, name="swarm-alerts", daemon=True)
        self._thread.start()

    # -- who may connect (agent.swarm.gate) ---------------------------------------------------

    def admit(self, addresses: Iterable[str]) -> None:
        """Exchange bytes with these addresses only (the cluster's agents), plus the hosts of the web
        seeds in use. Every torrent applies the filter, both ways: an outsider that knows an
        infohash connects to nothing and is refused when it connects."""
        admitted = frozenset(addresses)
        if admitted != self._admitted:
            joined = admitted - self._admitted
            self._admitted = admitted
            self._apply_ip_filter()
            if joined:
                # libtorrent dropped these peers from its lists while they were filtered: downloads
                # ask the tracker again now rather than at their next interval.
                with self._lock:
                    pending = [r for r in self._torrents.values() if not r.complete]
                for rec in pending:
                    rec.handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)

    def admits(self, address: str) -> bool:
        """Whether the peer gate lets this address exchange bytes (always, with the gate off). A refusal
        makes the gate ask the tracker again soon, as a refused connection does (a node that just joined)."""
        if not self.settings.peer_gate or address in self._admitted:
            return True
        self.blocked.set()
        return False

    def open_to_all(self, infohashes: set[str]) -> None:
        """Exempt these torrents from the IP filter (stock clients may exchange their bytes: only for
        blobs of models the origin reports public, with --interop-public); close every other."""
        with self._lock:
            records = list(self._torrents.values())
        for rec in records:
            want_open = rec.infohash in infohashes
            if want_open != rec.open_to_all:
                if want_open:
                    rec.handle.unset_flags(lt.torrent_flags.apply_ip_filter)
                else:
                    rec.handle.set_flags(lt.torrent_flags.apply_ip_filter)
                rec.open_to_all = want_open

    def resolve_web_seed_hosts(self) -> None:
        """Look up the web seeds' hosts again (a CDN's addresses change); admit what they resolve to."""
        if self._web_hosts.refresh():
            self._apply_ip_filter()

    def _apply_ip_filter(self) -> None:
        f = lt.ip_filter()
        if not self.settings.peer_gate:
            self._add_bans(f)
            self._ses.set_ip_filter(f)  # everyone but banned peers (--no-peer-gate)
            return
        f.add_rule("0.0.0.0", "255.255.255.255", _BLOCKED)
        f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", _BLOCKED)
        for address in self._admitted | self._web_hosts.addresses():
            f.add_rule(address, address, 0)
        self._add_bans(f)
        self._ses.set_ip_filter(f)

    def _add_bans(self, f: Any) -> None:
        """Block the banned addresses in filter `f`: added last, a ban outranks admission."""
        with self._lock:
            banned = list(self._banned)
        for address in banned:
            f.add_rule(address, address, _BLOCKED)

    def ban(self, address: str, seconds: float) -> None:
        """Refuse `address` (one IP) every connection, both ways and in every torrent, for `seconds`,
        even if the peer gate admits it: a peer that fed us a blob whose bytes failed its own hash.

        Bad pieces are libtorrent's own business: a peer whose data fails a piece hash is banned from
        that torrent (smart_ban, one of the session's default plugins, finds which peer sent the bad
        block when several did). A ban here is for what libtorrent cannot see: pieces that match a
        wrong metainfo."""
        with self._lock:
            new = address not in self._banned
            self._banned[address] = max(self._banned.get(address, 0.0), time.monotonic() + seconds)
        if new:
            log.warning("banned peer %s for %.0f s: it served a blob that failed its hash", address, seconds)
            self._apply_ip_filter()

    def banned(self) -> list[str]:
        """Addresses banned now (`ban`)."""
        with self._lock:
            return sorted(self._banned)

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
        self._final_saves = True
        with self._lock:
            records = list(self._torrents.values())
        for rec in records:
            self._request_save(rec, flush=True)
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending_saves and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("resume data of %d torrents not saved by close", len(self._pending_saves))
                    break
                self._changed.wait(left)
        self._stop.set()
        self._thread.join(timeout=max(1.0, deadline - time.monotonic()))
        with self._lock:
            self._torrents.clear()
        del self._ses  # the session's destructor waits for its threads

    # -- adding torrents ---------------------------------------------------------------------

    def seed(self, blob_path: Path, info: bytes, trackers: Sequence[str] = ()) -> str:
        """Seed a complete blob without hashing it now; returns the infohash (hex). Idempotent.

        Without resume data the torrent is added in seed mode: libtorrent checks each piece the
        first time a peer asks for it, so a corrupt file is caught without a start-up re-hash.
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
            self._admit_web_seed(ws, blob_id)
            ti.add_url_seed(ws.url, "", list(ws.headers.items()))
        ih = infohash_of(ti)
        with self._lock:
            existing = self._torrents.get(ih)
        if existing is not None:
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

    def _admit_web_seed(self, ws: WebSeed, blob_id: str) -> None:
        check_credentials(ws, blob_id)
        if self._web_hosts.add(ws.url):
            self._apply_ip_filter()

    def swap_web_seed(self, infohash: str, old: str, new: WebSeed) -> None:
        """Replace a downloading torrent's web seed `old` by `new` (a renewed URL, agent.swarm.webseed): the
        pieces it has stay. Removed first: a new web seed of the same URL starts with the file (the
        refused one was marked as lacking it). `new.headers` are not sent (libtorrent's handle takes none)."""
        rec = self._get(infohash)
        self._admit_web_seed(new, rec.final_name)
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
                final = ours.get(_FINAL_NAME_KEY)
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
            if not complete and not ours.get(_CLEAN_KEY):
                self._forget_pieces(atp, current)
            self._add(atp, ih, save_path, final_name, current, complete=complete)
            restored.append(ih)
        return restored

    def _read_resume(self, ih: str) -> tuple[Any, bool]:
        """(libtorrent's add_torrent_params or None, whether close() wrote it)."""
        try:
            atp, ours = load_resume(self.resume_dir / (ih + RESUME_SUFFIX))
            return atp, bool(ours.get(_CLEAN_KEY))
        except (OSError, RuntimeError):
            return None, False

    @staticmethod
    def _forget_pieces(atp: Any, name: str) -> None:
        # The resume data predates the crash: pieces verified after its last save are on disk but
        # not in it. Without a piece list libtorrent hashes the partial file (holes read as zeros,
        # fast) and recovers all of them; re-downloading them from peers would cost the network
        # what a local read costs the disk. Not force_recheck() after adding: libtorrent ignores
        # it while the torrent still checks its resume data, then trusts the stale list (seen in
        # CI, and in 1 of 6 plain adds on an idle machine).
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
                handle, ih, save_path, final, current, total=total, complete=complete,
                piece_length=atp.ti.piece_length(),
            )
            self._torrents[ih] = rec
            self._changed.notify_all()
        self._request_save(rec)
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
                download_rate=int(st.download_payload_rate),
                upload_rate=int(st.upload_payload_rate),
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
        writes them later (10-25 ms measured on loopback, or before the file even exists). A reader of
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
                self._changed.wait(min(left, _TICK))

    def remove(self, infohash: str, delete_files: bool = False) -> None:
        """Stop seeding/fetching; forget its resume data; with delete_files also its data file."""
        with self._lock:
            rec = self._torrents.pop(infohash, None)
            self._pending_saves.discard(infohash)
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

    # -- alert loop --------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Run the alert loop; log a failure at once and restart it (bounded)."""
        while not self._stop.is_set():
            try:
                self._loop()
            except Exception:
                self.loop_failures += 1
                log.exception("swarm alert loop failed (%d); restarting", self.loop_failures)
                if self.loop_failures >= _MAX_LOOP_RESTARTS:
                    log.error("swarm alert loop gave up after %d failures", self.loop_failures)
                    return
                self._stop.wait(min(5.0, 0.1 * 2**self.loop_failures))
            else:
                if not self._stop.is_set():
                    log.error("swarm alert loop returned while the swarm is open; restarting")

    @property
    def healthy(self) -> bool:
        """False once the alert loop has died for good (completion would no longer be seen)."""
        return self._thread.is_alive() or self._closed

    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            if self._ses.wait_for_alert(int(_TICK * 1000)) is not None:
                for alert in self._ses.pop_alerts():
                    self._on_alert(alert)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + _POLL_PEERS
                self._poll()

    def _poll(self) -> None:
        with self._lock:
            recs = list(self._torrents.values())
        now = time.monotonic()
        with self._lock:
            ended = [address for address, until in self._banned.items() if until <= now]
            for address in ended:
                del self._banned[address]
        if ended:
            self._apply_ip_filter()
        for rec in recs:
            if now - rec.last_resume_save > self.settings.resume_interval:
                rec.last_resume_save = now
                self._request_save(rec, only_if_modified=True)
            if rec.complete:
                continue
            self._sample_sources(rec)
            self._note_seeds(rec)
            state = self.status(rec.infohash).state  # also refreshes last_progress
            if state == "finishing":
                # A safety net should a torrent_finished_alert ever be lost (a full alert queue).
                self._on_finished(rec)
            elif state in ("downloading", "stalled"):
                self._recheck_held(rec, now)

    def _recheck_held(self, rec: TorrentRecord, now: float) -> None:
        """Re-check the file of a blob that holds a written piece with no hash verdict.

        libtorrent 2.1's pread disk I/O hashes a piece from its write cache and may report the
        writes done only later. When the piece failed its hash meanwhile and was reset for download
        again, those late reports mark its blocks written once more, and nothing asks for a verdict
        again: every block is "finished", the piece is neither had nor wanted, and the blob waits
        forever at (nearly) all its bytes. It happens after a peer sent bad pieces (libtorrent's log
        showed the late write reports); 64 bad pieces handed to `add_piece` hold one in about one
        round in fifteen (tests/swarm/test_swarm.py). A verdict takes milliseconds, so a piece held
        that long with no progress is this. libtorrent's way back is a re-check of the file: it drops
        the piece picker, keeps the pieces that hash right and fetches the rest again. The queue is
        read, and the whole file re-read, at most once per `held_piece_recheck`: a blob merely
        waiting for peers is looked at that rarely."""
        if now - max(rec.last_progress, rec.last_held_look) < self.settings.held_piece_recheck:
            return
        rec.last_held_look = now
        held = [
            int(piece["piece_index"])
            for piece in rec.handle.get_download_queue()
            if piece["blocks"] and all(block["state"] == _BLOCK_FINISHED for block in piece["blocks"])
        ]
        if not held:
            return
        with self._lock:
            rec.rechecks += 1
        log.warning(
            "blob %s: libtorrent holds piece(s) %s written, with no hash verdict for %.0fs; re-checking",
            rec.final_name,
            ", ".join(map(str, held[:8])),
            now - rec.last_progress,
        )
        rec.handle.force_recheck()

    def _sample_sources(self, rec: TorrentRecord) -> None:
        """Add BitTorrent peers' new payload bytes to the torrent's peer total.

        libtorrent counts payload per torrent, not per source. Peer connections update their
        counters block by block, web seed connections only when a whole HTTP response is in
        (up to 16 MiB): so peers are summed from their per-connection counters, sampled on
        every verified piece and every poll, and web seed bytes are the rest. Bytes a peer sends
        after the last sample of a connection that then closes count as web seed bytes (errs
        towards over-stating origin egress, never hiding it). Without web seeds all is peers, and
        nothing is sampled: get_peer_info on every verified piece is CPU a warm fetch can use.
        """
        if rec.complete or not rec.web_seeded:
            return
        for p in rec.handle.get_peer_info():
            if p.connection_type != lt.peer_info.standard_bittorrent:
                continue
            key = (str(p.ip[0]), int(p.ip[1]))
            got = int(p.total_download)
            with self._lock:
                seen = rec.peer_seen.get(key, 0)
                # A reconnect from the same endpoint restarts the connection's counter.
                rec.peer_bytes += got - seen if got >= seen else got
                rec.peer_seen[key] = got

    def _note_seeds(self, rec: TorrentRecord, now: bool = False) -> None:
        """Add the addresses of seeds that sent this torrent payload to `rec.seed_sources`; at most
        every _POLL_PEERS seconds (the first verified piece included) unless `now`."""
        at = time.monotonic()
        if rec.complete or (not now and at - rec.last_seed_sample < _POLL_PEERS):
            return
        rec.last_seed_sample = at
        seeds = {
            str(p.ip[0])
            for p in rec.handle.get_peer_info()
            if p.connection_type == lt.peer_info.standard_bittorrent
            and p.flags & lt.peer_info.seed
            and p.total_download > 0
        }
        if seeds:
            with self._lock:
                rec.seed_sources |= seeds

    def _record_for(self, alert: Any) -> TorrentRecord | None:
        handle = getattr(alert, "handle", None)
        if handle is None or not handle.is_valid():
            return None
        ih = str(handle.info_hashes().v1)
        with self._lock:
            return self._torrents.get(ih)

    def _on_alert(self, alert: Any) -> None:
        if isinstance(alert, lt.save_resume_data_alert):
            self._on_resume_data(alert)
            return
        if isinstance(alert, lt.save_resume_data_failed_alert):
            self._save_done(self._record_for(alert))
            return
        if isinstance(alert, lt.peer_blocked_alert) and alert.reason == _BY_IP_FILTER:
            log.debug("refused a connection from/to %s: not an agent of this cluster", alert.ip[0])
            self.blocked.set()
            return
        rec = self._record_for(alert)
        if rec is None:
            return
        if isinstance(alert, lt.piece_finished_alert):
            self._sample_sources(rec)
            self._note_seeds(rec)
        elif isinstance(alert, lt.torrent_finished_alert):
            self._sample_sources(rec)
            self._note_seeds(rec, now=True)
            self._on_finished(rec)
        elif isinstance(alert, lt.file_renamed_alert):
            self._on_renamed(rec, str(alert.new_name()))
        elif isinstance(alert, lt.hash_failed_alert):
            with self._lock:
                rec.hash_failures += 1
            log.warning("piece %d of %s failed its hash check", alert.piece_index, rec.final_name)
        elif isinstance(alert, lt.peer_ban_alert):
            with self._lock:
                rec.banned_peers += 1
            log.warning("banned peer %s:%d for %s (sent bad data)", *alert.endpoint, rec.final_name)
        elif isinstance(alert, lt.file_rename_failed_alert | lt.torrent_error_alert | lt.file_error_alert):
            self._fail(rec, alert.message())
        elif isinstance(alert, lt.tracker_error_alert):
            # Not alert.message(): it holds the announce URL, and with it the tracker's passkey.
            url = redact_tracker_url(str(alert.tracker_url()))
            reason = str(alert.failure_reason() or alert.error.message())
            log.info("tracker error for %s from %s: %s", rec.final_name, url, reason)
        elif isinstance(alert, lt.url_seed_alert):
            self._on_web_seed_error(rec, alert)

    def _on_web_seed_error(self, rec: TorrentRecord, alert: Any) -> None:
        # Not alert.message(): it holds the whole URL, and a signed CDN URL's query is a credential.
        parts = urlsplit(str(alert.server_url()))
        reason = str(alert.error_message() or alert.error.message())
        line = f"web seed {parts.scheme}://{parts.netloc}{parts.path} failed: {reason}"
        status = http_status(reason)
        with self._changed:
            rec.web_seed_errors += 1
            rec.web_seed_error = line
            if status is not None:
                url = str(alert.server_url())
                rec.web_seed_refusal = WebSeedRefusal(url, status, reason, rec.web_seed_errors)
            first = rec.web_seed_errors == 1
            self._changed.notify_all()
        # The first failure is what an operator needs (e.g. an origin the agent cannot reach);
        # libtorrent retries every `web_seed_retry` seconds, and the repeats are noise.
        (log.warning if first else log.info)("%s: %s", rec.final_name, line)

    def _fail(self, rec: TorrentRecord, message: str) -> None:
        log.error("blob %s: %s", rec.final_name, message)
        with self._changed:
            rec.error = message
            self._changed.notify_all()

    def _on_finished(self, rec: TorrentRecord) -> None:
        if rec.complete or rec.finishing:
            return
        rec.finishing = True
        if rec.current_name == rec.final_name:
            self._on_renamed(rec, rec.final_name)
        else:
            # Runs on libtorrent's disk thread after every queued write, then file_renamed_alert.
            rec.handle.rename_file(0, rec.final_name)

    def _on_renamed(self, rec: TorrentRecord, new_name: str) -> None:
        new = Path(new_name)
        name = new.name if new.is_absolute() else new_name
        if name != rec.final_name:
            return
        try:
            fsync_file_and_dir(rec.save_path / rec.final_name)
        except OSError as exc:
            self._fail(rec, f"cannot flush {rec.save_path / rec.final_name}: {exc.strerror}")
            return
        with self._changed:
            rec.current_name = rec.final_name
            rec.complete = True
            self._changed.notify_all()
        rec.handle.set_flags(lt.torrent_flags.upload_mode)  # as `_add` does for a complete blob
        self._request_save(rec, flush=True)
        # Tell the tracker now: libtorrent's own "completed" announce waits out its back-off from the
        # announces that failed during a tracker or Redis restart, and the seed stayed unlisted for
        # minutes after the tracker had come back and the node's probe had re-announced.
        rec.handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)
        log.info("blob %s complete", rec.final_name)

    def _request_save(self, rec: TorrentRecord, flush: bool = False, only_if_modified: bool = False) -> None:
        flags = lt.torrent_handle.save_info_dict
        if flush:
            flags |= lt.torrent_handle.flush_disk_cache
        if only_if_modified:
            flags |= lt.torrent_handle.only_if_modified
        with self._lock:
            self._pending_saves.add(rec.infohash)
        rec.handle.save_resume_data(flags)

    def _on_resume_data(self, alert: Any) -> None:
        rec = self._record_for(alert)
        try:
            if rec is None:
                return
            data = bdecode_dict(lt.write_resume_data_buf(alert.params))
            # Web seeds are per-lease and may be signed URLs, and the announce URL carries the
            # tracker's passkey: never persisted (restore() hands the current tracker list).
            for key in (b"url-list", b"httpseeds", b"trackers", b"tracker_tiers"):
                data.pop(key, None)
            data[_FINAL_NAME_KEY] = rec.final_name.encode()
            # close() pauses the session before its saves, so those describe the files exactly.
            data[_CLEAN_KEY] = 1 if self._final_saves else 0
            try:
                write_atomic(self.resume_dir / (rec.infohash + RESUME_SUFFIX), lt.bencode(data))
            except OSError as exc:
                log.error("cannot write resume data for %s: %s", rec.final_name, exc)
        finally:
            self._save_done(rec)

    def _save_done(self, rec: TorrentRecord | None) -> None:
        """A resume save answered (written or failed): close() may stop waiting for it."""
        with self._changed:
            if rec is not None:
                self._pending_saves.discard(rec.infohash)
            self._changed.notify_all()
