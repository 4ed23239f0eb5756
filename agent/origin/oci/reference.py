"""`oci://REGISTRY[:PORT]/REPOSITORY:TAG` and `oci://REGISTRY[:PORT]/REPOSITORY@sha256:DIGEST`: parsed and
checked without I/O, so the CLI and the daemon's request checks need not load the registry client."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.errors import ConfigError

SCHEME = "oci"
_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?$")
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
"""The distribution spec's repository name (`<name>`), lowercase path components."""
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class OciRef:
    registry: str
    """host[:port], as the docker config's `auths` keys name it."""
    repository: str
    tag: str | None
    digest: str | None
    """`sha256:<64 hex>` when the URL pins one."""

    @property
    def reference(self) -> str:
        """What the manifest URL takes: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def url(self) -> str:
        at = f"@{self.digest}" if self.digest else f":{self.tag}"
        return f"{SCHEME}://{self.registry}/{self.repository}{at}"

    @property
    def revision(self) -> str:
        """The revision the snapshot is cached under: the tag (`refs/<tag>`), or the commit of a digest."""
        return commit_of(self.digest) if self.digest else self.reference


def is_oci_url(text: str) -> bool:
    return text[: len(SCHEME) + 3].lower() == f"{SCHEME}://"


def commit_of(digest: str) -> str:
    """The 40-hex commit the HF layout needs for a manifest's `sha256:<64 hex>`: its first 40 hex digits
    (git's abbreviation rule; a collision in 160 bits of sha256 is as unlikely as one in sha1)."""
    if not _DIGEST.match(digest):
        raise ConfigError(f"{digest[:80]!r} is not a sha256 digest")
    return digest[len("sha256:") : len("sha256:") + 40]


def parse_oci_url(url: str) -> OciRef:
    """An `oci://` URL -> OciRef; ConfigError naming the form otherwise."""
    form = "use oci://REGISTRY[:PORT]/REPOSITORY:TAG or oci://REGISTRY[:PORT]/REPOSITORY@sha256:DIGEST"
    if not is_oci_url(url):
        raise ConfigError(f"{url[:200]!r} is not an OCI reference: {form}")
    rest = url[len(SCHEME) + 3 :]
    registry, _, name = rest.partition("/")
    digest = tag = None
    if "@" in name:
        name, _, digest = name.partition("@")
        if not _DIGEST.match(digest):
            raise ConfigError(f"{url[:200]!r}: the digest must be sha256:<64 lowercase hex>")
    else:
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            name, _, tag = name.rpartition(":")
            if not _TAG.match(tag):
                raise ConfigError(f"{url[:200]!r}: {tag[:130]!r} is not a tag")
        else:
            tag = "latest"
    if not _HOST.match(registry) or not name or not _REPO.match(name):
        raise ConfigError(f"{url[:200]!r}: {form} (lowercase repository path)")
    return OciRef(registry.lower(), name, tag, digest)


def allowed_registry(source: str, allowed: tuple[str, ...]) -> str:
    """`source` normalised, when its registry and repository lie under one of the `allowed` prefixes
    (`oci://HOST[:PORT]/PREFIX`, whole path segments; `oci://HOST` allows the whole registry);
    ConfigError otherwise, saying what to set."""
    ref = parse_oci_url(source)
    wanted = f"{ref.registry}/{ref.repository}"
    for entry in allowed:
        base = allowed_prefix(entry)
        if wanted == base or wanted.startswith(base + "/") or base == ref.registry:
            return ref.url
    raise ConfigError(
        f"{ref.url}: this agent reads no such registry repository for requests; its operator allows one "
        "with `agent serve --registry oci://HOST[:PORT]/PREFIX` (the chart's registries.allow)"
    )


def allowed_prefix(entry: str) -> str:
    """An allow-list entry `oci://HOST[:PORT][/PREFIX]` -> `host[:port][/prefix]`; ConfigError else."""
    if not is_oci_url(entry):
        raise ConfigError(f"{entry[:200]!r}: a registry prefix is oci://HOST[:PORT]/PREFIX")
    registry, _, prefix = entry[len(SCHEME) + 3 :].strip("/").partition("/")
    if not _HOST.match(registry) or (prefix and not _REPO.match(prefix)):
        raise ConfigError(f"{entry[:200]!r}: a registry prefix is oci://HOST[:PORT]/PREFIX (no tag)")
    return f"{registry.lower()}/{prefix}".rstrip("/")


def plain_http_hosts(text: str | None) -> tuple[str, ...]:
    """`--oci-plain-http HOST:PORT,...` -> its hosts, lowercased; ConfigError for one that is no host."""
    hosts = tuple(h.strip().lower() for h in (text or "").split(",") if h.strip())
    for host in hosts:
        if not _HOST.match(host):
            raise ConfigError(f"--oci-plain-http: {host[:100]!r} is not HOST[:PORT]")
    return hosts
