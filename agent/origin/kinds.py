"""The kinds of origin, by the URL scheme of `--origin` (agent.origin.base has the interface): a new
kind is a module implementing `Origin` and one entry here."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from agent.core.errors import ConfigError
from agent.core.settings import OriginSettings
from agent.origin.base import Origin, OriginFactory
from agent.origin.bucket import BucketOrigin
from agent.origin.client import OriginClient

ORIGIN_KINDS: dict[str, OriginFactory] = {
    "http": OriginClient,  # an HF-compatible hub: huggingface.co, a mirror, `agent serve-hub`
    "https": OriginClient,
    "s3": BucketOrigin,  # object storage: S3 and S3-compatible stores, GCS, Azure Blob (agent.origin.bucket)
    "gs": BucketOrigin,
    "az": BucketOrigin,
}


def open_origin(
    settings: OriginSettings, max_connections: int = 16, interrupt: threading.Event | None = None
) -> Origin:
    """The origin `settings.endpoint` names, as its kind builds it."""
    scheme = urlsplit(settings.endpoint).scheme.lower()
    kind = ORIGIN_KINDS.get(scheme)
    if kind is None:
        known = ", ".join(f"{s}://" for s in sorted(ORIGIN_KINDS))
        raise ConfigError(f"no origin kind for {settings.endpoint!r}: --origin takes {known} URLs")
    return kind(settings, max_connections, interrupt)
