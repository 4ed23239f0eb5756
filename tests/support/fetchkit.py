"""Helpers shared by the fetch tests: a small model on a real test hub, settings for it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.cache.layout import repo_folder_name
from agent.core.settings import FetchSettings, OriginSettings, Settings
from agent.hub.repos import INCOMPLETE_SUFFIX, SKIPPED_NAMES
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model

MiB = 2**20
GiB = 2**30
REPO = "org/tiny"


def model(
    root: Path, repo_id: str = REPO, total: int = 6 * MiB, shards: int = 3, seed: int = 0
) -> dict[str, bytes]:
    """Write a model and return {repo path: bytes} of what the origin serves."""
    make_model(root, repo_id, total_bytes=total, shards=shards, seed=seed)
    return origin_files(root, repo_id)


def origin_files(root: Path, repo_id: str = REPO) -> dict[str, bytes]:
    base = root / repo_id
    out = {}
    for d, _, names in os.walk(base):
        for n in names:
            p = Path(d) / n
            rel = p.relative_to(base).as_posix()
            if rel.split("/")[0] in SKIPPED_NAMES or rel.endswith(INCOMPLETE_SUFFIX):
                continue
            out[rel] = p.read_bytes()
    return out


def settings_for(
    tmp: Path,
    url: str,
    token: str | None = None,
    chunk_size: int = 1 * MiB,
    connections: int = 4,
    files_at_once: int = 3,
    max_retries: int = 5,
    read_timeout: float = 10.0,
    min_free: int = 0,
    cache_dir: Path | None = None,
) -> Settings:
    return Settings(
        cache_dir=cache_dir or tmp / "hub",
        state_dir=tmp / "state",
        origin=OriginSettings(
            endpoint=url,
            token=token,
            max_retries=max_retries,
            backoff_base=0.02,
            backoff_max=2.0,
            read_timeout=read_timeout,
            connect_timeout=5.0,
        ),
        fetch=FetchSettings(
            connections_per_file=connections,
            files_at_once=files_at_once,
            chunk_size=chunk_size,
            min_free_bytes=min_free,
        ),
    )


def fetch_args(url: str, tmp: Path, *extra: str) -> list[str]:
    """`agent fetch REPO` arguments against the origin at `url`, cache and state under `tmp`."""
    dirs = ["--cache-dir", str(tmp / "hub"), "--state-dir", str(tmp / "st")]
    return ["fetch", REPO, "--origin", url, *dirs, *extra]


def repo_dir(cache_dir: Path, repo_id: str = REPO) -> Path:
    return cache_dir / repo_folder_name(repo_id)


def snapshot_contents(snapshot: Path) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(snapshot):
        for n in names:
            p = Path(d) / n
            out[p.relative_to(snapshot).as_posix()] = p.read_bytes()
    return out


def leftovers(cache_dir: Path, state_dir: Path) -> list[str]:
    """Partial files and resume records anywhere: what a failed fetch must not leave behind."""
    found = [str(p) for p in cache_dir.rglob("*.incomplete")] if cache_dir.exists() else []
    partials = state_dir / "partials"
    if partials.exists():
        found += [str(p) for p in partials.iterdir()]
    return found


def file_requests(srv: HubServer) -> list[str]:
    """Paths of content requests (resolve, resolve-cache, CDN) the origin answered."""
    return [r.path for r in srv.requests if r.bucket in ("resolvers", "cdn")]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def serve(root: Path, **kwargs: object) -> Iterator[HubServer]:
    srv = HubServer(root, **kwargs)  # type: ignore[arg-type]
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def served_model(tmp: Path) -> Iterator[tuple[HubServer, Path, dict[str, bytes]]]:
    """`model()` under `tmp/origin` on a test hub, for a module's `origin` fixture to yield from:
    (server, root, {repo path: bytes})."""
    root = tmp / "origin"
    files = model(root)
    yield from ((srv, root, files) for srv in serve(root))


def shards(files: dict[str, bytes]) -> list[str]:
    """The model's safetensors shards, sorted."""
    return sorted(p for p in files if p.endswith(".safetensors"))


def assert_one_line_error(result: Any, exit_code: int, *needles: str) -> None:
    """A CLI run (click's CliRunner result) that failed with `exit_code` and one `error:` line naming
    each of `needles`, and no traceback of ours."""
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), result.stderr
    # No traceback of ours (the in-process test hub may log its own connection resets to stderr).
    assert not any(f"agent/{m}.py" in result.output for m in ("cli", "fetch", "origin", "download", "cache"))
    for needle in needles:
        assert needle in lines[-1], lines[-1]


def allocated(root: Path) -> int:
    """Bytes of disk the files under `root` hold (allocated blocks, not apparent sizes)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file() and not p.is_symlink())
