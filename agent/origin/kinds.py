"""The kinds of origin, by the URL scheme of `--origin` (agent.origin.base has the interface): a new
kind is a module implementing `Origin` and one entry here, which also says whether the agent's
HF-compatible endpoint can reach it for its clients (agent.origin.hub_api `ClientApi`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent.core.errors import ConfigError
from agent.core.modelnames import Scrub, as_is
from agent.core.settings import OriginSettings
from agent.origin.base import Origin, OriginFactory
from agent.origin.bucket import BucketOrigin
from agent.origin.client import OriginClient
from agent.origin.hub_api import ClientApi, ClientApiFactory, HubClientApi
from agent.origin.oci_origin import OciOrigin


@dataclass(frozen=True)
class OriginKind:
    what: str
    """What the origin is, in a sentence's words ("object storage")."""
    origin: OriginFactory
    """The origin the fetch engine uses, with the node's token."""
    client_api: ClientApiFactory | None
    """How the HF endpoint asks the origin for its clients; None for an origin without the Hub's API,
    whose nodes' HF endpoint serves nothing (`open_client_api` says why)."""


HUB = OriginKind("an HF-compatible hub", OriginClient, HubClientApi)
"""huggingface.co, a mirror, `agent serve-hub`."""
BUCKET = OriginKind("object storage", BucketOrigin, None)
"""S3 and S3-compatible stores, GCS, Azure Blob (agent.origin.bucket)."""

ORIGIN_KINDS: dict[str, OriginKind] = {
    "http": HUB,
    "https": HUB,
    "s3": BUCKET,
    "gs": BUCKET,
    "az": BUCKET,
    "oci": OriginKind("an OCI registry", OciOrigin, None),  # agent.origin.oci
}


class NoClientApi(ConfigError):
    """The origin has no client API; the message says why and is fit for the endpoint's clients (it
    names the origin's kind and scheme, never its URL)."""


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
    """The origin `settings.endpoint` names, as its kind builds it; `scrub`: how its log lines name the
    model (a daemon's job: agent.core.modelnames)."""
    return _kind(settings.endpoint).origin(settings, max_connections, interrupt, scrub)


def open_client_api(settings: OriginSettings) -> ClientApi:
    """The HF endpoint's way to the origin `settings.endpoint` names, as its kind builds it; NoClientApi
    when its kind has none (object storage) or no kind takes the URL."""
    scheme = urlsplit(settings.endpoint).scheme.lower()
    kind = ORIGIN_KINDS.get(scheme)
    if kind is not None and kind.client_api is not None:
        return kind.client_api(settings)
    hubs = ", ".join(f"{s}://" for s in sorted(ORIGIN_KINDS) if ORIGIN_KINDS[s].client_api is not None)
    what = f"is {kind.what} ({scheme}://)" if kind is not None else f"({scheme}://) is of no known kind"
    serves = f"the HF-compatible endpoint serves hub origins only ({hubs})"
    raise NoClientApi(f"this node's origin {what}; {serves}")
