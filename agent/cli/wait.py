"""`agent wait REPO_ID[@REV]`: block until a model is complete in this node's cache (an init container).

Through the node-local agent first: it *requests* the model (`POST /v1/fetch`, joining a job
the pod annotation may already have started), so an init container alone is enough, and
mirrors the job's progress on stderr. When the agent cannot be reached (not started yet,
restarting), it looks at the hub cache itself and keeps trying the agent until the deadline.

"Complete" offline, without the agent's manifest (the init container mounts only the hub cache):
- a branch or tag has `refs/<rev>`: the fetch engine writes it last, after every file is linked
  and the safetensors indexes checked; a 40-hex revision has no ref, so its snapshot may be
  partial while a fetch runs: we also require
- `snapshots/<commit>/` is not empty and every entry resolves to an existing blob (never an
  `*.incomplete` one), and
- every `*.index.json` there lists only shards that are present.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.cache.layout import is_commit, repo_folder_name, safe_relpath
from agent.core.errors import DaemonError, UnsafePathError, WaitTimeoutError, WeightswarmError
from agent.core.progress import FileProgress, Progress, human_bytes
from agent.fetch.jobs import STAGE_WORDS
from agent.http.client import AgentClient, job_error, local_agent_answers, mirror_progress
from agent.kube.requests import ModelRef

_POLL_WAIT = 1.0
"""Seconds one `GET /v1/jobs/{id}?wait=` may block: progress is redrawn at least this often."""
_REQUEST_TIMEOUT = 5.0
"""Seconds for one call to the agent: a black-holed Service IP must not eat the whole deadline."""


class _Unreachable(Exception):
    """The agent did not answer at all (as opposed to answering with a refusal)."""


class _StillRunning(Exception):
    """The agent's job did not finish before the deadline (or the agent lost it: restarted)."""


def complete_snapshot(cache_dir: Path, ref: ModelRef) -> Path | None:
    """The snapshot directory of `ref` if it is complete in the hub cache (see module doc), else None."""
    try:
        repo_dir = cache_dir / repo_folder_name(ref.repo_id)
        if is_commit(ref.revision):
            commit = ref.revision
        else:
            commit = repo_dir.joinpath("refs", *safe_relpath(ref.revision).parts).read_text().strip()
        if not is_commit(commit):
            return None
    except (OSError, UnsafePathError, WeightswarmError):
        return None
    snapshot = repo_dir / "snapshots" / commit
    entries: list[Path] = []
    for root, _dirs, files in os.walk(snapshot):
        entries.extend(Path(root) / name for name in files)
    if not entries:
        return None
    for entry in entries:
        if not entry.is_file() or entry.resolve().name.endswith(".incomplete"):
            return None
    present = {str(p.relative_to(snapshot)) for p in entries}
    for entry in entries:
        if entry.name.endswith(".index.json") and not _index_complete(entry, snapshot, present):
            return None
    return snapshot


def _index_complete(index: Path, snapshot: Path, present: set[str]) -> bool:
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(weight_map, dict):
        return False
    folder = index.parent.relative_to(snapshot)
    return all(isinstance(s, str) and str(folder / s) in present for s in set(weight_map.values()))


def wait_for_model(
    ref: ModelRef,
    *,
    timeout: float,
    agent_url: str,
    cache_dir: Path,
    progress: Progress,
    poll_interval: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    token: str | None = None,
) -> Path:
    """Block until `ref` is complete on this node; its snapshot path. Raises `WaitTimeoutError` at
    the deadline, `WeightswarmError` when the agent's fetch failed or it refused the request."""
    deadline = clock() + timeout
    said_offline = False
    last = "nothing yet"
    while True:
        try:
            return _through_agent(ref, agent_url, deadline, progress, clock, token)
        except _Unreachable as exc:
            last = f"the agent at {agent_url} is unreachable ({exc}) and the cache at {cache_dir} lacks it"
            if not said_offline:
                progress.message(
                    f"the agent at {agent_url} is unreachable ({exc}); watching the cache at {cache_dir} "
                    "and retrying the agent"
                )
                said_offline = True
            snapshot = complete_snapshot(cache_dir, ref)
            if snapshot is not None:
                progress.message(f"{ref.key} is complete in the cache")
                return snapshot
        except _StillRunning as exc:
            last = str(exc)
        left = deadline - clock()
        if left <= 0:
            raise WaitTimeoutError(f"{ref.key} not complete after {timeout:g}s: {last}")
        time.sleep(min(poll_interval, left))


def _through_agent(
    ref: ModelRef,
    url: str,
    deadline: float,
    progress: Progress,
    clock: Callable[[], float],
    token: str | None,
) -> Path:
    client = AgentClient(url, timeout=_REQUEST_TIMEOUT)
    try:
        try:
            status = client.start_fetch(ref.repo_id, ref.revision, (), (), token, ref.source)
        except DaemonError as exc:
            if not local_agent_answers(client.url):
                raise _Unreachable("no answer on /healthz") from exc
            raise  # it answered and refused (a bad repo id, shutting down): waiting will not help
        bars: dict[str, FileProgress] = {}
        finished: set[str] = set()
        total_set = False
        stage = None
        while True:
            if status.get("stage") not in (stage, "ready", "failed"):
                stage = status["stage"]
                progress.message(f"{ref.key}: {STAGE_WORDS.get(stage, stage)}")
            if status["phase"] != "Pending" and status["files"]:
                if not total_set:
                    progress.set_total(sum(f["size"] for f in status["files"] if f["source"] != "cache"))
                    total_set = True
                mirror_progress(status, bars, finished, progress)
            if status["phase"] == "Ready":
                progress.close()
                progress.message(_summary(ref, status))
                return Path(status["snapshot"])
            if status["phase"] == "Failed":
                raise job_error(status, f"the agent could not fetch {ref.key}: ")
            left = deadline - clock()
            if left <= 0:
                raise _StillRunning(
                    f"the agent reports {status['phase']} ({STAGE_WORDS.get(stage or '', stage)}), "
                    f"{human_bytes(status['bytes_done'])} of {human_bytes(status['bytes_total'])}"
                    + (f", ETA {status['eta_seconds']:.0f}s" if status.get("eta_seconds") else "")
                )
            try:
                status = client.job(status["job_id"], wait=min(_POLL_WAIT, left))
            except DaemonError as exc:
                # Restarted (connection refused, or a 404 for the job it forgot): ask again.
                raise _StillRunning(f"lost the agent's job ({exc})") from None
    finally:
        client.close()


def _summary(ref: ModelRef, status: dict[str, Any]) -> str:
    return (
        f"{ref.key} ready ({(status.get('commit') or '')[:12]}): "
        f"{human_bytes(status['bytes_from_peers'])} from peers, "
        f"{human_bytes(status['bytes_from_origin'])} from the origin, "
        f"{human_bytes(status['bytes_from_cache'])} already cached"
    )
