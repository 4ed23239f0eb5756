"""Client of a running daemon's API: `agent fetch --agent URL`, `agent ls`, `agent wait`.

An agent URL is `unix:///path/to/socket` (the node's admin socket, or the pods' socket in a pod;
docs/security.md) or `http://host:port`. Without one, the CLI talks to the admin socket of the
default state dir (`default_agent_url`).

A fetch handed to the daemon shows the same progress as a standalone one, drawn from the
job status it polls (`GET /v1/jobs/{id}?wait=S` returns early when the job finishes).
"""

from __future__ import annotations

import http.client
import json as _json
import socket
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.core.errors import DaemonError, WeightswarmError, snippet
from agent.core.progress import FileProgress, Progress, human_bytes
from agent.core.settings import HF_TOKEN_HEADER, Settings, default_admin_socket
from agent.core.sockets import SocketPath

_PROBE_TIMEOUT = 0.5
_POLL_WAIT = 1.0
_JOB_ATTEMPTS = 4
"""Times a job's status is asked over a connection that breaks before the answer (a busy node's agent
may drop one), 0.5 s apart: asking is idempotent, and the job runs on in the daemon meanwhile."""
UNIX = "unix://"


def default_agent_url(state_dir: Path) -> str:
    """The admin socket of the agent whose state dir is `state_dir`."""
    return UNIX + str(default_admin_socket(state_dir))


def agent_url(value: str) -> str:
    """`unix:///socket`, a socket path, `http(s)://host:port` or `host:port` -> a normal agent URL."""
    value = value.rstrip("/")
    if value.startswith("/"):
        return UNIX + value
    return value if "://" in value else f"http://{value}"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP on a unix socket, whose path may be longer than `connect` takes (agent.core.sockets)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            with SocketPath(self._path) as where:
                sock.connect(where.address)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _Http:
    """Requests to an agent URL with the standard library, a connection each (the CLI asks once a
    second at most); never via a proxy. httpx, which the daemon uses, takes longer to import than
    the rest of `agent fetch`, and eight fetches starting at once on a small node feel it."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout
        self._unix = url.startswith(UNIX)
        self._parts = urllib.parse.urlsplit("http://agent" if self._unix else url)

    def _connection(self) -> http.client.HTTPConnection:
        if self._unix:
            return _UnixConnection(Path(self.url[len(UNIX) :]), self.timeout)
        if self._parts.scheme == "https":
            return http.client.HTTPSConnection(self._parts.netloc, timeout=self.timeout)
        return http.client.HTTPConnection(self._parts.netloc, timeout=self.timeout)

    def request(
        self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body); OSError or http.client.HTTPException when the agent cannot be reached."""
        target = self._parts.path + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else _json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **(headers or {})} if data is not None else headers or {}
        conn = self._connection()
        try:
            conn.request(method, target, body=data, headers=sent)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def local_agent_answers(url: str) -> bool:
    """True when a daemon answers `/healthz` at `url` within a fraction of a second."""
    if url.startswith(UNIX) and not Path(url[len(UNIX) :]).exists():
        return False
    try:
        status, _ = _Http(agent_url(url), _PROBE_TIMEOUT).request("GET", "/healthz")
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


class AgentUnreachable(DaemonError):
    """No answer from the agent: it is not running, or the connection broke before its answer."""


class AgentClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = agent_url(url)
        self._http = _Http(self.url, timeout + 2 * _POLL_WAIT)

    def close(self) -> None:
        """Nothing stays open (a connection per request); for callers that hold a client in a `try`."""

    def _call(
        self, method: str, path: str, params: dict[str, Any] | None = None, json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        try:
            status, content = self._http.request(method, path, params, json, headers)
        except (OSError, http.client.HTTPException) as exc:
            what = type(exc).__name__
            raise AgentUnreachable(f"the agent at {self.url} cannot be reached ({what})") from None
        try:
            answer = _json.loads(content)
        except ValueError:
            answer = None
        if status >= 400:
            detail = answer.get("detail") if isinstance(answer, dict) else None
            hint = ""
            if status == 404 and detail == "Not Found" and not self.url.startswith(UNIX):
                # No such route: the daemon's network listener (probes, metrics, HF endpoint), not its API.
                hint = (f"; that is the agent's network listener: its API is on the admin socket, "
                        f"--agent {default_agent_url(Settings.from_env_defaults().state_dir)}")
            raise DaemonError(f"the agent at {self.url} refused {path}: {detail or snippet(content)}{hint}")
        if answer is None:
            raise DaemonError(f"the agent at {self.url} answered {path} with no JSON: {snippet(content)}")
        return answer

    def start_fetch(
        self,
        repo_id: str,
        revision: str,
        include: Sequence[str],
        exclude: Sequence[str],
        token: str | None = None,
        source: str = "",
    ) -> dict[str, Any]:
        """Ask the daemon for a model; `token` (the requester's HF token) is used for its origin calls;
        `source`: the bucket URL of a model in object storage."""
        body = {"repo_id": repo_id, "revision": revision, "include": list(include), "exclude": list(exclude)}
        if source:
            body["source"] = source
        headers = {HF_TOKEN_HEADER: token} if token else {}
        result: dict[str, Any] = self._call("POST", "/v1/fetch", json=body, headers=headers)
        return result

    def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        """The job's status (after up to `wait` seconds, sooner when it ends)."""
        for _ in range(_JOB_ATTEMPTS - 1):
            try:
                return self._job(job_id, wait)
            except AgentUnreachable:
                time.sleep(0.5)
        return self._job(job_id, wait)

    def _job(self, job_id: str, wait: float) -> dict[str, Any]:
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
    source: str = "",
) -> dict[str, Any]:
    """Hand the fetch to the daemon, mirror its progress, return the final job status (Ready)."""
    client = AgentClient(url)
    try:
        status = client.start_fetch(repo_id, revision, include, exclude, token, source)
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
        if f["path"] in finished:
            continue
        if f.get("stage") == "failed":
            finished.add(f["path"])
            bar.fail()
        elif f["done"] >= f["size"]:
            finished.add(f["path"])
            bar.finish(None if f["source"] == "pending" else f["source"])
