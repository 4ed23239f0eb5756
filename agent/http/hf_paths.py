"""What a client of the HF endpoint asked for, checked before any of it goes to the origin or the cache.

The routes' path parameters come decoded (Starlette decodes `%2e%2e` to `..` and `%2F` to `/` before it
matches), so the checks here read the request's raw path: each `/`-separated segment decoded on its own,
as the Hub reads it (huggingface_hub quotes a revision whole, `refs%2Fpr%2F1`, and a file path with its
slashes kept). A segment that decodes to nothing, `.`, `..`, a control character or a `/` (in a repo id
or a file name) is refused with 400, and so is anything `agent.cache.layout` refuses: a repo id the Hub
would not take, a revision git would not (or longer than a ref file name), a path longer than a snapshot
may hold. The path asked of the origin is then built from the checked parts, each quoted (`origin_path`,
which the origin's client API puts after the origin's URL): no dot segment, no client-chosen host path,
and of the client's query string only the parameters the Hub documents for that route (`API_ROUTES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from agent.cache.layout import check_repo_id, check_revision, safe_relpath
from agent.core.errors import WeightswarmError

API_ROUTES: Mapping[str, frozenset[str]] = {
    # GET /api/models/{repo}[/revision/{rev}]: huggingface_hub's model_info (`securityStatus`, `blobs`
    # for files_metadata, `expand` / `expand[]`).
    "info": frozenset({"securityStatus", "blobs", "expand", "expand[]"}),
    "revision": frozenset({"securityStatus", "blobs", "expand", "expand[]"}),
    # GET /api/models/{repo}/tree/{rev}[/{path}]: list_repo_tree (`recursive`, `expand`) and its pages.
    "tree": frozenset({"recursive", "expand", "cursor", "limit"}),
    # GET /api/models/{repo}/refs: list_repo_refs.
    "refs": frozenset({"include_prs"}),
    # GET /api/models/{repo}/auth-check: auth_check.
    "auth-check": frozenset(),
}
"""The `/api/models/...` routes passed on to the origin, and the query parameters each may carry."""


class BadPath(WeightswarmError):
    """A request path the endpoint will not pass on."""

    status = 400


class NotServed(BadPath):
    """A well-formed `/api/models/...` route the endpoint does not pass on."""

    status = 404


@dataclass(frozen=True)
class ApiRequest:
    """A checked `GET /api/models/{repo}/...`."""

    repo_id: str
    route: str
    """A key of `API_ROUTES`."""
    revision: str | None = None
    path: str = ""
    """A tree listing's folder ("" for the root)."""

    def origin_path(self) -> str:
        """The request's path on the origin, built from the checked parts, each quoted."""
        repo = f"/api/models/{_quoted_repo(self.repo_id)}"
        if self.route == "info":
            return repo
        if self.revision is None:
            return f"{repo}/{self.route}"
        at = f"{repo}/{self.route}/{quote(self.revision, safe='')}"
        return f"{at}/{quote(self.path)}" if self.path else at

    def params(self, query: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The client's query parameters that the Hub documents for this route."""
        allowed = API_ROUTES[self.route]
        return [(k, v) for k, v in query if k in allowed]


@dataclass(frozen=True)
class ResolveRequest:
    """A checked `GET|HEAD /{org}/{name}/resolve/{rev}/{path}`."""

    repo_id: str
    revision: str
    path: str

    def origin_path(self) -> str:
        """The request's path on the origin, built from the checked parts, each quoted."""
        revision = quote(self.revision, safe="")
        return f"/{_quoted_repo(self.repo_id)}/resolve/{revision}/{quote(self.path)}"


def _segments(raw_path: bytes) -> list[str]:
    """The raw path's segments, each percent-decoded on its own (UTF-8)."""
    try:
        return [unquote_to_bytes(s).decode() for s in raw_path.split(b"/")[1:]]
    except UnicodeDecodeError:
        raise BadPath("the path is not UTF-8 once decoded") from None


def _name(segment: str, what: str) -> str:
    """One segment that is a name of its own (an org, a repo name, a file name): nothing that would be a
    separator or a dot segment once decoded."""
    if segment in ("", ".", "..") or "/" in segment:
        raise BadPath(f"invalid {what} in the path: {segment[:80]!r}")
    return segment


def _checked(check: Callable[[str], object], value: str) -> str:
    try:
        check(value)
    except WeightswarmError as exc:
        raise BadPath(str(exc)) from None
    return value


def _quoted_repo(repo_id: str) -> str:
    return "/".join(quote(part, safe="") for part in repo_id.split("/"))


def api_request(raw_path: bytes) -> ApiRequest:
    """`/api/models/{org}/{name}[/{route}...]` from the raw request path; raises BadPath."""
    segs = _segments(raw_path)
    if segs[:2] != ["api", "models"] or len(segs) < 4:
        raise BadPath("expected /api/models/{org}/{name}[/...]")
    org, name = _name(segs[2], "organization"), _name(segs[3], "repo name")
    repo_id = _checked(check_repo_id, f"{org}/{name}")
    rest = segs[4:]
    if rest and rest[-1] == "":  # a trailing slash: the Hub answers the same
        rest = rest[:-1]
    if not rest:
        return ApiRequest(repo_id, "info")
    route, args = rest[0], rest[1:]
    if route in ("refs", "auth-check") and not args:
        return ApiRequest(repo_id, route)
    if route == "revision" and args:
        # huggingface_hub sends the revision as one segment (`refs%2Fpr%2F1`); taken whole either way.
        return ApiRequest(repo_id, route, _checked(check_revision, "/".join(args)))
    if route == "tree" and args:
        revision = _checked(check_revision, args[0])
        path = "/".join(_name(s, "path segment") for s in args[1:])
        if path:
            _checked(safe_relpath, path)
        return ApiRequest(repo_id, route, revision, path)
    raise NotServed(f"/api/models/{repo_id}/{route[:40]}/... is not served by this endpoint")


def resolve_request(raw_path: bytes) -> ResolveRequest:
    """`/{org}/{name}/resolve/{rev}/{path}` from the raw request path; raises BadPath."""
    segs = _segments(raw_path)
    if len(segs) < 5 or segs[2] != "resolve":
        raise BadPath("expected /{org}/{name}/resolve/{revision}/{path}")
    org, name = _name(segs[0], "organization"), _name(segs[1], "repo name")
    repo_id = _checked(check_repo_id, f"{org}/{name}")
    revision = _checked(check_revision, segs[3])
    path = "/".join(_name(s, "path segment") for s in segs[4:])
    return ResolveRequest(repo_id, revision, _checked(safe_relpath, path))
