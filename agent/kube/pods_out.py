"""Pods out: what the agent writes on a pod, `weightswarm.io/status` and core/v1 Events, through the
port (agent.kube.api). agent.kube.podsync decides every write; `StatusReporter` rate-limits and
coalesces the status patches and sends them from its own thread, so a decision never waits on the API.

Events name the pod with its uid (`involvedObject`); a status patch carries `metadata.uid` as a
precondition, so a recreated pod of the same name is never patched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from agent.core.errors import snippet
from agent.core.settings import KubeSettings
from agent.kube.api import FORBIDDEN, KubeApi, describe, status_of
from agent.kube.requests import FINAL_PHASES, STATUS_ANNOTATION, ModelRef, ModelStatus, PodKey, encode_status

log = logging.getLogger(__name__)

REPORTING_COMPONENT = "weightswarm-agent"
# Patch answers meaning "that pod is not there any more" (404), or "a different pod has that
# name now" (the uid precondition: 409 from a precondition, 422 from the immutable-uid check).
_POD_REPLACED = frozenset({404, 409, 422})


@dataclass
class _PodStatusState:
    """Per-pod sending state: what the pod shows, what is waiting, and when we last wrote."""

    sent_body: str | None = None
    sent_phases: Mapping[str, str] = field(default_factory=dict)
    sent_at: float = float("-inf")
    pending: str | None = None
    pending_phases: Mapping[str, str] = field(default_factory=dict)
    urgent: bool = False


class StatusReporter:
    """Writes `weightswarm.io/status` on pods and creates Events.

    `report` never blocks on the API: it records the latest state and a sender thread patches
    each pod at most once per `status_min_interval` (the latest state wins; a state equal to
    what the pod already shows is not sent). A model newly Ready or Failed is sent at once.
    Call `close()` to flush what is pending and stop the sender thread.
    """

    def __init__(
        self,
        settings: KubeSettings,
        api: KubeApi,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._api = api
        self._clock = clock
        self._cond = threading.Condition()
        self._pods: dict[PodKey, _PodStatusState] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self.patches_sent = 0
        self.patch_errors = 0

    def report(self, pod: PodKey, statuses: Mapping[ModelRef, ModelStatus]) -> None:
        """The pod's whole status now, one entry per requested model."""
        self.report_keys(pod, {ref.key: st for ref, st in statuses.items()})

    def report_keys(self, pod: PodKey, statuses: Mapping[str, ModelStatus]) -> None:
        """As `report`, keyed by the status-annotation key (a bad annotation has no ModelRef)."""
        body = encode_status(statuses)
        phases: dict[str, str] = {key: st.phase for key, st in statuses.items()}
        with self._cond:
            if self._closing:
                return
            state = self._pods.setdefault(pod, _PodStatusState())
            if body == state.pending:
                return
            if body == state.sent_body:
                state.pending, state.urgent = None, False
                return
            state.pending, state.pending_phases = body, phases
            state.urgent = state.urgent or any(
                phase in FINAL_PHASES and state.sent_phases.get(key) != phase for key, phase in phases.items()
            )
            if self._thread is None:
                self._thread = threading.Thread(target=self._sender, name="kube-status", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def forget(self, pod: PodKey) -> None:
        """Drop the pod's state (it is gone); a pending patch for it is not sent."""
        with self._cond:
            self._pods.pop(pod, None)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is pending (ignoring the interval) and stop the sender thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def event(
        self, pod: PodKey, reason: str, message: str, type_: Literal["Normal", "Warning"] = "Normal"
    ) -> None:
        """Create a core/v1 Event about the pod. Failures are logged, never raised."""
        now = datetime.now(UTC)
        node = self._settings.node_name or None
        event: dict[str, object] = {
            # client-go names events "<object>.<unique hex>"; time_ns is unique enough per pod.
            "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": snippet(message, 1000),
            "type": type_,
            "source": {"component": REPORTING_COMPONENT, "host": node},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._api.create_event(pod.namespace, event)
        except Exception as exc:  # noqa: BLE001 - an event is best effort
            hint = " (RBAC: the agent needs create on events)" if status_of(exc) == FORBIDDEN else ""
            log.warning("event %s on pod %s not created: %s%s", reason, pod, describe(exc), hint)

    # -- sender thread ----------------------------------------------------------------------------

    def _sender(self) -> None:
        interval = self._settings.status_min_interval
        while True:
            with self._cond:
                while True:
                    now = self._clock()
                    waiting = [(p, s) for p, s in self._pods.items() if s.pending is not None]
                    due = [
                        (p, s) for p, s in waiting
                        if self._closing or s.urgent or now >= s.sent_at + interval
                    ]
                    if due or (self._closing and not waiting):
                        break
                    next_due = min((s.sent_at + interval for _, s in waiting), default=None)
                    self._cond.wait(None if next_due is None else max(0.0, next_due - now))
                if not due:
                    return
                batch = []
                for pod, state in due:
                    assert state.pending is not None
                    batch.append((pod, state.pending, state.sent_body))
                    state.sent_body, state.sent_phases = state.pending, state.pending_phases
                    state.sent_at, state.pending, state.urgent = now, None, False
            for pod, body, previous in batch:
                self._patch(pod, body, previous)

    def _patch(self, pod: PodKey, body: str, previous: str | None) -> None:
        patch = {"metadata": {"uid": pod.uid, "annotations": {STATUS_ANNOTATION: body}}}
        try:
            self._api.patch("pods", pod.name, patch, namespace=pod.namespace)
            with self._cond:
                self.patches_sent += 1
            return
        except Exception as exc:  # noqa: BLE001 - logged; the reporter survives API trouble
            status = status_of(exc)
            with self._cond:
                self.patch_errors += 1
                state = self._pods.get(pod)
                if status in _POD_REPLACED:
                    self._pods.pop(pod, None)
                elif state is not None and status != FORBIDDEN and state.pending is None:
                    # Transient (5xx, connection): what the pod shows is unknown; try this state
                    # again after the interval unless a newer one arrives first.
                    state.sent_body, state.pending = previous, body
            hint = " (RBAC: the agent needs patch on pods)" if status == FORBIDDEN else ""
            log.warning("status of pod %s not updated: %s%s", pod, describe(exc), hint)
