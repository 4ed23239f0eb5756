"""Settings: nested dataclasses, built once (by the CLI) and passed down.

No other module reads `os.environ`; `from_env_defaults` is the one place that maps the
Hugging Face environment variables (`HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN`)
onto defaults, as `huggingface_hub` does. `WEIGHTSWARM_<OPTION>` variables are handled by
the CLI layer (every option has one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ORIGIN = "https://huggingface.co"
MiB = 2**20


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (as huggingface_hub)."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """`$XDG_STATE_HOME/weightswarm`, else `~/.local/state/weightswarm`: never inside the hub cache."""
    xdg = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg).expanduser() / "weightswarm"


def default_origin(env: Mapping[str, str]) -> str:
    """`$HF_ENDPOINT`, else https://huggingface.co."""
    return (env.get("HF_ENDPOINT") or DEFAULT_ORIGIN).rstrip("/")


def default_token(env: Mapping[str, str]) -> str | None:
    """`$HF_TOKEN` (or the legacy `$HUGGING_FACE_HUB_TOKEN`), else anonymous."""
    return env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None


@dataclass(frozen=True)
class OriginSettings:
    """How the agent talks to the origin hub (huggingface.co or any HF-compatible hub)."""

    endpoint: str = DEFAULT_ORIGIN
    """Base URL of the hub, no trailing slash. Default https://huggingface.co."""

    token: str | None = field(default=None, repr=False)
    """Bearer token for gated/private repos. Never logged, never written to disk (repr=False)."""

    connect_timeout: float = 10.0
    """Seconds to wait for a TCP/TLS connection to the origin or its CDN."""

    read_timeout: float = 30.0
    """Seconds without a byte before a connection counts as dropped and its range is retried."""

    max_retries: int = 6
    """Attempts per request (per range) for 429, 5xx and dropped connections before giving up."""

    backoff_base: float = 0.5
    """First retry delay in seconds; doubles per attempt, with full jitter, capped at backoff_max."""

    backoff_max: float = 30.0
    """Longest delay between retries, seconds; a server's Retry-After is honoured up to this."""

    user_agent: str = "weightswarm/0.1"
    """User-Agent sent to the origin."""


@dataclass(frozen=True)
class FetchSettings:
    """How a fetch downloads: parallelism, chunking, what to verify."""

    connections_per_file: int = 8
    """Parallel HTTP range requests per file. CDNs cap per-connection speed, so >1 pays off."""

    files_at_once: int = 4
    """Files downloaded concurrently. Total connections = files_at_once x connections_per_file."""

    chunk_size: int = 16 * MiB
    """Bytes per range request; also the unit of resume. 16 MiB keeps requests few and resumes cheap."""

    min_free_bytes: int = 64 * MiB
    """Head-room kept free on the cache filesystem beyond what the download needs."""

    verify_safetensors: bool = True
    """Parse headers of downloaded *.safetensors files and check index json shard lists."""


@dataclass(frozen=True)
class Settings:
    """Everything the agent needs, built once by the CLI."""

    cache_dir: Path
    """Hugging Face hub cache directory (models--org--name/...). vLLM mounts it read-only."""

    state_dir: Path
    """The agent's own state (resume records, digests, databases); never inside cache_dir."""

    origin: OriginSettings = field(default_factory=OriginSettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)

    @classmethod
    def from_env_defaults(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Defaults from the HF environment variables, then explicit overrides (None = default)."""
        env = os.environ if env is None else env
        given = {k: v for k, v in overrides.items() if v is not None}
        cache_dir = Path(str(given.pop("cache_dir", default_cache_dir(env)))).expanduser()
        state_dir = Path(str(given.pop("state_dir", default_state_dir(env)))).expanduser()
        origin = given.pop("origin", None)
        if origin is None:
            origin = OriginSettings(endpoint=default_origin(env), token=default_token(env))
        fetch = given.pop("fetch", None) or FetchSettings()
        if given:
            raise TypeError(f"unknown settings: {sorted(given)}")
        assert isinstance(origin, OriginSettings) and isinstance(fetch, FetchSettings)
        return cls(cache_dir=cache_dir, state_dir=state_dir, origin=origin, fetch=fetch)
