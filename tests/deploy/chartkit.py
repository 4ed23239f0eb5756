"""Rendering the Helm chart for the deploy tests: Helm's own engine (helm-python-sdk: Helm v4
through libhelm_c), offline, so `lookup` returns nothing, exactly as `helm template` does.

`render(..., api_versions=...)` is `helm template --api-versions`: what the cluster would serve,
for templates that check `.Capabilities.APIVersions` (the ValidatingAdmissionPolicy).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.procs import require_module

_PIP = "pip install -e '.[dev]' (./dev does)"
helm = require_module("helm_python", f"helm-python-sdk: {_PIP}")
kv = require_module("kubernetes_validate.utils", f"kubernetes-validate: {_PIP}")

CHART = Path(__file__).resolve().parents[2] / "charts" / "weightswarm"
EXAMPLE = CHART / "examples" / "vllm-deployment.yaml"
# A recent release that kubernetes-validate ships strict schemas for; above the chart's kubeVersion floor.
K8S_VERSION = "1.34.0"
# Custom resources kubernetes-validate has no schema for: skipped on purpose, checked by field.
CRD_GROUPS = ("monitoring.coreos.com/",)
RELEASE, NAMESPACE = "ws", "weightswarm"
AGENT, TRACKER = "ws-weightswarm-agent", "ws-weightswarm-tracker"
AGENT_SA_USER = f"system:serviceaccount:{NAMESPACE}:{AGENT}"
# What Helm's Capabilities.APIVersions holds for a cluster serving ValidatingAdmissionPolicy v1 (1.30+).
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
VAP_NAME = f"{AGENT}-pod-status"
CREDENTIALS_DIR = "/etc/weightswarm/credentials"

Objects = dict[tuple[str, str], dict[str, Any]]

IMAGE = "registry.example.com/weightswarm"
"""The image every render names unless a test says otherwise: the chart has no default (none is published),
and the README's and the examples' reference is this one."""


def with_image(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with `image.repository` set to `IMAGE` where the test left it out."""
    image = values.get("image", {})
    if "repository" in image:
        return values
    return {**values, "image": {**image, "repository": IMAGE}}


def render_text(
    chart: Any,
    values: dict[str, Any],
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: Sequence[str] = (),
) -> dict[str, str]:
    values = with_image(values)
    if not api_versions:
        return dict(chart.render(values, name=release, namespace=namespace, is_install=True))
    # Chart.render does not forward api_versions, but the native call it wraps takes them (the same
    # options struct as `helm template --api-versions`); errors map to the same HelmError classes.
    native = importlib.import_module("helm_python._native")
    opts = {"name": release, "namespace": namespace, "is_install": True, "api_versions": list(api_versions)}
    rendered = native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
    return dict(json.loads(rendered))


def render(
    chart: Any,
    values: dict[str, Any],
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: Sequence[str] = (),
) -> Objects:
    """Rendered objects keyed by (kind, name); NOTES.txt left out."""
    objects: Objects = {}
    for path, text in render_text(chart, values, release, namespace, api_versions).items():
        if path.endswith("NOTES.txt"):
            continue
        for obj in yaml.safe_load_all(text):
            if obj:
                key = (obj["kind"], obj["metadata"]["name"])
                assert key not in objects, f"duplicate object {key}"
                objects[key] = obj
    return objects


def all_text(chart: Any, values: dict[str, Any]) -> str:
    return "\n".join(render_text(chart, values).values())


def notes(chart: Any, values: dict[str, Any], api_versions: Sequence[str] = ()) -> str:
    rendered = render_text(chart, values, api_versions=api_versions)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def pod_spec(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    return objects[(kind, name)]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(spec: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    items = spec["initContainers" if init else "containers"]
    return next(c for c in items if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def flags(c: dict[str, Any]) -> dict[str, list[str]]:
    """`--name=value` arguments of a container (command and args) as name -> values."""
    found: dict[str, list[str]] = {}
    for arg in [*c.get("command", []), *c.get("args", [])]:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            found.setdefault(name, []).append(value)
    return found


def volumes_of(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in spec["volumes"]}


def mounts_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def validate(obj: dict[str, Any]) -> None:
    """Strict Kubernetes schema validation; fails the test with the path of the wrong field."""
    try:
        kv.validate(obj, K8S_VERSION, strict=True)
    except kv.ValidationError as exc:
        name = obj.get("metadata", {}).get("name")
        pytest.fail(f"{obj.get('kind')}/{name}: {'.'.join(map(str, exc.path))}: {exc.message}")
