"""HTTP to an origin, shared by the kinds that speak it (agent.origin.hub, agent.origin.bucket): one
request at a time, no retries (agent.origin.client `Origin` retries every kind's calls), and the reads the
range engine (agent.origin.ranges) makes of an answer's body.

One urllib3 PoolManager (keep-alive connections reused across ranges and files). HTTP errors become
`agent.core.errors` classes with one-line messages (agent.origin.answers), passing ones raised as
`Retryable`; response bodies are cut short and the token never appears anywhere but the Authorization
header, which is dropped when a redirect leaves the origin's host (as huggingface_hub does: a CDN must not
see the token).
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urljoin

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)
from urllib3.exceptions import HTTPError as Urllib3Error

from agent.core.errors import OriginError, OriginUnansweredError, OriginUnavailableError, snippet
from agent.core.settings import OriginSettings
from agent.origin.answers import REDIRECTS, Retryable, host_of, raise_for_status, same_host

MAX_REDIRECTS = 5


class HttpSession:
    """Requests to one origin endpoint, with its settings' timeouts, User-Agent and token. Thread-safe
    (urllib3 pools are)."""

    def __init__(self, settings: OriginSettings, max_connections: int = 16) -> None:
        self.settings = settings
        self.endpoint = settings.endpoint.rstrip("/")
        # A third of the bound at most per try: a silent server is asked three times and said so.
        self.timeout = urllib3.Timeout(
            connect=min(settings.connect_timeout, settings.answer_within / 3),
            read=min(settings.read_timeout, settings.answer_within / 3),
        )
        self._pool = urllib3.PoolManager(
            num_pools=8,
            # Room for the hedges (agent.origin.hedging) beside the workers' connections: a full pool
            # discards a connection coming back, and says so in a warning each time.
            maxsize=2 * max(1, max_connections),
            block=False,
            retries=False,
            timeout=self.timeout,
        )

    def __repr__(self) -> str:
        return f"HttpSession({self.endpoint!r})"

    def close(self) -> None:
        self._pool.clear()

    def headers_for(self, url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"User-Agent": self.settings.user_agent, "Accept-Encoding": "identity"}
        if self.settings.token and same_host(url, self.endpoint):
            headers["Authorization"] = f"Bearer {self.settings.token}"
        headers.update(extra or {})
        return headers

    def request(
        self,
        method: str,
        url: str,
        what: str,
        headers: dict[str, str] | None = None,
        follow_redirects: bool = True,
    ) -> urllib3.BaseHTTPResponse:
        """One request (no retries): follows redirects itself so the token stays on the origin host.

        Returns the response unread (preload_content=False) for 2xx/3xx-not-followed, its `url` the URL
        that answered; raises `Retryable` for transient failures and a mapped `WeightswarmError` for the
        rest (`CdnRefusedError` when a host the origin redirected to refused).
        """
        for _ in range(MAX_REDIRECTS + 1):
            resp = self.send(method, url, what, headers)
            if follow_redirects and resp.status in REDIRECTS:
                location = resp.headers.get("Location")
                resp.drain_conn()
                release(resp)
                if not location:
                    raise OriginError(f"{what}: redirect without Location from {host_of(url)}")
                url = urljoin(url, location)
                continue
            if resp.status >= 400:
                body = resp.read(4096) if method != "HEAD" else b""
                release(resp)
                raise_for_status(resp.status, resp.headers, body, what, url, self.endpoint)
            resp.url = url
            return resp
        raise OriginError(f"{what}: too many redirects")

    def send(
        self, method: str, url: str, what: str, headers: dict[str, str] | None
    ) -> urllib3.BaseHTTPResponse:
        """One request as it is answered: no redirect followed, no status read (a kind with a flow of its
        own, as a registry's token dance, reads them); `Retryable` when nothing answered."""
        # A pooled keep-alive connection the server has since closed fails at once; that is not
        # an origin failure, so one immediate resend on a fresh connection comes before backoff.
        for fresh_try in (False, True):
            try:
                return self._pool.request(
                    method,
                    url,
                    headers=self.headers_for(url, headers),
                    redirect=False,
                    preload_content=False,
                    decode_content=False,
                )
            except Urllib3Error as exc:
                stale = isinstance(exc, ProtocolError) and not fresh_try
                if not stale:
                    raise unanswered(what, url, exc, self.timeout) from None
        raise AssertionError("unreachable")

    def get_json(self, url: str, what: str) -> tuple[object, urllib3.BaseHTTPResponse]:
        """One GET of a JSON answer of at most `max_json_bytes` (no retries): (the JSON, its response)."""
        resp = self.request("GET", url, what, {"Accept": "application/json"})
        try:
            body = read_capped(resp, self.settings.max_json_bytes, what)
        except Urllib3Error as exc:
            raise unavailable(f"{what}: connection dropped", exc) from None
        finally:
            release(resp)
        try:
            return json.loads(body), resp
        except ValueError:
            raise OriginError(f"{what}: origin sent invalid JSON: {snippet(body, 80)}") from None


def unavailable(what: str, exc: BaseException) -> Retryable:
    return Retryable(OriginUnavailableError(f"{what} ({_reason(exc)})"))


def unanswered(what: str, url: str, exc: BaseException, timeout: urllib3.Timeout) -> Retryable:
    """A request that got no answer, in words a person can act on (never the URL's query: a signed CDN
    URL carries credentials)."""
    host = host_of(url)
    if isinstance(exc, NameResolutionError):
        said = f"the host name of {host} is not known (DNS)"
    elif isinstance(exc, NewConnectionError):  # a ConnectTimeoutError too, but one that came at once
        cause = "refused the connection" if "refused" in str(exc).lower() else "cannot be connected to"
        said = f"{host} {cause}"
    elif isinstance(exc, ConnectTimeoutError):
        said = f"{host} accepted no connection within {timeout.connect_timeout:g}s"
    elif isinstance(exc, ReadTimeoutError):
        said = f"{host} accepted the connection but sent nothing in {timeout.read_timeout:g}s"
    elif isinstance(exc, ProtocolError):
        said = f"{host} closed the connection without an answer"
    else:
        said = f"no answer from {host} ({_reason(exc)})"
    return Retryable(OriginUnansweredError(f"{what}: origin not answering: {said}"))


def _reason(exc: BaseException) -> str:
    """A short cause without URLs' query strings (signed CDN URLs carry credentials)."""
    reason = getattr(exc, "reason", None) or exc
    return type(reason).__name__


def read_capped(resp: urllib3.BaseHTTPResponse, cap: int, what: str) -> bytes:
    """A whole API answer of at most `cap` bytes: refused by its Content-Length before a byte is read, or
    once more than `cap` came (a hostile origin's endless JSON must not fill the agent's memory)."""
    length = resp.headers.get("Content-Length", "")
    if length.strip().isdigit() and int(length) > cap:
        raise OriginError(f"{what}: the origin's answer is {int(length)} bytes, more than the {cap} allowed")
    parts: list[bytes] = []
    got = 0
    while got <= cap:
        data = resp.read(min(1 << 20, cap + 1 - got))
        if not data:
            return b"".join(parts)
        parts.append(data)
        got += len(data)
    raise OriginError(f"{what}: the origin's answer is more than the {cap} bytes allowed")


def read_body_into(resp: urllib3.BaseHTTPResponse, view: memoryview) -> int:
    """Fill `view` from the raw body; fewer bytes only at its end, 0 once it is complete.

    Reads from the socket straight into the caller's buffer. `resp.read(n)` costs, per block,
    a zeroed bytearray plus a bytes copy in http.client and an allocation: measured at loopback
    rates that was a large share of `agent fetch`'s CPU, which on a 2-core node competes with
    hashing. urllib3's own byte count is bypassed, so callers decide keep-alive themselves
    (`body_complete`). A dropped connection or a read timeout surfaces as a Retryable.
    """
    raw = getattr(resp, "_fp", None)
    if not isinstance(raw, http.client.HTTPResponse):  # not urllib3's usual response: the portable path
        try:
            data = resp.read(len(view))
        except Urllib3Error as exc:
            raise unavailable("connection dropped", exc) from None
        view[: len(data)] = data
        return len(data)
    try:
        return raw.readinto(view)
    except (OSError, http.client.HTTPException) as exc:
        raise unavailable("connection dropped", exc) from None


def release(resp: urllib3.BaseHTTPResponse) -> None:
    """Hand a response's connection back to the pool when its body is over; close it otherwise.

    http.client keeps a HEAD's response open until it is read or collected, and a refused one lives on in
    its error's traceback while the client backs off. The next request on that connection (another
    thread's range) was then sent and answered but failed on the client (ResponseNotReady) and was sent
    again: a range the origin served twice.
    """
    try:
        if body_complete(resp):
            raw = getattr(resp, "_fp", None)
            if isinstance(raw, http.client.HTTPResponse):
                raw.close()  # what reading its empty rest would do: the connection is idle again
        else:
            resp.close()
        resp.release_conn()
    except Exception:  # noqa: BLE001 - cleanup must not mask the real error
        pass


def body_complete(resp: urllib3.BaseHTTPResponse) -> bool:
    """Whether every body byte was read through `read_body_into` (the connection can be reused)."""
    raw = getattr(resp, "_fp", None)
    if isinstance(raw, http.client.HTTPResponse):
        return raw.length == 0
    return not resp.length_remaining
