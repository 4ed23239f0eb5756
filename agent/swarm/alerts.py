"""The libtorrent session's alert loop, on a thread of its own: completion (rename to the blob's final
name, flushed, then reported), failures, bans, web seed errors, resume data written as it comes, and a
poll every `_POLL_PEERS` seconds (peer vs web seed bytes, seeds that sent bytes, periodic resume saves,
pieces libtorrent holds with no verdict). One failure is logged at once and the loop restarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import libtorrent as lt

from agent.cache.layout import write_atomic
from agent.core.swarm_settings import SwarmSettings
from agent.swarm.filter import PeerFilter
from agent.swarm.ltkit import bdecode_dict, fsync_file_and_dir, redact_tracker_url
from agent.swarm.status import BlobStatus, Records, TorrentRecord, WebSeedRefusal
from agent.swarm.webseed import http_status

log = logging.getLogger("agent.swarm.session")  # one log for the libtorrent session, its alerts included

RESUME_SUFFIX = ".resume"
FINAL_NAME_KEY = b"weightswarm-final-name"
CLEAN_KEY = b"weightswarm-clean"
TICK = 0.25
"""Seconds: the alert wait bound, so closing stops the loop promptly."""
_BY_IP_FILTER = 0
"""`peer_blocked_alert.reason` when the IP filter refused the peer."""
_BLOCK_FINISHED = 3
"""`get_download_queue()` block state: written (libtorrent's block_info::finished)."""
_POLL_PEERS = 0.5
"""Seconds between per-peer counter polls (web seed vs peer bytes)."""
_MAX_LOOP_RESTARTS = 20


class AlertLoop:
    """Handles one session's alerts; `start` runs it, `stop` ends it."""

    def __init__(
        self,
        ses: Any,
        settings: SwarmSettings,
        resume_dir: Path,
        records: Records,
        peers: PeerFilter,
        status: Callable[[str], BlobStatus],
    ) -> None:
        self._ses = ses
        self.settings = settings
        self.resume_dir = resume_dir
        self._records = records
        self._peers = peers
        self._status = status
        self.pending_saves: set[str] = set()
        """Torrents whose resume data was asked for and has not come (guarded by the records' lock)."""
        self.final_saves = False
        """Set once the session is paused for closing: resume data saved from then on is clean."""
        self.loop_failures = 0
        """Times the alert loop failed and was restarted (each one is logged with its traceback)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="swarm-alerts", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout)

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

    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            if self._ses.wait_for_alert(int(TICK * 1000)) is not None:
                for alert in self._ses.pop_alerts():
                    self._on_alert(alert)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + _POLL_PEERS
                self._poll()

    def _poll(self) -> None:
        recs = self._records.values()
        now = time.monotonic()
        self._peers.expire_bans(now)
        for rec in recs:
            if now - rec.last_resume_save > self.settings.resume_interval:
                rec.last_resume_save = now
                self.request_save(rec, only_if_modified=True)
            if rec.complete:
                continue
            self._sample_sources(rec)
            self._note_seeds(rec)
            state = self._status(rec.infohash).state  # also refreshes last_progress
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
        round in fifteen (tests/swarm/test_held_piece.py). A verdict takes milliseconds, so a piece held
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
        with self._records.lock:
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
            with self._records.lock:
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
            with self._records.lock:
                rec.seed_sources |= seeds

    def _record_for(self, alert: Any) -> TorrentRecord | None:
        handle = getattr(alert, "handle", None)
        if handle is None or not handle.is_valid():
            return None
        return self._records.get(str(handle.info_hashes().v1))

    def _on_alert(self, alert: Any) -> None:
        if isinstance(alert, lt.save_resume_data_alert):
            self._on_resume_data(alert)
            return
        if isinstance(alert, lt.save_resume_data_failed_alert):
            self._save_done(self._record_for(alert))
            return
        if isinstance(alert, lt.peer_blocked_alert) and alert.reason == _BY_IP_FILTER:
            log.debug("refused a connection from/to %s: not an agent of this cluster", alert.ip[0])
            self._peers.blocked.set()
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
            with self._records.lock:
                rec.hash_failures += 1
            log.warning("piece %d of %s failed its hash check", alert.piece_index, rec.final_name)
        elif isinstance(alert, lt.peer_ban_alert):
            with self._records.lock:
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
        with self._records.changed:
            rec.web_seed_errors += 1
            rec.web_seed_error = line
            if status is not None:
                url = str(alert.server_url())
                rec.web_seed_refusal = WebSeedRefusal(url, status, reason, rec.web_seed_errors)
            first = rec.web_seed_errors == 1
            self._records.changed.notify_all()
        # The first failure is what an operator needs (e.g. an origin the agent cannot reach);
        # libtorrent retries every `web_seed_retry` seconds, and the repeats are noise.
        (log.warning if first else log.info)("%s: %s", rec.final_name, line)

    def _fail(self, rec: TorrentRecord, message: str) -> None:
        log.error("blob %s: %s", rec.final_name, message)
        with self._records.changed:
            rec.error = message
            self._records.changed.notify_all()

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
        with self._records.changed:
            rec.current_name = rec.final_name
            rec.complete = True
            self._records.changed.notify_all()
        # Not into upload mode now, as `_add` puts a complete blob: libtorrent's set_upload_mode cancels
        # every peer's queued requests through the piece picker, which a torrent that just completed no
        # longer has (2.0 and 2.1 do not check for it in cancel_all_requests), and an agent crashed
        # there in piece_picker::abort_download when a peer still held requests from the end game. Its
        # metainfo is the one the blob's sha256 just verified, so a recheck could only write the same
        # bytes; the next start adds it in upload mode.
        self.request_save(rec, flush=True)
        # Tell the tracker now: libtorrent's own "completed" announce waits out its back-off from the
        # announces that failed during a tracker or Redis restart, and the seed stayed unlisted for
        # minutes after the tracker had come back and the node's probe had re-announced.
        rec.handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)
        log.info("blob %s complete", rec.final_name)

    def request_save(self, rec: TorrentRecord, flush: bool = False, only_if_modified: bool = False) -> None:
        """Ask libtorrent for the torrent's resume data (written by `_on_resume_data` when it comes)."""
        flags = lt.torrent_handle.save_info_dict
        if flush:
            flags |= lt.torrent_handle.flush_disk_cache
        if only_if_modified:
            flags |= lt.torrent_handle.only_if_modified
        with self._records.lock:
            self.pending_saves.add(rec.infohash)
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
            data[FINAL_NAME_KEY] = rec.final_name.encode()
            # close() pauses the session before its saves, so those describe the files exactly.
            data[CLEAN_KEY] = 1 if self.final_saves else 0
            try:
                write_atomic(self.resume_dir / (rec.infohash + RESUME_SUFFIX), lt.bencode(data))
            except OSError as exc:
                log.error("cannot write resume data for %s: %s", rec.final_name, exc)
        finally:
            self._save_done(rec)

    def _save_done(self, rec: TorrentRecord | None) -> None:
        """A resume save answered (written or failed): close() may stop waiting for it."""
        with self._records.changed:
            if rec is not None:
                self.pending_saves.discard(rec.infohash)
            self._records.changed.notify_all()
