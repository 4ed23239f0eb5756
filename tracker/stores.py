"""Choosing the store behind `tracker.store.Store`: SQLite (the embedded default) or Redis (replicas)."""

from __future__ import annotations

from tracker.errors import ConfigError
from tracker.settings import TrackerSettings
from tracker.store import Store


def open_store(settings: TrackerSettings) -> Store:
    """Pick the implementation: --redis URL → Redis, else SQLite (--db PATH, or in memory)."""
    if settings.redis_url is not None:
        scheme = settings.redis_url.split("://", 1)[0].lower() if "://" in settings.redis_url else ""
        if scheme not in _REDIS_SCHEMES:
            raise ConfigError(
                f"--redis must be a redis://, rediss:// or unix:// URL, got scheme {scheme or 'none'!r}"
            )
        from tracker.store_redis import RedisStore

        return RedisStore(settings)
    from tracker.store_sqlite import SqliteStore

    return SqliteStore(settings)


_REDIS_SCHEMES = {"redis", "rediss", "unix"}
