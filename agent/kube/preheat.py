"""ModelPreheat: "keep this model on every node that matches", and its watcher (through the port,
agent.kube.api: free of the kubernetes client).

A cluster-scoped custom resource (the CRD ships in the chart, `crds/modelpreheats.yaml`):

    apiVersion: weightswarm.io/v1alpha1
    kind: ModelPreheat
    metadata: {name: qwen-72b}
    spec:
      model: Qwen/Qwen2.5-72B-Instruct@<commit>   # the pod annotation's syntax
      nodeSelector: {gpu: h100}                   # absent or empty: every node with an agent

Each agent acts for its own node only: when its Node's labels match, it fetches the model as
background work (it yields to models pods wait for), pins it against eviction, and writes its own
entry under `status.nodes.<node>`; the counts (`nodesReady` of `nodesWanted`, bytes from the origin
and from peers over the wanted nodes) are recomputed by whichever agent wrote last, under the
object's resourceVersion, so concurrent writers converge. Deleting the object, or the node no longer
matching, unpins the model (it stays in the cache until eviction needs the room).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.core.errors import AnnotationError
from agent.core.settings import KubeSettings
from agent.kube.api import KubeApi, Query
from agent.kube.listwatch import ListWatch
from agent.kube.requests import ModelRef, ModelStatus, parse_model_ref

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preheat:
    """One ModelPreheat object, as far as a node needs it."""

    name: str
    uid: str
    model: ModelRef
    node_selector: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Like a pod's nodeSelector: every pair present in the node's labels."""
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    @property
    def label_selector(self) -> str:
        """The same selection as a list call's labelSelector ("" = every node)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))


def parse_preheat(obj: Mapping[str, Any]) -> Preheat:
    """A ModelPreheat object to a `Preheat`; raises `AnnotationError` for a bad spec (the CRD's schema
    refuses most, but an agent must not trust that an old or hand-made CRD did)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name, uid = meta.get("name"), meta.get("uid")
    if not (isinstance(name, str) and name and isinstance(uid, str) and uid):
        raise AnnotationError(str(name), "metadata.name and metadata.uid are required")
    model = spec.get("model")
    if not isinstance(model, str):
        raise AnnotationError(name, "spec.model must be a string 'org/name[@revision]'")
    ref = parse_model_ref(model.strip())
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise AnnotationError(name, "spec.nodeSelector must map label names to strings")
    return Preheat(name, uid, ref, dict(selector), int(meta.get("generation") or 0))


def node_entry(status: ModelStatus) -> dict[str, Any]:
    """This node's entry under `status.nodes` (camelCase, as the pod status annotation)."""
    out = status.to_json()
    out.pop("snapshot", None)  # a path on this node means nothing to a reader of the cluster object
    out["commit"] = status.commit
    out["updated"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def summarise(preheat: Preheat, nodes: Mapping[str, Any], wanted: list[str]) -> dict[str, Any]:
    """The counts over the nodes the preheat wants (entries of nodes that left the selection, or left
    the cluster, do not count)."""
    entries = [nodes[n] for n in wanted if isinstance(nodes.get(n), dict)]
    ready = sum(1 for e in entries if e.get("phase") == "Ready")
    return {
        "nodesWanted": len(wanted),
        "nodesReady": ready,
        "ready": f"{ready}/{len(wanted)}",
        "bytesFromOrigin": sum(int(e.get("bytesFromOrigin") or 0) for e in entries),
        "bytesFromPeers": sum(int(e.get("bytesFromPeers") or 0) for e in entries),
        "observedGeneration": preheat.generation,
    }


class PreheatWatcher(ListWatch):
    """Every ModelPreheat object in the cluster (there are few; each names one model)."""

    def __init__(
        self,
        settings: KubeSettings,
        api: KubeApi,
        on_preheat: Callable[[Preheat], None],
        on_gone: Callable[[str], None],
    ) -> None:
        super().__init__(settings, api)
        self._on_preheat = on_preheat
        self._on_gone = on_gone
        self._seen: dict[str, tuple[Any, ...]] = {}
        self.what = "modelpreheats"
        self.rbac_hint = "RBAC: the agent needs get/list/watch on modelpreheats (chart value preheat.enabled)"

    def query(self) -> Query:
        return Query("modelpreheats")

    def _known(self) -> list[str]:
        return list(self._seen)

    def _observe(self, obj: Mapping[str, Any]) -> str | None:
        uid = self._key(obj)
        if uid is None:
            return None
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            self._forget(uid)
            return None
        seen = (json.dumps(obj.get("spec"), sort_keys=True), meta.get("generation"))
        if self._seen.get(uid) == seen:
            return uid  # a status write (ours or another node's): nothing for this node to do
        self._seen[uid] = seen
        try:
            preheat = parse_preheat(obj)
        except AnnotationError as exc:
            log.warning("ModelPreheat %s ignored: %s", meta.get("name"), exc)
            self._on_gone(uid)
            return uid
        self._on_preheat(preheat)
        return uid

    def _forget(self, key: str) -> None:
        if self._seen.pop(key, None) is not None:
            self._on_gone(key)
