"""Models in object storage (`buckets.*`): the prefixes the agents may read (`agent serve --bucket`)
and their cloud credentials, which reach the agent container and nothing else: not the tracker,
not the chown init container, not another object. With the defaults nothing of it renders. The
vLLM example that asks for a bucket model is checked against the chart and the agent's own parsers.
"""

from __future__ import annotations

import importlib
import json
import re
import textwrap
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
    Objects,
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

BUCKET_EXAMPLE = CHART / "examples" / "vllm-bucket-model.yaml"
BUCKETS_DIR = "/etc/weightswarm/buckets"
ENV_SECRET, FILES_SECRET = "bucket-credentials", "gcs-key"
ALLOW = ["s3://models/llama-ft", "gs://acme-models/team-a", "az://weights/prod/"]
STATIC = {
    "buckets": {
        "allow": ALLOW,
        "credentials": {"existingSecret": ENV_SECRET, "filesSecret": FILES_SECRET},
        "env": {
            "AWS_REGION": "eu-west-1",
            "AWS_ENDPOINT_URL": "http://minio.storage.svc:9000",
            "AWS_ALLOW_HTTP": True,
            "GOOGLE_APPLICATION_CREDENTIALS": f"{BUCKETS_DIR}/key.json",
        },
    }
}
ROLE_ARN = "arn:aws:iam::123456789012:role/ws-models"
WORKLOAD_IDENTITY = {
    "buckets": {"allow": ["s3://models"], "env": {"AZURE_STORAGE_ACCOUNT_NAME": "acme"}},
    "serviceAccount": {
        "annotations": {
            "eks.amazonaws.com/role-arn": ROLE_ARN,
            "iam.gke.io/gcp-service-account": "ws-models@acme.iam.gserviceaccount.com",
            "azure.workload.identity/client-id": "00000000-0000-0000-0000-000000000000",
        }
    },
    "agent": {"podLabels": {"azure.workload.identity/use": "true"}},
}
CLOUD_ENV = re.compile(r"^(AWS|GOOGLE|AZURE)_")


def agent_container(objects: Objects) -> dict[str, Any]:
    return container(pod_spec(objects, "DaemonSet", AGENT), "agent")


def pod_specs(objects: Objects) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        key: obj["spec"]["template"]["spec"]
        for key, obj in objects.items()
        if "template" in obj.get("spec", {})
    }


def every_container(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def module(name: str) -> Any:
    return importlib.import_module(name)


# --- defaults ----------------------------------------------------------------------------------


def test_with_defaults_nothing_bucket_related_renders(chart: Any) -> None:
    objects = render(chart, {})
    assert chart.values["buckets"] == {
        "allow": [],
        "credentials": {"existingSecret": "", "filesSecret": ""},
        "env": {},
    }
    agent = agent_container(objects)
    assert "--bucket" not in flags(agent)
    assert agent["envFrom"] == [{"configMapRef": {"name": AGENT}}]
    assert "WEIGHTSWARM_BUCKET" not in objects[("ConfigMap", AGENT)]["data"]
    for spec in pod_specs(objects).values():
        assert "bucket-credentials" not in volumes_of(spec)
        for c in every_container(spec):
            assert not [e for e in c.get("envFrom", []) if "secretRef" in e]
            assert not [name for name in env_of(c) if CLOUD_ENV.match(name)]
    # Not a field, a volume, a variable or an argument anywhere (the templates' comments may say why).
    assert "bucket" not in json.dumps(list(objects.values())).lower()
    assert "object storage" not in notes(chart, {})
    assert "annotations" not in objects[("ServiceAccount", AGENT)]["metadata"]


# --- buckets.allow -----------------------------------------------------------------------------


def test_allow_gives_the_agent_one_bucket_argument_per_entry(chart: Any) -> None:
    objects = render(chart, {"buckets": {"allow": ALLOW}})
    agent = agent_container(objects)
    assert flags(agent)["--bucket"] == ALLOW
    # What `agent serve` itself makes of the rendered arguments: its `buckets` option, in order.
    serve = module("agent.cli.main").main.commands["serve"]
    assert serve.make_context("serve", list(agent["args"])).params["buckets"] == tuple(ALLOW)
    # Each is a bucket URL the agent accepts at start, and allows what is under it, by whole segments.
    bucket = module("agent.origin.bucket_url")
    for url in ALLOW:
        bucket.split_bucket_url(url)
    assert bucket.allowed_bucket("s3://models/llama-ft/v2", tuple(ALLOW)) == "s3://models/llama-ft/v2"
    with pytest.raises(module("agent.core.errors").ConfigError, match=r"buckets\.allow"):
        bucket.allowed_bucket("s3://models/llama-ftx", tuple(ALLOW))
    # Arguments, not the ConfigMap (agent.config cannot add to them), and only in the agent container.
    assert "WEIGHTSWARM_BUCKET" not in objects[("ConfigMap", AGENT)]["data"]
    for key, spec in pod_specs(objects).items():
        for c in every_container(spec):
            if (key, c["name"]) != (("DaemonSet", AGENT), "agent"):
                assert "--bucket" not in flags(c), (key, c["name"])
    # A change of the list changes the pod template, so the agents roll.
    assert (
        render(chart, {"buckets": {"allow": ALLOW[:1]}})[("DaemonSet", AGENT)]["spec"]["template"]
        != (objects[("DaemonSet", AGENT)]["spec"]["template"])
    )


def test_agent_config_cannot_set_the_bucket_list(chart: Any) -> None:
    with pytest.raises(
        helm.HelmError, match=r"agent.config.WEIGHTSWARM_BUCKET: list bucket prefixes in buckets.allow"
    ):
        render(chart, {"agent": {"config": {"WEIGHTSWARM_BUCKET": "s3://anything"}}})


# --- credentials -------------------------------------------------------------------------------


def test_existing_secret_is_env_from_of_the_agent_container_only(chart: Any) -> None:
    objects = render(chart, STATIC)
    agent = agent_container(objects)
    # First: for a key in both, the later source (the chart's ConfigMap) wins.
    assert agent["envFrom"] == [{"secretRef": {"name": ENV_SECRET}}, {"configMapRef": {"name": AGENT}}]
    for key, spec in pod_specs(objects).items():
        for c in every_container(spec):
            if (key, c["name"]) == (("DaemonSet", AGENT), "agent"):
                continue
            assert not [e for e in c.get("envFrom", []) if "secretRef" in e], (key, c["name"])
            assert not [n for n in env_of(c) if CLOUD_ENV.match(n)], (key, c["name"])
    # The chart never makes the Secret, and no other object names it (RBAC, the tracker, policies).
    assert ("Secret", ENV_SECRET) not in objects and ("Secret", FILES_SECRET) not in objects
    for key, obj in objects.items():
        if key != ("DaemonSet", AGENT):
            text = json.dumps(obj)
            assert ENV_SECRET not in text and FILES_SECRET not in text, key
    tracker = pod_spec(objects, "Deployment", TRACKER)
    assert tracker == pod_spec(render(chart, {}), "Deployment", TRACKER)


def test_files_secret_is_mounted_read_only_in_the_agent_container_only(chart: Any) -> None:
    objects = render(chart, STATIC)
    spec = pod_spec(objects, "DaemonSet", AGENT)
    assert volumes_of(spec)["bucket-credentials"] == {
        "name": "bucket-credentials",
        "secret": {"secretName": FILES_SECRET, "defaultMode": 0o440},
    }
    agent = agent_container(objects)
    assert mounts_of(agent)["bucket-credentials"] == {
        "name": "bucket-credentials",
        "mountPath": BUCKETS_DIR,
        "readOnly": True,
    }
    # 0440 files need the agent's group: fsGroup is its runAsGroup.
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    assert env_of(agent)["GOOGLE_APPLICATION_CREDENTIALS"]["value"].startswith(BUCKETS_DIR + "/")
    assert "bucket-credentials" not in mounts_of(container(spec, "chown-hostpath", init=True))
    assert "bucket-credentials" not in volumes_of(pod_spec(objects, "Deployment", TRACKER))


def test_env_is_plain_variables_of_the_agent_container(chart: Any) -> None:
    objects = render(chart, STATIC)
    env = env_of(agent_container(objects))
    assert {name: env[name] for name in STATIC["buckets"]["env"]} == {
        "AWS_REGION": {"name": "AWS_REGION", "value": "eu-west-1"},
        "AWS_ENDPOINT_URL": {"name": "AWS_ENDPOINT_URL", "value": "http://minio.storage.svc:9000"},
        "AWS_ALLOW_HTTP": {"name": "AWS_ALLOW_HTTP", "value": "true"},
        "GOOGLE_APPLICATION_CREDENTIALS": {
            "name": "GOOGLE_APPLICATION_CREDENTIALS",
            "value": f"{BUCKETS_DIR}/key.json",
        },
    }
    # The chart's own variables are still there, once each.
    names = [e["name"] for e in agent_container(objects)["env"]]
    assert len(names) == len(set(names))
    assert {"NODE_NAME", "POD_IP", "WEIGHTSWARM_NODE_NAME", "WEIGHTSWARM_AGENT"} <= set(names)
    assert not [
        n
        for n in env_of(container(pod_spec(objects, "Deployment", TRACKER), "tracker"))
        if CLOUD_ENV.match(n)
    ]


def test_workload_identity_annotates_the_agents_service_account_and_labels_its_pods_only(chart: Any) -> None:
    objects = render(chart, WORKLOAD_IDENTITY)
    annotations = WORKLOAD_IDENTITY["serviceAccount"]["annotations"]
    assert objects[("ServiceAccount", AGENT)]["metadata"]["annotations"] == annotations
    assert "annotations" not in objects[("ServiceAccount", TRACKER)]["metadata"]
    assert pod_spec(objects, "DaemonSet", AGENT)["serviceAccountName"] == AGENT
    agent_labels = objects[("DaemonSet", AGENT)]["spec"]["template"]["metadata"]["labels"]
    assert agent_labels["azure.workload.identity/use"] == "true"
    tracker_labels = objects[("Deployment", TRACKER)]["spec"]["template"]["metadata"]["labels"]
    assert "azure.workload.identity/use" not in tracker_labels
    # No Secret at all: the identity comes from the token files and metadata servers.
    agent = agent_container(objects)
    assert agent["envFrom"] == [{"configMapRef": {"name": AGENT}}]
    assert env_of(agent)["AZURE_STORAGE_ACCOUNT_NAME"]["value"] == "acme"
    assert "bucket-credentials" not in volumes_of(pod_spec(objects, "DaemonSet", AGENT))


def test_a_key_in_clear_in_env_renders_but_stays_in_the_agent_and_the_notes_warn(chart: Any) -> None:
    """The chart cannot know every provider's variable names, so it does not refuse one; it keeps
    it where buckets.env goes (the agent container) and says what to use instead."""
    leaked = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    values = {
        "buckets": {
            "allow": ["s3://models"],
            "env": {"AWS_ACCESS_KEY_ID": "AKIA0", "AWS_SECRET_ACCESS_KEY": leaked},
        }
    }
    objects = render(chart, values)
    assert env_of(agent_container(objects))["AWS_SECRET_ACCESS_KEY"]["value"] == leaked
    for key, obj in objects.items():
        if key != ("DaemonSet", AGENT):
            assert leaked not in json.dumps(obj), key
    text = notes(chart, values)
    assert "WARNING: buckets.env holds AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in text
    assert "buckets.credentials.existingSecret" in text and leaked not in text
    for name in (
        "AWS_SESSION_TOKEN",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_CLIENT_SECRET",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
    ):
        assert f"holds {name}" in notes(chart, {"buckets": {"env": {name: "x"}}}), name
    assert "WARNING" not in notes(chart, STATIC)  # settings and file paths are not credentials
    readme = (CHART / "README.md").read_text()
    section = readme[readme.index("## Models in object storage") :]
    section = section[: section.index("\n## ")]
    assert "**Never put a key, secret or token in `buckets.env`**" in section
    assert "buckets.credentials.existingSecret" in section


def test_notes_show_the_bucket_request_and_flag_credentials_without_a_prefix(chart: Any) -> None:
    text = notes(chart, {"buckets": {"allow": ALLOW}})
    assert 'weightswarm.io/models: "org/name=s3://models/llama-ft"' in text
    assert "agent wait org/name=s3://models/llama-ft" in text
    assert "examples/vllm-bucket-model.yaml" in text
    unused = notes(chart, {"buckets": {"credentials": {"existingSecret": ENV_SECRET}}})
    assert "buckets.allow is\nempty: the agents refuse every request" in unused
    assert "buckets.allow is" not in text


# --- Kubernetes validity and the schema --------------------------------------------------------


@pytest.mark.parametrize(
    "values", [STATIC, WORKLOAD_IDENTITY], ids=["static-credentials", "workload-identity"]
)
def test_bucket_renders_are_valid_kubernetes(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values, api_versions=[VAP_API])
    checked = 0
    for obj in objects.values():
        if not obj["apiVersion"].startswith(CRD_GROUPS):
            validate(obj)
            checked += 1
    assert checked >= 6
    report = helm.lint(CHART, values, strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 3] + report["errors"]
    assert not errors, errors


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"buckets": {"allow": ["https://x"]}}, "at '/buckets/allow/0'"),
        ({"buckets": {"allow": ["s3://"]}}, "at '/buckets/allow/0'"),
        ({"buckets": {"allow": ["s3://b/p?versionId=1"]}}, "at '/buckets/allow/0'"),
        ({"buckets": {"allow": ["s3://b/a b"]}}, "at '/buckets/allow/0'"),
        ({"buckets": {"allow": ["/srv/models"]}}, "at '/buckets/allow/0'"),
        ({"buckets": {"allow": "s3://b"}}, "at '/buckets/allow'"),
        ({"buckets": {"allow": ["s3://b", "s3://b"]}}, "at '/buckets/allow'"),
        ({"buckets": {"allowed": ["s3://b"]}}, "at '/buckets'"),
        ({"buckets": {"credentials": {"accessKeyId": "AKIA0"}}}, "at '/buckets/credentials'"),
        (
            {"buckets": {"credentials": {"existingSecret": "Bad Name"}}},
            "at '/buckets/credentials/existingSecret'",
        ),
        ({"buckets": {"credentials": {"filesSecret": "a/b"}}}, "at '/buckets/credentials/filesSecret'"),
        ({"buckets": {"env": [{"name": "AWS_REGION", "value": "x"}]}}, "at '/buckets/env'"),
        ({"buckets": {"env": {"AWS_REGION": {"value": "x"}}}}, "at '/buckets/env/AWS_REGION'"),
        ({"buckets": {"env": {"aws_region": "x"}}}, "invalid propertyName 'aws_region'"),
        ({"buckets": {"env": {"HF_TOKEN": "x"}}}, "invalid propertyName 'HF_TOKEN'"),
        ({"buckets": {"env": {"WEIGHTSWARM_BUCKET": "s3://x"}}}, "invalid propertyName 'WEIGHTSWARM_BUCKET'"),
        ({"buckets": {"env": {"POD_IP": "1.2.3.4"}}}, "invalid propertyName 'POD_IP'"),
    ],
    ids=[
        "https-url",
        "no-bucket",
        "query",
        "whitespace",
        "path",
        "not-a-list",
        "duplicate",
        "unknown-key",
        "clear-credential-key",
        "secret-name",
        "files-secret-name",
        "env-list",
        "env-object-value",
        "env-lower-case",
        "env-hf",
        "env-weightswarm",
        "env-downward-api",
    ],
)
def test_schema_rejects_wrong_bucket_values(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, values)
    assert message in str(caught.value)


# --- the example -------------------------------------------------------------------------------


def example_values(path: Path) -> dict[str, Any]:
    """The chart values the example's header comment shows (its first indented `#   ` block)."""
    block: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("#   "):
            block.append(line[1:])
        elif block:
            break
    return yaml.safe_load(textwrap.dedent("\n".join(block)))  # type: ignore[no-any-return]


def test_bucket_example_is_valid_and_asks_the_agent_for_an_allowed_prefix(chart: Any) -> None:
    (deployment,) = [d for d in yaml.safe_load_all(BUCKET_EXAMPLE.read_text()) if d]
    validate(deployment)
    template = deployment["spec"]["template"]
    annotation = template["metadata"]["annotations"]["weightswarm.io/models"]
    assert annotation == "acme/llama-ft=s3://models/llama-ft"
    (ref,) = module("agent.kube.requests").parse_models_annotation(annotation)
    assert (ref.repo_id, ref.revision, ref.source) == ("acme/llama-ft", "main", "s3://models/llama-ft")
    spec = template["spec"]
    (wait,) = spec["initContainers"]
    assert wait["command"][:3] == ["agent", "wait", "acme/llama-ft=s3://models/llama-ft"]
    assert module("agent.kube.requests").parse_model_ref(wait["command"][2]) == ref
    # The values the example names allow it; the chart's defaults refuse it.
    values = example_values(BUCKET_EXAMPLE)
    agent_spec = pod_spec(
        render(chart, values, "weightswarm", "weightswarm"), "DaemonSet", "weightswarm-agent"
    )
    agent = container(agent_spec, "agent")
    allowed = tuple(flags(agent)["--bucket"])
    bucket = module("agent.origin.bucket_url")
    assert bucket.allowed_bucket(ref.source, allowed) == ref.source
    with pytest.raises(module("agent.core.errors").ConfigError):
        bucket.allowed_bucket(ref.source, tuple(chart.values["buckets"]["allow"]))
    # The agent's pods' socket and hub, as in the Hub example.
    (pods_socket,) = flags(agent)["--pods-socket"]
    assert wait["command"][3:] == [
        "--timeout",
        "3600",
        "--agent",
        f"unix://{pods_socket}",
        "--cache-dir",
        "/models",
    ]
    wait_mounts, agent_mounts, chart_volumes = mounts_of(wait), mounts_of(agent), volumes_of(agent_spec)
    assert wait_mounts["weightswarm-run"] == {
        "name": "weightswarm-run",
        "mountPath": agent_mounts["run"]["mountPath"],
        "readOnly": True,
    }
    assert wait_mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    volumes = volumes_of(spec)
    assert volumes["weightswarm-run"]["hostPath"]["path"] == chart_volumes["run"]["hostPath"]["path"]
    assert volumes["models"]["hostPath"]["path"] == chart_volumes["hub"]["hostPath"]["path"]
    # The workload holds no credentials: the bucket is read with the node's.
    for c in every_container(spec):
        assert "env" not in c or not [e for e in c["env"] if "valueFrom" in e or CLOUD_ENV.match(e["name"])]
        assert "envFrom" not in c
    # vLLM serves it offline by the repo id it is cached as.
    vllm = container(spec, "vllm")
    assert vllm["command"] == ["vllm", "serve", ref.repo_id]
    assert {e["name"]: e["value"] for e in vllm["env"]} == {"HF_HUB_CACHE": "/models", "HF_HUB_OFFLINE": "1"}
    assert mounts_of(vllm)["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    assert "weightswarm-run" not in mounts_of(vllm)
    # It prefers nodes whose agent labelled them as holding the model.
    (term,) = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    key = module("agent.kube.labels").model_label_key(ref.key)
    assert term["preference"] == {"matchExpressions": [{"key": key, "operator": "Exists"}]}


@pytest.mark.parametrize("path", sorted((CHART / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_of_builtin_kinds_is_valid_kubernetes(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("weightswarm.io/"):
            continue  # the CRD's own objects: test_chart_fleet.py parses them as the agent does
        validate(doc)
