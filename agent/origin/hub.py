"""The HF-compatible hub as a kind of origin (agent.origin.base `Kind`): huggingface.co, a mirror,
`agent serve-hub`. A revision with its files, per-file metadata, ranged GETs, each one attempt over HTTP
(agent.origin.session); how the answers are read: agent.origin.answers.
"""

from __future__ import annotations

from urllib.parse import quote, urljoin

import urllib3

from agent.cache.layout import is_commit
from agent.core.errors import OriginError
from agent.core.settings import OriginSettings
from agent.origin.answers import (
    FileMetadata,
    Hop,
    RemoteFile,
    file_metadata,
    host_of,
    link_next,
    next_hop,
    same_host,
    siblings,
    tree_file,
)
from agent.origin.base import Resolved
from agent.origin.session import MAX_REDIRECTS, HttpSession, release


class HubOrigin:
    """One hub endpoint, asked with the node's token (never sent to another host). Thread-safe."""

    def __init__(self, settings: OriginSettings, max_connections: int = 16) -> None:
        self.http = HttpSession(settings, max_connections)
        self.endpoint = self.http.endpoint

    def __repr__(self) -> str:
        return f"HubOrigin({self.endpoint!r})"

    def close(self) -> None:
        self.http.close()

    def resolve(self, repo_id: str, revision: str) -> Resolved:
        """Revision (branch, tag or commit) -> its commit and files, in one API call: the revision with
        its files' metadata (`?blobs=true`: size, git blob id, LFS sha256, as huggingface_hub's
        `model_info(files_metadata=True)` asks). The tree listing (`next_page`) only for an origin that
        leaves them out. Each node plans from the origin itself: a plan shared through the tracker would
        let one compromised node choose the bytes every node installs."""
        url = f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}?blobs=true"
        data, _ = self.http.get_json(url, f"{repo_id}@{revision}")
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not is_commit(sha.lower()):
            raise OriginError(f"{repo_id}@{revision}: origin did not return a commit sha")
        assert isinstance(data, dict)
        # Public only when `private` and `gated` are both explicitly false (a missing or null field, or a
        # gating mode, is not public; see docs/security.md).
        public = data.get("private") is False and data.get("gated") is False
        commit = sha.lower()
        files = siblings(data, repo_id)
        if files is None:
            tree = f"{self.endpoint}/api/models/{repo_id}/tree/{commit}?recursive=true"
            return Resolved(commit, [], public, next_page=tree)
        return Resolved(commit, files, public)

    def list_files(self, repo_id: str, commit: str, page: str) -> tuple[list[RemoteFile], str | None]:
        """One page of the recursive tree listing, and the next (`Link: rel="next"`, on this host only)."""
        data, resp = self.http.get_json(page, f"{repo_id}@{commit[:12]} file list")
        if not isinstance(data, list):
            raise OriginError(f"{repo_id}: file list is not a JSON array")
        files = [f for f in (tree_file(item, repo_id) for item in data) if f is not None]
        nxt = link_next(resp.headers.get("Link"))
        url = urljoin(page, nxt) if nxt else None
        if url is not None and not same_host(url, self.endpoint):
            raise OriginError(f"{repo_id}: the file list's next page is on another host ({host_of(url)})")
        return files, url

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        """The file's `resolve` URL (a small file's 307 leads to its bytes)."""
        return f"{self.endpoint}/{repo_id}/resolve/{commit}/{quote(path)}"

    def has_repo(self, repo_id: str) -> None:
        """The model info of `repo_id` answers (NotFoundError: the Hub's RepoNotFound)."""
        self.http.get_json(f"{self.endpoint}/api/models/{repo_id}", f"{repo_id} at the origin")

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        return self.http.request("GET", url, what, {"Range": f"bytes={start}-{end - 1}"})

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        """HEAD /resolve/, following redirects on the origin's own host (a small file's 307 to its
        resolve-cache URL) but not to another (an LFS file's 302 to the CDN, whose URL is the answer)."""
        what = f"{repo_id}/{path}"
        url: str | None = self.download_url(repo_id, commit, path)
        hops: list[Hop] = []
        while url is not None:
            if len(hops) > MAX_REDIRECTS:
                raise OriginError(f"{what}: too many redirects")
            resp = self.http.request("HEAD", url, what, follow_redirects=False)
            release(resp)
            hops.append(Hop(resp.status, resp.headers, url))
            url = next_hop(hops[-1])
        return file_metadata(hops, what)
