"""Who may call a JSON route: FastAPI dependencies that admit a bearer token of the right role."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, HTTPException, Request, params

from tracker.auth import Role, role_of
from tracker.metrics import Metrics
from tracker.settings import TrackerSettings
from wirekit.tokens import bearer

Dependencies = list[params.Depends]
"""What a route declares as `dependencies=`."""


class Access:
    """The role checks a router declares (`dependencies=access.read`): 401 without a known token, 403
    (naming the role needed) with a token of another role, each refusal counted in the metrics. An
    admitted caller's role is in `request.state.role`."""

    def __init__(self, settings: TrackerSettings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self.read: Dependencies = [Depends(self._allow(Role.AGENT, Role.PUBLISHER, Role.READER))]
        """Reads: every role."""
        self.agent: Dependencies = [Depends(self._allow(Role.AGENT))]
        """The agents' own business: metainfo, leases, where the peers are."""
        self.manifest_writers: Dependencies = [Depends(self._allow(Role.AGENT, Role.PUBLISHER))]
        """Manifest writes: agents (hub models) and the publisher (hub-less models)."""

    def _allow(self, *roles: Role) -> Callable[[Request], Awaitable[Role]]:
        """A dependency: the caller's role if it is one of `roles`."""
        needed = " or ".join(f"the {r.value} role ({r.option})" for r in roles)

        async def caller(request: Request) -> Role:
            role = role_of(bearer(request.headers.get("authorization")), self._settings)
            if role is None:
                self._metrics.refusals["token"].inc()
                raise HTTPException(
                    401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
                )
            if role not in roles:
                self._metrics.refusals["role"].inc()
                raise HTTPException(403, f"this needs {needed}; the token given has the {role.value} role")
            request.state.role = role
            return role

        return caller
