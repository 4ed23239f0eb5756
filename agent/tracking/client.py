"""HTTP client for the tracker's `/v1` routes (metainfo, leases, manifests, the long-poll wait).

Failures map to two classes so callers make one decision: `TrackerUnavailableError`
(connection refused, timeout, 5xx: carry on from the origin) and `TrackerError` (the
tracker answered and refused: a bug or a misconfiguration worth a clear message). A 404
on a lookup is not an error but `None`. The bearer token is sent only in the header, never
in a message or a repr; response bodies are cut short before they reach an error.

Roles (the tracker's): every request goes with the agent-role token (--tracker-token-file),
except `publish_manifest`, which registers a hub-less model with the publisher-role token
(--publisher-token-file). The announce passkey travels in `announce_url`, which only
libtorrent gets: never log it (`agent.swarm.ltkit.redact_tracker_url`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote_from_bytes, urlencode

import httpx

from agent.core.errors import RefusedError, TrackerError, TrackerUnavailableError, snippet
from agent.core.settings import DaemonSettings
from wirekit.bencode import bdecode

log = logging.getLogger(__name__)


class Announced(NamedTuple):
    """The tracker's reply to an announce of our own."""

    peers: list[tuple[str, int]]
    """(address, port) of the others it hands back; this project's tracker lists the seeders first."""
    seeders: int
    """The swarm's seeders it counts (0 when it did not say)."""
    leechers: int
    """The swarm's leechers it counts, the announcing node included (0 when it did not say)."""


@dataclass(frozen=True)
class BlobState:
    """What the tracker knows about one blob (`GET /v1/blobs/{id}` and the long-poll)."""

    blob_id: str
    infohash: str | None
    seeders: int
    leechers: int
    lease_holder: str | None

    @classmethod
    def from_json(cls, blob_id: str, data: dict[str, Any]) -> BlobState:
        lease = data.get("lease") or None
        holder = lease.get("holder") if isinstance(lease, dict) else None
        return cls(
            blob_id=blob_id,
            infohash=data.get("infohash") or None,
            seeders=int(data.get("seeders") or 0),
            leechers=int(data.get("leechers") or 0),
            lease_holder=str(holder) if holder else None,
        )


@dataclass(frozen=True)
class Lease:
    """The answer to a lease request: granted to us, or who holds it."""

    granted: bool
    holder: str | None
    expires_in: float
    holder_idle: float | None = None
    """Seconds since the idlest holder's reported bytes last changed (None: the tracker cannot say)."""
    retry_in: float | None = None
    """Seconds until the tracker grants leases again after losing its state (None: not refused for that)."""
    seeders: int | None = None
    """With a grant, the blob's seeders as the tracker counted them after granting (None: not said)."""


class TrackerClient:
    """One tracker, one connection pool. Thread-safe (httpx.Client is)."""

    def __init__(self, base_url: str, token: str | None, settings: DaemonSettings) -> None:
        self.base_url = base_url.rstrip("/")
        self._settings = settings
        headers = {"User-Agent": "weightswarm-agent/0.1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._timeout = httpx.Timeout(settings.tracker_read_timeout, connect=settings.tracker_connect_timeout)
        # trust_env=False: a proxy variable must not reroute cluster-internal tracker traffic.
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=self._timeout, trust_env=False
        )
        self._publisher_auth = (
            {"Authorization": f"Bearer {settings.publisher_token}"} if settings.publisher_token else None
        )
        self._down_since: float | None = None
        """Monotonic time of the first failure of the current outage; None while the tracker answers."""
        self.outages = 0
        """Outages this client has seen (a request failing after one that worked): the daemon's probe
        re-registers after each, also one shorter than its probe interval."""
        self.epoch: str | None = None
        """The tracker's state epoch at the last `healthy()` (`/readyz`): it changes when the tracker lost
        its swarm state (a restart, a Redis that lost its data), even with no request failing here."""
        self.interval: float | None = None
        """The announce `interval` of the tracker's last reply to `announce` (None before one)."""

    def __repr__(self) -> str:
        return f"TrackerClient({self.base_url!r})"

    @property
    def announce_url(self) -> str:
        """The BitTorrent announce URL handed to libtorrent: `<base>/announce/<passkey>` (libtorrent
        derives the scrape URL, `<base>/scrape/<passkey>`, from it). Holds a secret: never log it."""
        passkey = self._settings.tracker_passkey
        return f"{self.base_url}/announce/{passkey}" if passkey else f"{self.base_url}/announce"

    def close(self) -> None:
        self._http.close()

    # -- plumbing -------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        ok_404: bool = False,
        timeout: float | None = None,
        token_option: str = "--tracker-token-file",
        **kw: Any,
    ) -> httpx.Response | None:
        request_timeout = self._timeout
        if timeout is not None:
            request_timeout = httpx.Timeout(
                timeout + self._settings.tracker_read_timeout, connect=self._settings.tracker_connect_timeout
            )
        try:
            resp = self._http.request(method, path, timeout=request_timeout, **kw)
        except httpx.TransportError as exc:
            self._note_down()
            raise TrackerUnavailableError(
                f"tracker {self.base_url} unreachable ({type(exc).__name__}) for {method} {path}"
            ) from None
        if resp.status_code >= 500:
            self._note_down()
            raise TrackerUnavailableError(
                f"tracker {self.base_url} failed {method} {path}: HTTP {resp.status_code}", resp.status_code
            )
        self._down_since = None
        if resp.status_code == 404 and ok_404:
            return None
        if resp.status_code == 401:
            raise TrackerError(
                f"tracker {self.base_url} refused the token for {method} {path} (401); check {token_option}",
                401,
            )
        if resp.status_code == 403:
            # The token is right but its role may not do this (e.g. a published repo): say which.
            raise TrackerError(
                f"tracker {self.base_url} forbids {method} {path} (403): {snippet(resp.content)}", 403
            )
        if resp.status_code >= 400:
            raise TrackerError(
                f"tracker {self.base_url} rejected {method} {path}: HTTP {resp.status_code} "
                f"{snippet(resp.content)}",
                resp.status_code,
            )
        return resp

    def _json(self, resp: httpx.Response) -> dict[str, Any]:
        try:
            data = resp.json()
        except ValueError:
            raise TrackerError(f"tracker {self.base_url} sent non-JSON: {snippet(resp.content)}") from None
        if not isinstance(data, dict):
            raise TrackerError(f"tracker {self.base_url} sent an unexpected answer: {snippet(resp.content)}")
        return data

    def _note_down(self) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.outages += 1

    @property
    def outage(self) -> float:
        """Seconds the tracker has failed every request since (0.0 while it answers)."""
        since = self._down_since
        return 0.0 if since is None else time.monotonic() - since

    # -- health ---------------------------------------------------------------------------

    def healthy(self) -> bool:
        """True when the tracker answers `/readyz` (its store is reachable)."""
        try:
            resp = self._http.get("/readyz", timeout=self._timeout)
        except httpx.TransportError:
            return False
        if resp.status_code != 200:
            return False
        try:
            epoch = resp.json().get("epoch")
        except (ValueError, AttributeError):
            epoch = None
        self.epoch = epoch if isinstance(epoch, str) else None
        return True

    # -- blobs ----------------------------------------------------------------------------

    def get_metainfo(self, blob_id: str) -> bytes | None:
        """The blob's bencoded info dict, or None when no node has published it yet."""
        resp = self._request("GET", f"/v1/blobs/{blob_id}/metainfo", ok_404=True)
        return None if resp is None else resp.content

    def put_metainfo(self, blob_id: str, info: bytes) -> str:
        """Publish the blob's bencoded info dict; returns its infohash. Idempotent."""
        resp = self._request(
            "PUT",
            f"/v1/blobs/{blob_id}/metainfo",
            content=info,
            headers={"Content-Type": "application/x-bittorrent"},
        )
        assert resp is not None
        return str(self._json(resp).get("infohash", ""))

    def report_metainfo(self, blob_id: str, infohash: str, reason: str, node_id: str) -> bool:
        """Report the blob's published info dict `infohash` wrong; True if the tracker quarantined it
        (False: it had been replaced or reported already)."""
        resp = self._request(
            "POST",
            f"/v1/blobs/{blob_id}/metainfo/report",
            json={"infohash": infohash, "reason": reason[:500], "node_id": node_id},
        )
        assert resp is not None
        return bool(self._json(resp).get("quarantined"))

    def blob_state(self, blob_id: str) -> BlobState:
        resp = self._request("GET", f"/v1/blobs/{blob_id}", ok_404=True)
        if resp is None:
            return BlobState(blob_id, None, 0, 0, None)
        return BlobState.from_json(blob_id, self._json(resp))

    def wait_blob(self, blob_id: str, timeout: float) -> BlobState:
        """Long-poll until the blob has metainfo and a seeder, or its state changes, or `timeout`."""
        resp = self._request(
            "GET",
            f"/v1/blobs/{blob_id}/wait",
            ok_404=True,
            params={"timeout": f"{timeout:g}"},
            timeout=timeout,
        )
        if resp is None:
            return BlobState(blob_id, None, 0, 0, None)
        return BlobState.from_json(blob_id, self._json(resp))

    # -- leases ---------------------------------------------------------------------------

    def acquire_lease(
        self, blob_id: str, node_id: str, ttl: float, stale_after: float | None = None
    ) -> Lease:
        """Ask for the blob's origin lease; with `stale_after`, take it over from a holder whose reported
        bytes have not changed for that many seconds."""
        body: dict[str, Any] = {"node_id": node_id, "ttl": ttl}
        if stale_after is not None:
            body["stale_after"] = stale_after
        resp = self._request("POST", f"/v1/leases/{blob_id}", json=body)
        assert resp is not None
        data = self._json(resp)
        holder = data.get("holder")
        leases = [x for x in data.get("leases") or [] if isinstance(x, dict)]
        idle = [float(x["idle"]) for x in leases if x.get("idle") is not None]
        return Lease(
            granted=bool(data.get("granted")),
            holder=str(holder) if holder else None,
            expires_in=float(data.get("expires_in") or 0.0),
            holder_idle=max(idle) if idle else None,
            retry_in=float(data["retry_in"]) if data.get("retry_in") is not None else None,
            seeders=int(data["seeders"]) if data.get("seeders") is not None else None,
        )

    def heartbeat(
        self, blob_id: str, node_id: str, ttl: float | None = None, progress: int | None = None
    ) -> bool:
        """Renew our lease (for `ttl` seconds), reporting the bytes we have (`progress`): while they stay
        the same other nodes may take the lease over. A lease that lapsed, or that the tracker lost, is
        ours again while no other node took it (`reclaim`). False when it was taken."""
        body: dict[str, Any] = {"node_id": node_id, "reclaim": True}
        if ttl is not None:
            body["ttl"] = ttl
        if progress is not None:
            body["progress"] = progress
        try:
            self._request("POST", f"/v1/leases/{blob_id}/heartbeat", json=body)
        except TrackerError as exc:
            if exc.status in (404, 409) and not isinstance(exc, TrackerUnavailableError):
                return False
            raise
        return True

    def release_lease(self, blob_id: str, node_id: str) -> None:
        self._request("DELETE", f"/v1/leases/{blob_id}", ok_404=True, params={"node_id": node_id})

    # -- manifests ------------------------------------------------------------------------

    def put_manifest(
        self, repo_id: str, commit: str, revision: str | None, files: list[dict[str, Any]]
    ) -> None:
        """Register a hub model's manifest (agent role). A commit's manifest is written once: the
        same files again are a no-op, other files a 409 (TrackerError); the tracker ignores
        `revision` (only the publisher moves refs) and refuses (403) a repo the publisher published."""
        self._request("PUT", f"/v1/manifests/{repo_id}/{commit}", json={"revision": revision, "files": files})

    def publish_manifest(
        self,
        repo_id: str,
        commit: str,
        revision: str | None,
        files: list[dict[str, Any]],
        *,
        signature: str,
    ) -> None:
        """Register a hub-less model's manifest with the publisher-role token and the publisher's
        `signature` (agent.core.signing); `revision` then resolves to `commit`, and the tracker closes
        the repo to agent-role writes. RefusedError when this node has no publisher token."""
        if self._publisher_auth is None:
            raise RefusedError(
                f"cannot publish {repo_id} to the tracker: publishing needs the tracker's publisher "
                "token; start the agent with --publisher-token-file"
            )
        self._request(
            "PUT",
            f"/v1/manifests/{repo_id}/{commit}",
            json={"revision": revision, "files": files, "signature": signature},
            headers=self._publisher_auth,
            token_option="--publisher-token-file",
        )

    def announce(
        self,
        info_hash: bytes,
        peer_id: bytes,
        port: int,
        left: int,
        event: str | None = None,
        numwant: int = 50,
    ) -> Announced:
        """A BitTorrent announce of our own (agent.relay.directory), on the passkey URL as libtorrent's are:
        the peers the tracker hands back, as (address, port), never this node itself; and its counts."""
        params: dict[str, str | int] = {"port": port, "uploaded": 0, "downloaded": 0, "left": left}
        params.update({"compact": 1, "numwant": numwant})
        if event:
            params["event"] = event
        # info_hash and peer_id are raw bytes: percent-encoded by hand (httpx would encode them as text).
        raw = f"info_hash={quote_from_bytes(info_hash, safe='')}&peer_id={quote_from_bytes(peer_id, safe='')}"
        path = self.announce_url.removeprefix(self.base_url)
        resp = self._request("GET", f"{path}?{raw}&{urlencode(params)}")
        assert resp is not None
        try:
            body = bdecode(resp.content)
        except ValueError:
            raise TrackerError(f"tracker {self.base_url} sent a malformed announce reply") from None
        if not isinstance(body, dict):
            raise TrackerError(f"tracker {self.base_url} sent a malformed announce reply")
        failure = body.get(b"failure reason")
        if isinstance(failure, bytes):
            reason = failure.decode(errors="replace")
            raise TrackerError(f"tracker {self.base_url} refused an announce: {reason}")
        interval = body.get(b"interval")
        if isinstance(interval, int) and interval > 0:
            self.interval = float(interval)
        seeders, leechers = body.get(b"complete"), body.get(b"incomplete")
        counts = [n if isinstance(n, int) and n >= 0 else 0 for n in (seeders, leechers)]
        peers = body.get(b"peers", b"")
        if not isinstance(peers, bytes):
            peers = b""
        return Announced([
            (str(ipaddress.IPv4Address(peers[i : i + 4])), int.from_bytes(peers[i + 4 : i + 6], "big"))
            for i in range(0, len(peers) - len(peers) % 6, 6)
        ], *counts)

    def peer_addresses(self) -> list[str]:
        """Addresses of the peers that announced lately: the cluster's agents (agent.swarm.gate)."""
        resp = self._request("GET", "/v1/peers")
        data = self._json(resp) if resp is not None else {}
        return [str(a) for a in data.get("addresses", [])]

    def models(self, holders: bool = False) -> list[dict[str, Any]]:
        """Every model the tracker knows (`GET /v1/models`): revisions, and per commit its files with
        seeders/leechers and `complete_copies`. holders=True adds `holders` ("ip:port" of the seeders)
        per file and per commit; the tracker grants that to the agent role only (TrackerError, 403)."""
        resp = self._request("GET", "/v1/models", params={"holders": "true"} if holders else None)
        data = self._json(resp) if resp is not None else {}
        models = data.get("models")
        if not isinstance(models, list):
            raise TrackerError(f"tracker {self.base_url} sent no model list for GET /v1/models")
        return [m for m in models if isinstance(m, dict)]

    def get_manifest(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        resp = self._request("GET", f"/v1/manifests/{repo_id}/{commit}", ok_404=True)
        return None if resp is None else self._json(resp)

    def resolve(self, repo_id: str, revision: str) -> str | None:
        """The commit the publisher pointed repo_id@revision at; None for an unknown revision and for
        every hub model (the tracker keeps no refs of those: the origin resolves them)."""
        resp = self._request("GET", f"/v1/resolve/{repo_id}/{revision}", ok_404=True)
        if resp is None:
            return None
        commit = self._json(resp).get("commit")
        return str(commit) if commit else None
