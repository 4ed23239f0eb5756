"""The Kubernetes API as the agent uses it: a narrow port, free of the kubernetes client.

Six calls are all the agent makes (`KubeApi`): list, watch from a resourceVersion, get, merge-patch,
create an Event, close. Objects go in and out as plain JSON dicts. `agent.kube.adapter` implements the
port with the real client (the only module that imports `kubernetes`); `tests.support.kube_memory`
is its in-memory twin for tests, as spegel's `routing.Router` has `memory.go`. The watchers
(agent.kube.listwatch, pods_in, fleet), the status writer (pods_out) and the fleet write only here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agent.core.errors import snippet

GONE = 410
"""A watch's resourceVersion is older than the server keeps (compacted): only a relist is complete."""
CONFLICT = 409
NOT_FOUND = 404
FORBIDDEN = 403

Kind = Literal["pods", "nodes", "modelpreheats"]
"""The objects the agent reads: core/v1 pods and nodes, and the cluster-scoped ModelPreheats
(weightswarm.io/v1alpha1, agent.kube.preheat)."""

GROUP = "weightswarm.io"
VERSION = "v1alpha1"
PLURAL = "modelpreheats"
"""Where the ModelPreheat custom resource is served (the chart's `crds/modelpreheats.yaml`)."""


@dataclass(frozen=True)
class Query:
    """What a list or a watch asks for: one kind, in one namespace (None: all, or cluster-scoped),
    narrowed by selectors as the API server means them ("" = no narrowing)."""

    kind: Kind
    namespace: str | None = None
    field_selector: str = ""
    label_selector: str = ""


class ApiError(Exception):
    """The API server refused a call: its HTTP status (None without an answer), reason and message."""

    def __init__(self, status: int | None, reason: str = "", message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Watch(Protocol):
    """One watch request: iterate for its events ({"type", "object"} dicts: ADDED, MODIFIED, DELETED,
    BOOKMARK) until the server's timeout ends it; an expired resourceVersion raises ApiError(410).
    `stop()` may be called from another thread: the iteration ends promptly."""

    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...

    def stop(self) -> None: ...


class KubeApi(Protocol):
    """The port (see the module doc). Every call but `watch` waits at most `KubeSettings.request_timeout`
    in the adapter; failures raise ApiError (the server answered) or another exception (no answer)."""

    def list(self, query: Query) -> tuple[list[dict[str, Any]], str | None]:
        """The objects now and the list's resourceVersion, to watch from."""
        ...

    def watch(self, query: Query, resource_version: str | None, timeout: int) -> Watch:
        """Changes after `resource_version` (None: the current state as ADDED first), for up to
        `timeout` seconds, with bookmarks."""
        ...

    def get(self, kind: Kind, name: str, subresource: str | None = None) -> dict[str, Any]:
        """One cluster-scoped object (or its `status` subresource)."""
        ...

    def patch(
        self, kind: Kind, name: str, body: Mapping[str, Any], namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386); `metadata.uid` / `metadata.resourceVersion` in it are
        preconditions (409 when they do not hold). Returns the object as stored."""
        ...

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """A core/v1 Event (camelCase keys; timestamps as datetimes)."""
        ...

    def close(self) -> None: ...


def describe(exc: BaseException) -> str:
    """One short line for a log: status and reason, the message cut short (it may echo request data)."""
    if isinstance(exc, ApiError):
        return f"HTTP {exc.status} {exc.reason or ''}: {snippet(exc.message, 160)}".rstrip(": ")
    return f"{type(exc).__name__}: {snippet(str(exc), 160)}"


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API failure (None: no answer from the server)."""
    return exc.status if isinstance(exc, ApiError) else None
