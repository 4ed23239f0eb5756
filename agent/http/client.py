"""Client of a running daemon's API: `agent fetch --agent URL`, `agent ls`, `agent wait`.

An agent URL is `unix:///path/to/socket` (the node's admin socket, or the pods' socket in a pod;
docs/security.md) or `http://host:port`. Without one, the CLI talks to the admin socket of the
default state dir (`default_agent_url`).

A fetch handed to the daemon shows the same progress as a standalone one, drawn from the
job status it polls (`GET /v1/jobs/{id}?wait=S` returns early when the job finishes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agent.core.errors import DaemonError, WeightswarmError, snippet
from agent.core.progress import FileProgress, Progress, human_bytes
from agent.core.settings import HF_TOKEN_HEADER, default_admin_socket
from agent.core.sockets import SocketPath

_PROBE_TIMEOUT = 0.5
_POLL_WAIT = 1.0
_UNIX = "unix://"


def default_agent_url(state_dir: Path) -> str:
    """The admin socket of the agent whose state dir is `state_dir`."""
    return _UNIX + str(default_admin_socket(state_dir))


def agent_url(value: str) -> str:
    """`unix:///socket`, a socket path, `http(s)://host:port` or `host:port` -> a normal agent URL."""
    value = value.rstrip("/")
    if value.startswith("/"):
        return _UNIX + value
    return value if "://" in value else f"http://{value}"


def http_client(url: str, timeout: float) -> httpx.Client:
    """An httpx client for an agent URL (over the unix socket for `unix://`); never via a proxy."""
    url = agent_url(url)
    if url.startswith(_UNIX):
        return _UnixClient(Path(url[len(_UNIX) :]), timeout)
    return httpx.Client(base_url=url, timeout=timeout, trust_env=False)


class _UnixClient(httpx.Client):
    """An httpx client on a unix socket, which may have a path longer than `connect` takes
    (agent.core.sockets): the way to it stays open as long as the client."""

    def __init__(self, path: Path, timeout: float) -> None:
        self._socket = SocketPath(path)
        transport = httpx.HTTPTransport(uds=self._socket.address)
        super().__init__(transport=transport, base_url="http://agent", timeout=timeout, trust_env=False)

    def close(self) -> None:
        super().close()
        self._socket.close()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._socket.close()


def local_agent_answers(url: str) -> bool:
    """True when a daemon answers `/healthz` at `url` within a fraction of a second."""
    if url.startswith(_UNIX) and not Path(url[len(_UNIX) :]).exists():
        return False
    try:
        with http_client(url, _PROBE_TIMEOUT) as http:
            resp = http.get("/healthz")
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


class AgentClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = agent_url(url)
        self._http = http_client(self.url, timeout + 2 * _POLL_WAIT)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise DaemonError(f"the agent at {self.url} cannot be reached ({type(exc).__name__})") from None
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = None
            raise DaemonError(f"the agent at {self.url} refused {path}: {detail or snippet(resp.content)}")
        return resp.json()

    def start_fetch(
        self,
        repo_id: str,
        revision: str,
        include: Sequence[str],
        exclude: Sequence[str],
        token: str | None = None,
    ) -> dict[str, Any]:
        """Ask the daemon for a model; `token` (the requester's HF token) is used for its origin calls."""
        body = {"repo_id": repo_id, "revision": revision, "include": list(include), "exclude": list(exclude)}
        headers = {HF_TOKEN_HEADER: token} if token else {}
        result: dict[str, Any] = self._call("POST", "/v1/fetch", json=body, headers=headers)
        return result

    def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}", params={"wait": wait})
        return result

    def models(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/models")
        return result

    def remove_model(self, repo_id: str, revision: str | None, force: bool = False) -> dict[str, Any]:
        org, name = repo_id.split("/", 1) if "/" in repo_id else ("", repo_id)
        params: dict[str, Any] = {"revision": revision} if revision else {}
        if force:
            params["force"] = "true"
        result: dict[str, Any] = self._call("DELETE", f"/v1/models/{org}/{name}", params=params)
        return result

    def forget_blob(self, blob_id: str) -> None:
        self._call("POST", f"/v1/blobs/{blob_id}/forget")

    def publish(self, directory: str, repo_id: str, revision: str) -> dict[str, Any]:
        body = {"directory": directory, "repo_id": repo_id, "revision": revision}
        result: dict[str, Any] = self._call("POST", "/v1/publish", json=body)
        return result


def fetch_via_agent(
    url: str,
    repo_id: str,
    revision: str,
    include: Sequence[str],
    exclude: Sequence[str],
    progress: Progress,
    token: str | None = None,
) -> dict[str, Any]:
    """Hand the fetch to the daemon, mirror its progress, return the final job status (Ready)."""
    client = AgentClient(url)
    try:
        status = client.start_fetch(repo_id, revision, include, exclude, token)
        bars: dict[str, FileProgress] = {}
        finished: set[str] = set()
        total_set = False
        while True:
            if status["phase"] in ("Downloading", "Ready", "Failed"):
                if not total_set and status["files"]:
                    missing = [f for f in status["files"] if f["source"] != "cache"]
                    progress.set_total(sum(f["size"] for f in missing))
                    total_set = True
                mirror_progress(status, bars, finished, progress)
            if status["phase"] == "Ready":
                break
            if status["phase"] == "Failed":
                raise job_error(status)
            status = client.job(status["job_id"], wait=_POLL_WAIT)
        progress.close()
        progress.message(
            f"{repo_id}@{(status['commit'] or '')[:12]}: "
            f"{human_bytes(status['bytes_from_peers'])} from peers, "
            f"{human_bytes(status['bytes_from_origin'])} from the origin, "
            f"{human_bytes(status['bytes_from_cache'])} already cached (agent {client.url})"
        )
        return status
    finally:
        client.close()


def job_error(status: dict[str, Any], context: str = "") -> WeightswarmError:
    """A failed job as the error the CLI exits with: its message and its exit code (e.g. 4 refused)."""
    error = WeightswarmError(context + (status.get("error") or "the agent's fetch failed"))
    code = status.get("exit_code")
    if isinstance(code, int) and code > 0:
        error.exit_code = code
    return error


def mirror_progress(
    status: dict[str, Any], bars: dict[str, FileProgress], finished: set[str], progress: Progress
) -> None:
    for f in status["files"]:
        if f["source"] == "cache" and f["path"] not in bars:
            continue
        bar = bars.get(f["path"])
        if bar is None and (f["done"] > 0 or status["phase"] != "Downloading"):
            bar = bars[f["path"]] = progress.start_file(f["path"], f["size"])
        if bar is None:
            continue
        if f["done"] > bar.done:
            bar.advance(f["done"] - bar.done)
        if f["done"] >= f["size"] and f["path"] not in finished:
            finished.add(f["path"])
            bar.finish(None if f["source"] == "pending" else f["source"])
