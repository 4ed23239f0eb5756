"""The kinds of origin, by the URL scheme of `--origin` (agent.origin.base has the interface): a new kind is
a module with a class implementing `Kind` and one entry here, which also says whether the agent's
HF-compatible endpoint can reach it for its clients (agent.origin.hub_api `ClientApi`).

Entries name their classes by dotted path, imported on first use (as uvicorn's protocol table): an
`agent fetch` of a hub model never loads obstore, nor a bucket fetch httpx.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from agent.core.errors import ConfigError
from agent.core.modelnames import Scrub, as_is
from agent.core.settings import OriginSettings
from agent.origin.client import Origin

if TYPE_CHECKING:
    from agent.origin.base import KindFactory
    from agent.origin.hub_api import ClientApi, ClientApiFactory


@dataclass(frozen=True)
class OriginKind:
    what: str
    """What the origin is, in a sentence's words ("object storage")."""
    kind: str
    """`module:Class` of its `Kind` (built from its settings and the most connections it may open)."""
    client_api: str | None
    """`module:Class` of how the HF endpoint asks the origin for its clients (a `ClientApi`); None for an
    origin without the Hub's API, whose nodes' HF endpoint serves nothing (`open_client_api` says why)."""
    hub_token: bool
    """Whether the node's hub token (`OriginSettings.token`) is this kind's credential; False: it is
    dropped before the kind is built (a store or registry has credentials of its own)."""


HUB = OriginKind(
    "an HF-compatible hub", "agent.origin.hub:HubOrigin", "agent.origin.hub_api:HubClientApi", hub_token=True
)
"""huggingface.co, a mirror, `agent serve-hub`."""
BUCKET = OriginKind("object storage", "agent.origin.bucket:BucketOrigin", None, hub_token=False)
"""S3 and S3-compatible stores, GCS, Azure Blob (agent.origin.bucket)."""

ORIGIN_KINDS: dict[str, OriginKind] = {
    "http": HUB,
    "https": HUB,
    "s3": BUCKET,
    "gs": BUCKET,
    "az": BUCKET,
    "oci": OriginKind("an OCI registry", "agent.origin.oci_origin:OciOrigin", None, hub_token=False),
}


class NoClientApi(ConfigError):
    """The origin has no client API; the message says why and is fit for the endpoint's clients (it
    names the origin's kind and scheme, never its URL)."""


def load(dotted: str) -> object:
    """The object `module:name` names, its module imported now if it was not yet."""
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def _kind(endpoint: str) -> OriginKind:
    kind = ORIGIN_KINDS.get(urlsplit(endpoint).scheme.lower())
    if kind is None:
        known = ", ".join(f"{s}://" for s in sorted(ORIGIN_KINDS))
        raise ConfigError(f"no origin kind for {endpoint!r}: --origin takes {known} URLs")
    return kind


def open_origin(
    settings: OriginSettings,
    max_connections: int = 16,
    interrupt: threading.Event | None = None,
    scrub: Scrub = as_is,
) -> Origin:
    """The origin `settings.endpoint` names, as its kind builds it, with the retries and patience of
    agent.origin.client `Origin`; `interrupt` ends its waits (the daemon stopping), `scrub`: how its log
    lines name the model (a daemon's job: agent.core.modelnames)."""
    kind = _kind(settings.endpoint)
    if not kind.hub_token:
        settings = dataclasses.replace(settings, token=None)
    factory = cast("KindFactory", load(kind.kind))
    return Origin(factory(settings, max_connections), settings, interrupt, scrub)


def open_client_api(settings: OriginSettings) -> ClientApi:
    """The HF endpoint's way to the origin `settings.endpoint` names, as its kind builds it; NoClientApi
    when its kind has none (object storage) or no kind takes the URL."""
    scheme = urlsplit(settings.endpoint).scheme.lower()
    kind = ORIGIN_KINDS.get(scheme)
    if kind is not None and kind.client_api is not None:
        return cast("ClientApiFactory", load(kind.client_api))(settings)
    hubs = ", ".join(f"{s}://" for s in sorted(ORIGIN_KINDS) if ORIGIN_KINDS[s].client_api is not None)
    what = f"is {kind.what} ({scheme}://)" if kind is not None else f"({scheme}://) is of no known kind"
    serves = f"the HF-compatible endpoint serves hub origins only ({hubs})"
    raise NoClientApi(f"this node's origin {what}; {serves}")
