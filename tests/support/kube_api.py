"""What the Kubernetes API server means by the parts of a request tests.support.fake_kube serves: the
resources it knows and their objects, patches and the update strategy that keeps part of them, `Status`
errors, selectors, and the watch event a change is for a filtered watch.

Selectors: `fieldSelector` (`=`, `==`, `!=`, comma = AND; metadata.name and metadata.namespace
everywhere, spec.nodeName and status.phase for pods, spec.unschedulable for nodes; another field is a
400, as on a real server) and `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
`k notin (a,b)`, comma = AND; `!=`/`notin` match objects without the label).

PATCH content types: application/merge-patch+json and application/json-patch+json (RFC 6902)
everywhere, application/strategic-merge-patch+json for pods and nodes only (treated as a merge
patch: right for maps such as labels and annotations, not for lists with merge keys); a custom
resource refuses strategic merge with 415, as a real server does. In the patched object
`metadata.uid` and `metadata.resourceVersion` are preconditions (409 Conflict Status with the real
server's message); null or absent means unconditional. For nodes and modelpreheats a patch (or a
test control) that changes nothing is a no-op, as on a real server: same resourceVersion, no event.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

PREHEAT_GROUP = "weightswarm.io"
PREHEAT_VERSION = "v1alpha1"
PREHEAT_PLURAL = "modelpreheats"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also what strategic merge does for maps like annotations)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class PatchError(ValueError):
    """A JSON patch that cannot be applied (bad operation, missing path, failed test)."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]] if path else []


def _index(container: list[Any], token: str, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_add):
        raise PatchError(f"array index {index} out of bounds")
    return index


def _resolve(doc: Any, path: list[str]) -> Any:
    for token in path:
        if isinstance(doc, dict):
            if token not in doc:
                raise PatchError(f"missing key {token!r}")
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_index(doc, token, for_add=False)]
        else:
            raise PatchError(f"cannot descend into {type(doc).__name__} at {token!r}")
    return doc


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _resolve(doc, path[:-1])
    if isinstance(parent, dict):
        parent[path[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, path[-1], for_add=True), value)
    else:
        raise PatchError(f"cannot add to {type(parent).__name__}")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, path[:-1])
    if isinstance(parent, dict):
        if path[-1] not in parent:
            raise PatchError(f"missing key {path[-1]!r}")
        del parent[path[-1]]
    elif isinstance(parent, list):
        del parent[_index(parent, path[-1], for_add=False)]
    else:
        raise PatchError(f"cannot remove from {type(parent).__name__}")
    return doc


def json_patch(target: Any, operations: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); raises PatchError."""
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op:
            raise PatchError(f"invalid operation {op!r}")
        name, path = op.get("op"), _pointer(op["path"])
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {name!r} needs a value")
        if name == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif name == "remove":
            doc = _remove(doc, path)
        elif name == "replace":
            _resolve(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op["value"])) if path else op["value"]
        elif name in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = copy.deepcopy(_resolve(doc, source))
            if name == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        elif name == "test":
            if _resolve(doc, path) != op["value"]:
                raise PatchError(f"testing value {op['path']} failed")
        else:
            raise PatchError(f"unknown operation {name!r}")
    return doc


def status_object(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = dict(details)
    return status


@dataclass(frozen=True)
class Resource:
    """How the fake serves one kind of object."""

    plural: str
    kind: str
    group: str  # "" for the core group
    version: str
    namespaced: bool
    field_labels: frozenset[str]
    custom: bool = False  # a CRD: no strategic merge patch; metadata.generation
    status_subresource: bool = False  # main PATCH keeps .status; PATCH .../status changes only .status
    strict_updates: bool = True  # a no-op patch keeps the resourceVersion and emits nothing

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str) -> dict[str, Any]:
        return {"name": name, **({"group": self.group} if self.group else {}), "kind": self.plural}

    def patch_types(self) -> tuple[str, ...]:
        if self.custom:
            return (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)
        return (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)


_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
PODS = Resource(
    "pods",
    "Pod",
    "",
    "v1",
    namespaced=True,
    field_labels=_META_FIELDS | {"spec.nodeName", "status.phase"},
    strict_updates=False,  # as before this store was generic: every PATCH bumps the resourceVersion
)
NODES = Resource(
    "nodes",
    "Node",
    "",
    "v1",
    namespaced=False,
    field_labels=_META_FIELDS | {"spec.unschedulable"},
    status_subresource=True,
)
PREHEATS = Resource(
    PREHEAT_PLURAL,
    "ModelPreheat",
    PREHEAT_GROUP,
    PREHEAT_VERSION,
    namespaced=False,
    field_labels=_META_FIELDS,
    custom=True,
    status_subresource=True,
)
RESOURCES = {(r.group, r.version, r.plural): r for r in (PODS, NODES, PREHEATS)}


class SelectorError(ValueError):
    pass


Predicate = Callable[[Mapping[str, Any]], bool]

_LABEL_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_EXISTS = re.compile(rf"^(!?)\s*({_LABEL_KEY})$")
_EQUALITY = re.compile(rf"^({_LABEL_KEY})\s*(==|=|!=)\s*({_LABEL_VALUE})$")
_SET = re.compile(rf"^({_LABEL_KEY})\s+(in|notin)\s*\(([^()]*)\)$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    terms.append(current.strip())
    return terms


def label_selector(selector: str) -> Predicate:
    """The equality- and set-based label selector syntax; raises SelectorError.

    Each term becomes a requirement as in the apiserver: `k=v` is `k in (v)`, `k!=v` is `k notin (v)`
    (true without the label), `k` is exists and `!k` does-not-exist.
    """
    requirements: list[tuple[str, str, frozenset[str]]] = []
    for term in _split_terms(selector) if selector.strip() else []:
        if m := _EXISTS.match(term):
            requirements.append((m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
        elif m := _EQUALITY.match(term):
            key, op, value = m.groups()
            requirements.append((key, "notin" if op == "!=" else "in", frozenset({value})))
        elif m := _SET.match(term):
            key, op, raw = m.groups()
            values = frozenset(v.strip() for v in raw.split(","))
            if not all(re.fullmatch(_LABEL_VALUE, v) for v in values):
                raise SelectorError(f"unable to parse requirement: invalid value in {term!r}")
            requirements.append((key, op, values))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        for key, op, values in requirements:
            ok = {
                "exists": key in labels,
                "!exists": key not in labels,
                "in": key in labels and labels[key] in values,
                "notin": key not in labels or labels[key] not in values,
            }[op]
            if not ok:
                return False
        return True

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_selector(selector: str, resource: Resource) -> Predicate:
    """`field=value`, `field==value`, `field!=value`, comma = AND; raises SelectorError."""
    checks: list[tuple[str, bool, str]] = []
    for term in [t.strip() for t in selector.split(",")] if selector.strip() else []:
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", term)
        if not m:
            raise SelectorError(f"invalid field selector: {term!r}")
        label, op, value = m.groups()
        if label not in resource.field_labels:
            raise SelectorError(f"field label not supported: {label}")
        checks.append((label, op == "!=", value))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, label) == value) != negate for label, negate, value in checks)

    return matches


_CREATED_AT = "2024-01-01T00:00:00Z"


def pod_object(
    name: str,
    namespace: str,
    node: str | None,
    annotations: Mapping[str, str] | None,
    phase: str,
    uid: str | None,
) -> dict[str, Any]:
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "annotations": dict(annotations or {}),
            "creationTimestamp": _CREATED_AT,
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "vllm/vllm-openai"}]},
        "status": {"phase": phase},
    }
    return pod


def node_object(name: str, labels: Mapping[str, str] | None) -> dict[str, Any]:
    node = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "labels": dict(labels or {}),
            "creationTimestamp": _CREATED_AT,
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    return node


def preheat_object(name: str, model: str, node_selector: Mapping[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": model}
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    preheat = {
        "apiVersion": PREHEATS.api_version,
        "kind": PREHEATS.kind,
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "generation": 1,
            "creationTimestamp": _CREATED_AT,
        },
        "spec": spec,
    }
    return preheat


class Change(NamedTuple):
    rv: int
    resource: str  # the plural, e.g. "pods"
    type: str  # ADDED / MODIFIED / DELETED
    obj: dict[str, Any]  # the object after the change (for DELETED: the last state, at the new rv)
    prev: dict[str, Any] | None  # the object before the change (None for ADDED)


def watch_event(change: Change, matches: Predicate) -> dict[str, Any] | None:
    """The watch event a change is for a watcher with this filter, as the apiserver's watch cache
    makes it: an object entering the selection is ADDED, one leaving it DELETED (its previous state
    at the new resourceVersion)."""
    now = change.type != "DELETED" and matches(change.obj)
    before = change.prev is not None and matches(change.prev)
    if now:
        return {"type": "MODIFIED" if before else "ADDED", "object": copy.deepcopy(change.obj)}
    if before:
        assert change.prev is not None
        gone = copy.deepcopy(change.prev)
        gone["metadata"]["resourceVersion"] = str(change.rv)
        return {"type": "DELETED", "object": gone}
    return None


class ApiError(Exception):
    """A request the API server refuses: its HTTP code and the `Status` object it answers with."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status_object(code, reason, message, details)


def patch_object(
    resource: Resource, current: dict[str, Any], content_type: str, raw: bytes
) -> tuple[str, Any, dict[str, Any]]:
    """(the media type, the patch, the patched object) of a PATCH of `current`, as the API server takes it:
    its content type, its body and the preconditions in the patched metadata checked. Raises ApiError
    with the server's answer to one it refuses."""
    kind = content_type.split(";")[0].strip().lower()
    if kind not in resource.patch_types() or kind == APPLY_PATCH:
        accepted = ", ".join(resource.patch_types())
        message = (
            f"the body of the request was in an unknown format - accepted media types include: {accepted}"
        )
        if kind == APPLY_PATCH:
            message = "server-side apply (application/apply-patch+yaml) is not implemented by this fake"
        raise ApiError(415, "UnsupportedMediaType", message)
    try:
        patch = json.loads(raw)
    except ValueError:
        raise ApiError(400, "BadRequest", "patch body is not JSON") from None
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
        try:
            patched = json_patch(current, patch)
        except PatchError as e:
            raise ApiError(422, "Invalid", f"the server rejected our request: {e}") from None
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise ApiError(422, "Invalid", "the patched object is not an object with metadata")
    else:
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "patch body is not an object")
        patched = merge_patch(current, patch)
    meta, name = patched.get("metadata") or {}, current["metadata"]["name"]
    uid = meta.get("uid")
    if uid is not None and uid != current["metadata"]["uid"]:
        if resource is PODS:
            message = "Precondition failed: UID in precondition does not match"
        else:
            message = (
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                + (current["metadata"]["uid"])
            )
        raise ApiError(409, "Conflict", message, resource.details(name))
    rv = meta.get("resourceVersion")
    if rv is not None and str(rv) != current["metadata"]["resourceVersion"]:
        message = (
            f'Operation cannot be fulfilled on {resource.qualified} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        )
        raise ApiError(409, "Conflict", message, resource.details(name))
    return kind, patch, patched


def update_strategy(
    resource: Resource, current: Mapping[str, Any], patched: dict[str, Any], subresource: str | None
) -> dict[str, Any]:
    """What the apiserver's update strategy keeps of a patched object."""
    if subresource == "status":
        new = copy.deepcopy(dict(current))
        if "status" in patched:
            new["status"] = patched["status"]
        else:
            new.pop("status", None)
        return new
    new = dict(patched)
    new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
    meta = new["metadata"] = dict(patched.get("metadata") or {})
    for name in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion"):
        if name in current["metadata"]:
            meta[name] = current["metadata"][name]
        else:
            meta.pop(name, None)
    if resource.status_subresource:
        if "status" in current:
            new["status"] = copy.deepcopy(current["status"])
        else:
            new.pop("status", None)
    if resource.custom:

        def content(obj: Mapping[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in obj.items() if k != "metadata"}

        if content(new) != content(current):
            meta["generation"] = int(current["metadata"].get("generation") or 0) + 1
    return new
