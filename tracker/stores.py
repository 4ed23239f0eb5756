"""Choosing the store behind `tracker.store.Store`: SQLite (the embedded default) or Redis (replicas).

A new kind of store is a module implementing `Store` (its five interfaces, tracker.store) and one entry
in `STORE_KINDS`, keyed by the scheme of the store URL (`--redis URL` today); without a URL, SQLite.
"""

from __future__ import annotations

from collections.abc import Callable

from tracker.errors import ConfigError
from tracker.settings import TrackerSettings
from tracker.store import Store


def _sqlite(settings: TrackerSettings) -> Store:
    from tracker.store_sqlite import SqliteStore

    return SqliteStore(settings)


def _redis(settings: TrackerSettings) -> Store:
    from tracker.store_redis import RedisStore  # loads the redis client only when it is used

    return RedisStore(settings)


STORE_KINDS: dict[str, Callable[[TrackerSettings], Store]] = {
    "redis": _redis,
    "rediss": _redis,
    "unix": _redis,
}
"""Store kinds by URL scheme."""


def open_store(settings: TrackerSettings) -> Store:
    """Pick the implementation: a store URL (--redis) by its scheme, else SQLite (--db PATH, or in memory)."""
    if settings.redis_url is None:
        return _sqlite(settings)
    scheme = settings.redis_url.split("://", 1)[0].lower() if "://" in settings.redis_url else ""
    kind = STORE_KINDS.get(scheme)
    if kind is None:
        raise ConfigError(
            f"--redis must be a redis://, rediss:// or unix:// URL, got scheme {scheme or 'none'!r}"
        )
    return kind(settings)
