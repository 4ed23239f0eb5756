"""Who may read which repo on the test hub, decided as huggingface.co decides it.

- A repo is public, gated (`"auto"` or `"manual"`: its model info is visible to anyone, its files need
  a token whose user was granted access) or private (invisible without such a token).
- An Authorization header that is not a known bearer token: 401 `Invalid credentials in
  Authorization header`, whatever the repo.
- A private or missing repo: 401 `RepoNotFound` without a token, 404 `RepoNotFound` with a valid
  token that may not read it (the Hub never says whether a private repo exists).
- A gated repo's files: 401 `GatedRepo` without a token, 403 `GatedRepo` with a valid token whose
  user was not granted access.

Tokens: `tokens` may read every repo (the repos' owners); `grants` maps a token to the gated and
private repos its user may read (public repos: any). With neither configured, every bearer token is
valid and reads everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wirekit.tokens import bearer, matches

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
GATED_MODES = ("auto", "manual")


@dataclass(frozen=True)
class Refusal:
    """An access error as the Hub sends it: status, `X-Error-Message`, `X-Error-Code`."""

    status: int
    message: str
    code: str | None = None


class HubAccess:
    """The access rules of one hub; immutable once built."""

    def __init__(
        self,
        tokens: Iterable[str] = (),
        grants: Mapping[str, Iterable[str]] | None = None,
        gated: Iterable[str] | Mapping[str, str] = (),
        private: Iterable[str] = (),
    ) -> None:
        self._tokens = tuple(t for t in tokens if t)
        self._grants = {t: frozenset(repos) for t, repos in (grants or {}).items() if t}
        modes = dict(gated) if isinstance(gated, Mapping) else dict.fromkeys(gated, "auto")
        for repo_id, mode in modes.items():
            if mode not in GATED_MODES:
                raise ValueError(f"gated mode of {repo_id} must be one of {GATED_MODES}: {mode!r}")
        self.gated: Mapping[str, str] = modes
        """Gated repo -> its mode, as model info reports it in `gated`."""
        self.private = frozenset(private)
        self._open = not self._tokens and not self._grants

    def repo_ids(self) -> frozenset[str]:
        """Every repo these rules name (gated, private, granted)."""
        granted = {r for repos in self._grants.values() for r in repos}
        return frozenset(self.gated) | self.private | granted

    def gated_mode(self, repo_id: str) -> str | bool:
        """The model info's `gated` field: False or the gating mode."""
        return self.gated.get(repo_id, False)

    def _token(self, header: str | None) -> bytes | None | Refusal:
        if not header:
            return None
        token = bearer(header)
        if token is None:
            return Refusal(401, INVALID_CREDENTIALS)
        if self._open or matches(token, *self._tokens, *self._grants):
            return token
        return Refusal(401, INVALID_CREDENTIALS)

    def _may_read(self, token: bytes | None, repo_id: str) -> bool:
        if repo_id not in self.private and repo_id not in self.gated:
            return True
        if token is None:
            return False
        if self._open or matches(token, *self._tokens):
            return True
        return any(matches(token, t) and repo_id in repos for t, repos in self._grants.items())

    def check(self, header: str | None, repo_id: str, *, exists: bool, content: bool) -> Refusal | None:
        """None when the request with this Authorization header may go on; else the Hub's refusal.

        `exists`: the repo is served here; `content`: file bytes or the auth check (a gated repo's
        metadata is public, its files are not)."""
        token = self._token(header)
        if isinstance(token, Refusal):
            return token
        authed = token is not None
        if not exists or (repo_id in self.private and not self._may_read(token, repo_id)):
            return Refusal(404 if authed else 401, "Repository not found", "RepoNotFound")
        if content and repo_id in self.gated and not self._may_read(token, repo_id):
            if authed:
                message = (
                    f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                    f"Ask for access on the repo's page."
                )
                return Refusal(403, message, "GatedRepo")
            message = (
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            )
            return Refusal(401, message, "GatedRepo")
        return None
