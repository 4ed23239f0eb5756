"""Models in OCI registries (`registries.*`): the prefixes the agents may read (`agent serve --registry`),
the registries spoken to over plain HTTP (`--oci-plain-http`), and the registry login: a
`kubernetes.io/dockerconfigjson` Secret mounted read-only as a file that `REGISTRY_AUTH_FILE` names, in the
agent container and nothing else. With the defaults nothing of it renders. The vLLM example that asks for
a registry model is checked against the chart and the agent's own parsers."""

from __future__ import annotations

import base64
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chartkit import (
    AGENT,
    CHART,
    CRD_GROUPS,
    TRACKER,
    VAP_API,
    container,
    env_of,
    flags,
    helm,
    mounts_of,
    notes,
    pod_spec,
    render,
    validate,
    volumes_of,
)
from tests.deploy.test_chart_buckets import agent_container, every_container, example_values, pod_specs

REGISTRY_EXAMPLE = CHART / "examples" / "vllm-registry-model.yaml"
AUTH_DIR = "/etc/weightswarm/registries"
SECRET = "registry-login"
ALLOW = ["oci://registry.example.com/models", "oci://registry.internal:5000"]
PLAIN = ["registry.internal:5000", "zot.registry.svc"]
VALUES = {"registries": {"allow": ALLOW, "plainHttp": PLAIN, "credentials": {"existingSecret": SECRET}}}


def module(name: str) -> Any:
    return importlib.import_module(name)


def test_with_defaults_nothing_registry_related_renders(chart: Any) -> None:
    objects = render(chart, {})
    assert chart.values["registries"] == {"allow": [], "plainHttp": [], "credentials": {"existingSecret": ""}}
    agent = agent_container(objects)
    assert "--registry" not in flags(agent) and "--oci-plain-http" not in flags(agent)
    assert "REGISTRY_AUTH_FILE" not in env_of(agent)
    assert "registry-credentials" not in volumes_of(pod_spec(objects, "DaemonSet", AGENT))
    text = json.dumps(list(objects.values()))
    assert "oci://" not in text and "dockerconfigjson" not in text and AUTH_DIR not in text
    assert "OCI registry" not in notes(chart, {})


def test_allow_and_plain_http_are_the_agents_arguments(chart: Any) -> None:
    objects = render(chart, VALUES)
    agent = agent_container(objects)
    assert flags(agent)["--registry"] == ALLOW
    assert flags(agent)["--oci-plain-http"] == [",".join(PLAIN)]
    # What `agent serve` makes of the rendered arguments, and what its settings make of those.
    serve = module("agent.cli.main").main.commands["serve"]
    params = serve.make_context("serve", list(agent["args"])).params
    assert params["registries"] == tuple(ALLOW)
    reference = module("agent.origin.oci.reference")
    assert reference.plain_http_hosts(params["oci_plain_http"]) == tuple(PLAIN)
    allowed = tuple(ALLOW)
    url = "oci://registry.example.com/models/llama-ft:v1"
    assert reference.allowed_registry(url, allowed) == url
    assert reference.allowed_registry("oci://registry.internal:5000/any/repo:t", allowed)
    errors = module("agent.core.errors")
    for refused in ("oci://registry.example.com/models-old/x:v1", "oci://registry.example.com/other:v1"):
        with pytest.raises(errors.ConfigError, match=r"registries\.allow"):
            reference.allowed_registry(refused, allowed)
    # Only the agent container, and arguments: agent.config cannot add to them.
    for key, spec in pod_specs(objects).items():
        for c in every_container(spec):
            if (key, c["name"]) != (("DaemonSet", AGENT), "agent"):
                assert "--registry" not in flags(c) and "--oci-plain-http" not in flags(c), (key, c["name"])
    for name in ("WEIGHTSWARM_REGISTRY", "WEIGHTSWARM_OCI_PLAIN_HTTP"):
        assert name not in objects[("ConfigMap", AGENT)]["data"]
        with pytest.raises(helm.HelmError, match=f"agent.config.{name}: list "):
            render(chart, {"agent": {"config": {name: "x"}}})


def test_the_dockerconfigjson_secret_is_a_read_only_file_of_the_agent_container_only(
    chart: Any, tmp_path: Path
) -> None:
    objects = render(chart, VALUES)
    spec = pod_spec(objects, "DaemonSet", AGENT)
    assert volumes_of(spec)["registry-credentials"] == {
        "name": "registry-credentials",
        "secret": {
            "secretName": SECRET,
            "defaultMode": 0o440,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
        },
    }
    agent = agent_container(objects)
    assert mounts_of(agent)["registry-credentials"] == {
        "name": "registry-credentials",
        "mountPath": AUTH_DIR,
        "readOnly": True,
    }
    auth_file = env_of(agent)["REGISTRY_AUTH_FILE"]
    assert auth_file == {"name": "REGISTRY_AUTH_FILE", "value": f"{AUTH_DIR}/config.json"}
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]  # 0440 needs the group
    # In no other container, volume or object; the tracker's pod is the default one; no envFrom of it.
    assert agent["envFrom"] == [{"configMapRef": {"name": AGENT}}]
    for key, pspec in pod_specs(objects).items():
        for c in every_container(pspec):
            if (key, c["name"]) != (("DaemonSet", AGENT), "agent"):
                assert "registry-credentials" not in mounts_of(c), (key, c["name"])
                assert "REGISTRY_AUTH_FILE" not in env_of(c), (key, c["name"])
    for key, obj in objects.items():
        if key != ("DaemonSet", AGENT):
            assert SECRET not in json.dumps(obj), key
    assert ("Secret", SECRET) not in objects
    assert pod_spec(objects, "Deployment", TRACKER) == pod_spec(render(chart, {}), "Deployment", TRACKER)

    # The agent reads the file the variable names, as `kubectl create secret docker-registry` writes it.
    settings = module("agent.core.settings")
    path = settings.default_oci_auth_file({"REGISTRY_AUTH_FILE": auth_file["value"]})
    assert str(path) == f"{AUTH_DIR}/config.json"
    written = tmp_path / "config.json"
    auth = base64.b64encode(b"robot$models:pa55").decode()
    written.write_text(json.dumps({"auths": {"registry.example.com": {
        "username": "robot$models", "password": "pa55", "auth": auth}}}))
    login = module("agent.origin.oci.auth").credentials_for("registry.example.com", written)
    assert (login.username, login.password) == ("robot$models", "pa55")


def test_notes_show_the_registry_request_and_flag_credentials_without_a_prefix(chart: Any) -> None:
    text = notes(chart, VALUES)
    assert 'weightswarm.io/models: "org/name=oci://registry.example.com/models/MODEL:TAG"' in text
    assert "agent wait org/name=oci://registry.example.com/models/MODEL:TAG" in text
    assert "examples/vllm-registry-model.yaml" in text
    assert "registries.allow is empty" not in text.replace("\n", " ")
    unused = notes(chart, {"registries": {"credentials": {"existingSecret": SECRET}}})
    assert "registries.allow is empty: the agents refuse every request" in unused.replace("\n", " ")


def test_registry_renders_are_valid_kubernetes(chart: Any) -> None:
    objects = render(chart, VALUES, api_versions=[VAP_API])
    checked = 0
    for obj in objects.values():
        if not obj["apiVersion"].startswith(CRD_GROUPS):
            validate(obj)
            checked += 1
    assert checked >= 6
    report = helm.lint(CHART, VALUES, strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 3] + report["errors"]
    assert not errors, errors


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"registries": {"allow": ["https://registry.example.com/models"]}}, "at '/registries/allow/0'"),
        ({"registries": {"allow": ["oci://registry.example.com/models:v1"]}}, "at '/registries/allow/0'"),
        ({"registries": {"allow": ["oci://registry.example.com/Models"]}}, "at '/registries/allow/0'"),
        ({"registries": {"allow": ["oci://r.example.com/m"] * 2}}, "at '/registries/allow'"),
        ({"registries": {"allow": "oci://r.example.com"}}, "at '/registries/allow'"),
        ({"registries": {"plainHttp": ["http://r:5000"]}}, "at '/registries/plainHttp/0'"),
        ({"registries": {"plainHttp": "r:5000"}}, "at '/registries/plainHttp'"),
        ({"registries": {"credentials": {"username": "u"}}}, "at '/registries/credentials'"),
        (
            {"registries": {"credentials": {"existingSecret": "Bad Name"}}},
            "at '/registries/credentials/existingSecret'",
        ),
        ({"registries": {"allowed": []}}, "at '/registries'"),
    ],
    ids=["https", "tag", "uppercase", "duplicate", "not-a-list", "plain-url", "plain-not-a-list",
         "clear-login", "secret-name", "unknown-key"],
)
def test_schema_rejects_wrong_registry_values(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, values)
    assert message in str(caught.value)


def test_the_agent_accepts_every_prefix_the_schema_accepts(chart: Any) -> None:
    reference = module("agent.origin.oci.reference")
    for entry in ("oci://registry.example.com", "oci://r:5000/a/b-c_d.e/", "oci://ghcr.io/acme"):
        render(chart, {"registries": {"allow": [entry]}})
        reference.allowed_prefix(entry)


def test_registry_example_is_valid_and_asks_the_agent_for_an_allowed_repository(chart: Any) -> None:
    (deployment,) = [d for d in yaml.safe_load_all(REGISTRY_EXAMPLE.read_text()) if d]
    validate(deployment)
    template = deployment["spec"]["template"]
    annotation = template["metadata"]["annotations"]["weightswarm.io/models"]
    source = "oci://registry.example.com/models/llama-ft:v1"
    assert annotation == f"acme/llama-ft={source}"
    requests = module("agent.kube.requests")
    (ref,) = requests.parse_models_annotation(annotation)
    assert (ref.repo_id, ref.revision, ref.source) == ("acme/llama-ft", "v1", source)
    spec = template["spec"]
    (wait,) = spec["initContainers"]
    assert wait["command"][:3] == ["agent", "wait", annotation]
    assert requests.parse_model_ref(wait["command"][2]) == ref
    # The values the example names allow it and mount a login; the chart's defaults refuse it.
    values = example_values(REGISTRY_EXAMPLE)
    rendered = render(chart, values, "weightswarm", "weightswarm")
    agent_spec = pod_spec(rendered, "DaemonSet", "weightswarm-agent")
    agent = container(agent_spec, "agent")
    reference = module("agent.origin.oci.reference")
    assert reference.allowed_registry(ref.source, tuple(flags(agent)["--registry"])) == ref.source
    assert "REGISTRY_AUTH_FILE" in env_of(agent)
    with pytest.raises(module("agent.core.errors").ConfigError):
        reference.allowed_registry(ref.source, tuple(chart.values["registries"]["allow"]))
    (pods_socket,) = flags(agent)["--pods-socket"]
    socket = f"unix://{pods_socket}"
    assert wait["command"][3:] == ["--timeout", "3600", "--agent", socket, "--cache-dir", "/models"]
    volumes, chart_volumes = volumes_of(spec), volumes_of(agent_spec)
    assert volumes["weightswarm-run"]["hostPath"]["path"] == chart_volumes["run"]["hostPath"]["path"]
    assert volumes["models"]["hostPath"]["path"] == chart_volumes["hub"]["hostPath"]["path"]
    # The workload holds no login: the registry is read with the node's.
    for c in every_container(spec):
        assert "envFrom" not in c
        assert not {"REGISTRY_AUTH_FILE", "DOCKER_CONFIG"} & set(env_of(c)), c["name"]
    assert not [v for v in spec["volumes"] if "secret" in v]
    vllm = container(spec, "vllm")
    assert vllm["image"] == "vllm/vllm-openai:v0.33.0"
    assert wait["image"] == "registry.example.com/weightswarm:0.1.0"
    assert vllm["command"] == ["vllm", "serve", ref.repo_id]
    assert {e["name"]: e["value"] for e in vllm["env"]} == {"HF_HUB_CACHE": "/models", "HF_HUB_OFFLINE": "1"}
    # It prefers nodes whose agent labelled them as holding this tag of the model.
    (term,) = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    key = module("agent.kube.labels").model_label_key(ref.key)
    assert term["preference"] == {"matchExpressions": [{"key": key, "operator": "Exists"}]}
