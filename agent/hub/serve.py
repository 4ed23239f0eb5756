"""`agent serve-hub` and `agent make-test-model`: the work behind the two CLI commands."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import TextIO

from agent.core.errors import ConfigError
from agent.hub.repos import valid_repo_id
from agent.hub.server import HubServer, RateLimits
from agent.hub.testmodel import make_model, parse_size

log = logging.getLogger(__name__)


def read_token_file(path: Path) -> list[str]:
    """One token per line; blank lines and `#` comments skipped. The tokens never reach a message."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
    tokens = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not tokens:
        raise ConfigError(f"token file {path} holds no token (one per line)")
    return tokens


def parse_rate(text: str | None, option: str) -> float | None:
    if text is None or text == "":
        return None
    try:
        rate = float(parse_size(text))
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from exc
    if rate <= 0:
        raise ConfigError(f"{option} must be positive bytes per second: {text!r}")
    return rate


def _check_repo_ids(repo_ids: Iterable[str], option: str) -> list[str]:
    ids = list(repo_ids)
    for repo_id in ids:
        if not valid_repo_id(repo_id):
            raise ConfigError(f"{option}: not a repo id (org/name): {repo_id!r}")
    return ids


def serve_hub(
    root: Path,
    *,
    host: str,
    port: int,
    token_file: Path | None,
    gated: Iterable[str],
    private: Iterable[str],
    rate_total: str | None,
    rate_per_connection: str | None,
    rate_per_client: str | None = None,
    access_log: bool = False,
    answers: str = "2026",
    cdn_port: int = 0,
    cdn_url_ttl: float | None = None,
    rate_limits: bool | None = None,
    streams_per_file: int = 0,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> None:
    """Serve until SIGTERM or SIGINT; the URL is printed (and flushed) on `out` once the socket listens,
    the CDN's on `err` (scripts read the first line of stdout). `access_log`: a line per request on stderr
    (agent.hub.server.access_log). `rate_limits`: None = as `answers` (the Hub's in 2026, none in 2024).
    `streams_per_file`: `Faults.streams_per_file` (0: no limit)."""
    if not root.is_dir():
        raise ConfigError(f"not a directory: {root} (it should hold <org>/<name>/ repo folders)")
    if access_log:
        to_stderr = logging.StreamHandler(sys.stderr)
        to_stderr.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        access = logging.getLogger("agent.hub.access")
        access.addHandler(to_stderr)
        access.setLevel(logging.INFO)
        access.propagate = False
    server = HubServer(
        root,
        host,
        port,
        tokens=read_token_file(token_file) if token_file else (),
        gated=_check_repo_ids(gated, "--gated"),
        private=_check_repo_ids(private, "--private"),
        rate_total=parse_rate(rate_total, "--rate-total"),
        rate_per_connection=parse_rate(rate_per_connection, "--rate-per-connection"),
        rate_per_client=parse_rate(rate_per_client, "--rate-per-client"),
        answers="2024" if answers == "2024" else "2026",
        cdn_port=cdn_port,
        cdn_url_ttl=cdn_url_ttl,
        rate_limits="auto" if rate_limits is None else RateLimits() if rate_limits else None,
    )
    server.faults.streams_per_file = streams_per_file
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        print(server.url, file=out, flush=True)
        limits = "the Hub's rate limits" if server.rate_limits else "no rate limits"
        if server.cdn_url != server.url:
            cdn = f"signed LFS URLs at {server.cdn_url} (valid {server.cdn_url_ttl:g} s)"
            print(f"serve-hub: answers as the Hub of {answers}, {limits}; {cdn}", file=err, flush=True)
        else:
            print(f"serve-hub: answers as the Hub of {answers}, {limits}", file=err, flush=True)
        # Hashing a large directory takes a while: do it behind the listening socket, not before it.
        threading.Thread(target=_warm, args=(server,), name="hub-warm", daemon=True).start()
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _warm(server: HubServer) -> None:
    started = time.monotonic()
    try:
        count = server.warm()
    except OSError as exc:
        log.warning("hub: could not scan %s: %s", server.root, exc)
        return
    log.info("hub: %d repos hashed in %.1fs", count, time.monotonic() - started)


def make_test_model(root: Path, repo_id: str, *, size: str, shards: int, seed: int, dtype: str) -> Path:
    """Write the model and return its directory."""
    try:
        total = parse_size(size)
        make_model(root, repo_id, total_bytes=total, shards=shards, seed=seed, dtype=dtype)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return root / repo_id
