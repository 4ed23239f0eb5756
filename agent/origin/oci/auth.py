"""A registry's credentials and how they are presented, as docker, podman and skopeo do.

Credentials come from a docker config file (`auths` entries: `auth` = base64 "user:password", or
`username`/`password`), the file `REGISTRY_AUTH_FILE` names (podman, skopeo), else
`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json` (which file: agent.core.settings). Credential
helpers (`credsStore`, `credHelpers`) and `identitytoken` refresh tokens are not run.

A request goes out anonymous, or with what the last challenge asked for. A 401's `WWW-Authenticate`
says how to do better (distribution's token auth spec): `Basic realm=…` (the credentials on every
request) or `Bearer realm=…,service=…,scope=…`, then a GET of the realm with the credentials (Basic) or
none, whose JSON `token` (or `access_token`) goes on the requests as `Authorization: Bearer`. The
credentials go to the registry and its realm only, and only over HTTPS unless the operator named the host
plain-http; they never reach a storage URL a blob redirects to, a log or an error message.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from agent.core.errors import AuthError, OriginError

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 1 << 20
"""A docker config is a few KiB; more is not one."""
MAX_TOKEN_BYTES = 64 << 10
"""A token answer is a JWT or an opaque string of a few KiB."""
DEFAULT_TOKEN_TTL = 60.0
"""Seconds a token lives when its answer says no `expires_in` (the token spec's default)."""
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")
_PARAM = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|([^,\s]*))')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def _host_key(key: str) -> str:
    """An `auths` key as the host[:port] it names (`https://host/v1/` -> `host`)."""
    if "://" in key:
        key = urlsplit(key).netloc
    return key.split("/", 1)[0].lower()


def credentials_for(registry: str, config_file: Path | None) -> Credentials | None:
    """The docker config's credentials for `registry` (host[:port]), or None (anonymous)."""
    if config_file is None:
        return None
    try:
        with config_file.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AuthError(f"cannot read the registry credentials in {config_file}: {exc.strerror}") from None
    try:
        auths = json.loads(raw).get("auths") if len(raw) <= MAX_CONFIG_BYTES else None
    except (ValueError, AttributeError):
        auths = None
    if not isinstance(auths, dict):
        raise AuthError(f"{config_file} is no docker config (a JSON object with `auths`)")
    wanted = {registry.lower()}
    if registry.lower() in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        wanted |= {_host_key(k) for k in _HUB_KEYS}
    for key, entry in auths.items():
        if _host_key(str(key)) in wanted and isinstance(entry, dict):
            return _entry(entry, registry, config_file)
    return None


def _entry(entry: dict[str, object], registry: str, config_file: Path) -> Credentials | None:
    user, password = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(password, str) and user:
        return Credentials(user, password)
    auth = entry.get("auth")
    if not isinstance(auth, str) or not auth:
        return None
    try:
        name, sep, secret = base64.b64decode(auth, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        name, sep, secret = "", "", ""
    if not sep or not name:
        raise AuthError(f"{config_file}: the `auth` of {registry} is not base64 of user:password")
    return Credentials(name, secret)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…",scope="…"` -> ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
              for m in _PARAM.finditer(rest)}
    return scheme.lower(), params


TokenGet = Callable[[str, dict[str, str]], tuple[int, bytes]]
"""GET url with headers -> (status, body of at most MAX_TOKEN_BYTES)."""


class Authorizer:
    """The Authorization header for one registry repository, renewed on a challenge; thread-safe."""

    def __init__(
        self, registry: str, credentials: Credentials | None, plain_http: bool, get: TokenGet
    ) -> None:
        self.registry = registry
        self._credentials = credentials
        self._plain_http = plain_http
        self._get = get
        self._lock = threading.Lock()
        self._header: str | None = None
        self._expires = float("inf")
        self._scheme: str | None = None

    def __repr__(self) -> str:  # credentials and tokens stay out of reprs
        return f"Authorizer({self.registry!r}, credentials={self._credentials is not None})"

    def header(self) -> str | None:
        with self._lock:
            return self._header if time.monotonic() < self._expires else None

    def challenged(self, www_authenticate: str, sent: str | None, what: str) -> None:
        """A 401 came with this challenge to a request that carried `sent`: get what it asks for, unless
        another thread already did; AuthError when it cannot be met or was already met."""
        scheme, params = parse_challenge(www_authenticate)
        with self._lock:
            if self._header is not None and self._header != sent:
                return  # renewed meanwhile
            if scheme == "basic":
                if self._credentials is None:
                    raise AuthError(f"{what}: the registry {self.registry} asks for a login, and the docker "
                                    "config has none for it (docker login / REGISTRY_AUTH_FILE)")
                if sent == self._credentials.basic():
                    raise AuthError(f"{what}: the registry {self.registry} refused the docker config's login")
                self._header, self._expires, self._scheme = self._credentials.basic(), float("inf"), scheme
                return
            if scheme != "bearer" or not params.get("realm"):
                raise AuthError(f"{what}: the registry {self.registry} asks for {scheme[:20]!r} auth, which "
                                "the agent does not speak (Basic and Bearer tokens only)")
            if sent is not None and sent.startswith("Bearer ") and self._scheme == "bearer" and \
                    time.monotonic() < self._expires:
                raise AuthError(f"{what}: the registry {self.registry} refused its token service's token "
                                f"for scope {params.get('scope', '')[:200]!r}")
            token, ttl = self._token(params, what)
            self._header, self._scheme = f"Bearer {token}", scheme
            self._expires = time.monotonic() + max(10.0, ttl - 10.0)

    def _token(self, params: dict[str, str], what: str) -> tuple[str, float]:
        realm = params["realm"]
        parts = urlsplit(realm)
        if parts.scheme != "https" and not (parts.scheme == "http" and self._plain_http):
            raise AuthError(f"{what}: the registry's token service {parts.netloc[:100]} is not HTTPS; "
                            "refused (a plain-http registry's may be: --oci-plain-http)")
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        url = realm + ("&" if parts.query else "?") + urlencode(query) if query else realm
        headers = {"Authorization": self._credentials.basic()} if self._credentials else {}
        status, body = self._get(url, headers)
        if status in (401, 403):
            who = "the docker config's login" if self._credentials else "an anonymous request"
            raise AuthError(f"{what}: the token service of {self.registry} refused {who} ({status})")
        if status != 200:
            raise OriginError(f"{what}: the token service of {self.registry} answered {status}")
        try:
            answer = json.loads(body)
            token = answer.get("token") or answer.get("access_token")
            ttl = float(answer.get("expires_in") or DEFAULT_TOKEN_TTL)
        except (ValueError, AttributeError, TypeError):
            token, ttl = None, 0.0
        if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
            raise OriginError(f"{what}: the token service of {self.registry} sent no token")
        return token, ttl
