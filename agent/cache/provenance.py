"""Where each repo of the cache came from, and what each of its fetched commits holds.

Written at the end of every fetch that ends with its snapshot in place, read when the origin cannot
be asked (agent.fetch.offline: is a revision complete in the cache?) and by `agent verify` (fetch a
corrupt blob again from where it came, not from whatever `$HF_ENDPOINT` says today):

    <state_dir>/origins/models--org--name.json
        {"version": 1, "origin": "https://huggingface.co",
         "commits": {commit: {"paths": [every path at the commit], "files": {path: [blob id, size]},
                              "at": unix time}}}

The origin is a URL without user info, query or fragment: never a token or a signature. `files` holds
the files fetched at least once (a fetch narrowed by --include adds its own); `paths` every path the
origin listed, so a wider request later knows what it lacks. At most `MAX_COMMITS` commits per repo,
the oldest dropped first. Readers treat anything unreadable as no record: the snapshot alone decides
then, as for a cache that huggingface_hub wrote.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agent.cache.layout import StateDir, is_blob_id, is_commit, repo_folder_name, write_atomic
from agent.core.modelnames import Scrub, as_is
from agent.core.plan import FetchPlan

log = logging.getLogger(__name__)

MAX_COMMITS = 16
"""Commits remembered per repo: a repo's recent revisions, not its history."""
_VERSION = 1


def clean_origin(url: str) -> str:
    """The URL with no user info, query or fragment (a presigned URL's signature, a token in it)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


class Provenance:
    """The records of one state dir (a read-modify-write per fetch: the last writer of a repo wins, and a
    lost record costs only the snapshot-only check)."""

    def __init__(self, state_dir: Path, scrub: Scrub = as_is) -> None:
        """`scrub`: a daemon job's (agent.core.modelnames), as its log lines name the repo's file."""
        self.root = StateDir(state_dir).origins
        self._scrub = scrub

    def _path(self, repo_id: str) -> Path:
        return self.root / f"{repo_folder_name(repo_id)}.json"

    def _load(self, repo_id: str) -> dict[str, Any]:
        try:
            data = json.loads(self._path(repo_id).read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.info("%s", self._scrub(f"ignoring {self._path(repo_id)}: {exc}"))
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return {}
        return data

    def record(self, origin: str, plan: FetchPlan) -> None:
        """The plan's files are in place, fetched from `origin`."""
        commits: dict[str, Any] = _dict(self._load(plan.repo_id).get("commits"))
        files: dict[str, Any] = _dict(_dict(commits.get(plan.commit)).get("files"))
        files.update({e.path: [e.blob_id, e.size] for e in plan.files if e.content_known})
        paths = sorted(set(plan.all_paths) | set(files))
        commits[plan.commit] = {"paths": paths, "files": files, "at": time.time()}
        newest = sorted(commits, key=lambda c: _stamp(_dict(commits[c]).get("at")))
        for old in newest[: max(0, len(newest) - MAX_COMMITS)]:
            del commits[old]
        out = {"version": _VERSION, "origin": clean_origin(origin), "commits": commits}
        try:
            write_atomic(self._path(plan.repo_id), json.dumps(out, sort_keys=True).encode(), fsync=False)
        except OSError as exc:
            # The fetch itself is fine; only an outage or a repair would miss this record.
            log.warning("%s", self._scrub(f"cannot write {self._path(plan.repo_id)}: {exc.strerror}"))

    def origin_of(self, repo_id: str) -> str | None:
        origin = self._load(repo_id).get("origin")
        return origin if isinstance(origin, str) and origin else None

    def listing(self, repo_id: str, commit: str) -> tuple[list[str], dict[str, tuple[str, int]]] | None:
        """(every path at the commit, {path: (blob id, size)} of those fetched here), or None."""
        commits = self._load(repo_id).get("commits")
        entry = commits.get(commit) if isinstance(commits, dict) and is_commit(commit) else None
        if not isinstance(entry, dict):
            return None
        paths, files = entry.get("paths"), entry.get("files")
        if not isinstance(paths, list) or not isinstance(files, dict):
            return None
        known: dict[str, tuple[str, int]] = {}
        for path, value in files.items():
            if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                    and is_blob_id(value[0]) and isinstance(value[1], int) and value[1] >= 0):
                known[str(path)] = (value[0], value[1])
        return [str(p) for p in paths], known


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _stamp(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
