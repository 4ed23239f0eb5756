"""The Helm chart, rendered by Helm's own engine (helm-python-sdk: Helm v4 through libhelm_c)
and every object checked against the Kubernetes OpenAPI schemas (kubernetes-validate, strict).

Rendering is offline: `lookup` returns nothing, exactly as `helm template` does.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
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
# Custom resources kubernetes-validate has no schema for: skipped on purpose, checked by field below.
CRD_GROUPS = ("monitoring.coreos.com/",)
RELEASE, NAMESPACE = "ws", "weightswarm"
AGENT, TRACKER = "ws-weightswarm-agent", "ws-weightswarm-tracker"

REDIS_HA = {
    "tracker": {"replicas": 3, "store": {"type": "redis", "redis": {"url": "redis://:pw0rd@redis:6379/0"}}}
}
EXISTING_SECRETS = {
    "hfToken": {"existingSecret": "my-hf", "existingSecretKey": "hf"},
    "trackerToken": {"existingSecret": "my-tracker", "existingSecretKey": "tok"},
    "tracker": {
        "store": {"type": "redis", "redis": {"existingSecret": "my-redis", "existingSecretKey": "u"}}
    },
}
MONITORED = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "networkPolicy": {"enabled": True},
}
PLACEMENT = {
    "agent": {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoExecute"}
        ],
        "hostPathRoot": "/mnt/nvme/ws/",
    }
}
HOST_NETWORK = {"agent": {"hostNetwork": True}}
NO_TRACKER = {"tracker": {"enabled": False}}
VALUE_SETS = {
    "defaults": {},
    "redis-ha": REDIS_HA,
    "existing-secrets": EXISTING_SECRETS,
    "monitoring-and-policy": MONITORED,
    "placement": PLACEMENT,
    "host-network": HOST_NETWORK,
    "no-tracker": NO_TRACKER,
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render_text(
    chart: Any, values: dict[str, Any], release: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    return dict(chart.render(values, name=release, namespace=namespace, is_install=True))


def render(
    chart: Any, values: dict[str, Any], release: str = RELEASE, namespace: str = NAMESPACE
) -> dict[tuple[str, str], dict[str, Any]]:
    """Rendered objects keyed by (kind, name); NOTES.txt left out."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path, text in render_text(chart, values, release, namespace).items():
        if path.endswith("NOTES.txt"):
            continue
        for obj in yaml.safe_load_all(text):
            if obj:
                key = (obj["kind"], obj["metadata"]["name"])
                assert key not in objects, f"duplicate object {key}"
                objects[key] = obj
    return objects


def pod_spec(objects: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return objects[(kind, name)]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(spec: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    items = spec["initContainers" if init else "containers"]
    return next(c for c in items if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid_kubernetes(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    assert ("DaemonSet", AGENT) in objects
    checked = 0
    for (kind, name), obj in objects.items():
        if obj["apiVersion"].startswith(CRD_GROUPS):
            continue
        try:
            kv.validate(obj, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{kind}/{name}: {'.'.join(map(str, exc.path))}: {exc.message}")
        checked += 1
    assert checked >= 6


def test_lint_is_clean(chart: Any) -> None:
    report = helm.lint(CHART, strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 3] + report["errors"]
    assert not errors, errors


def test_agent_hostpaths_are_directory_or_create_under_the_configured_root(chart: Any) -> None:
    for values, root in (({}, "/var/lib/weightswarm"), (PLACEMENT, "/mnt/nvme/ws")):
        spec = pod_spec(render(chart, values), "DaemonSet", AGENT)
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["hub"]["hostPath"] == {"path": f"{root}/hub", "type": "DirectoryOrCreate"}
        assert volumes["state"]["hostPath"] == {"path": f"{root}/state", "type": "DirectoryOrCreate"}
        assert "emptyDir" in volumes["tmp"]
        mounts = {m["name"]: m["mountPath"] for m in container(spec, "agent")["volumeMounts"]}
        assert mounts["tmp"] == "/tmp"
        config = render(chart, values)[("ConfigMap", AGENT)]["data"]
        assert config["WEIGHTSWARM_CACHE_DIR"] == mounts["hub"]
        assert config["WEIGHTSWARM_STATE_DIR"] == mounts["state"]


def test_rbac_grants_exactly_pods_and_events(chart: Any) -> None:
    objects = render(chart, {})
    rules = objects[("ClusterRole", AGENT)]["rules"]
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "events", "create"),
        ("events.k8s.io", "events", "create"),
    }
    binding = objects[("ClusterRoleBinding", AGENT)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}]
    assert pod_spec(objects, "DaemonSet", AGENT)["serviceAccountName"] == AGENT
    tracker = pod_spec(objects, "Deployment", TRACKER)
    assert tracker["automountServiceAccountToken"] is False
    assert tracker["serviceAccountName"] == TRACKER
    assert not any(o.get("subjects", [{}])[0].get("name") == TRACKER for o in objects.values())
    assert not any(
        k[0] in {"ClusterRole", "ClusterRoleBinding"} for k in render(chart, {"rbac": {"create": False}})
    )


def test_agent_probes_target_the_api_port(chart: Any) -> None:
    agent = container(
        pod_spec(render(chart, {"agent": {"api": {"port": 9100}}}), "DaemonSet", AGENT), "agent"
    )
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["api"] == 9100
    assert agent["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "api"}
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    # Lenient start: several minutes for restoring a large cache before liveness applies.
    startup = agent["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert env_of(agent)["WEIGHTSWARM_API_LISTEN"]["value"] == "0.0.0.0:9100"


def test_agent_runs_non_root_with_least_privilege(chart: Any) -> None:
    spec = pod_spec(render(chart, {"agent": {"runAsUser": 4242, "runAsGroup": 4343}}), "DaemonSet", AGENT)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 4242 and pod["runAsGroup"] == 4343
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    agent = container(spec, "agent")["securityContext"]
    assert agent == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    chown = container(spec, "chown-hostpath", init=True)
    sc = chown["securityContext"]
    assert (
        sc["runAsUser"] == 0
        and sc["allowPrivilegeEscalation"] is False
        and sc["readOnlyRootFilesystem"] is True
    )
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert "privileged" not in sc
    assert "chown -R 4242:4343" in chown["command"][-1]
    assert spec["priorityClassName"] == "system-node-critical"
    assert "initContainers" not in pod_spec(
        render(chart, {"agent": {"chownHostPath": False}}), "DaemonSet", AGENT
    )


def test_agent_env_uses_the_downward_api_and_config_map(chart: Any) -> None:
    objects = render(chart, {})
    agent = container(pod_spec(objects, "DaemonSet", AGENT), "agent")
    env = env_of(agent)
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["WEIGHTSWARM_NODE_NAME"]["value"] == "$(NODE_NAME)"
    assert agent["envFrom"] == [{"configMapRef": {"name": AGENT}}]
    assert agent["command"] == ["agent", "serve"]
    config = objects[("ConfigMap", AGENT)]["data"]
    tracker_port = objects[("Service", TRACKER)]["spec"]["ports"][0]["port"]
    assert config["WEIGHTSWARM_TRACKER"] == f"http://{TRACKER}.{NAMESPACE}.svc:{tracker_port}"
    assert config["HF_ENDPOINT"] == config["WEIGHTSWARM_ORIGIN"] == "https://huggingface.co"
    assert config["WEIGHTSWARM_KUBE"] == "on"  # the pod watcher runs in every agent
    off = {"agent": {"config": {"WEIGHTSWARM_KUBE": "off"}}}
    assert render(chart, off)[("ConfigMap", AGENT)]["data"]["WEIGHTSWARM_KUBE"] == "off"
    assert all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", k) for k in config)


def test_host_network_binds_the_api_to_the_node_ip_only(chart: Any) -> None:
    spec = pod_spec(render(chart, HOST_NETWORK), "DaemonSet", AGENT)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert env_of(container(spec, "agent"))["WEIGHTSWARM_API_LISTEN"]["value"] == "$(POD_IP):7470"
    assert "hostNetwork" not in pod_spec(render(chart, {}), "DaemonSet", AGENT)


def test_agent_service_is_node_local(chart: Any) -> None:
    service = render(chart, {})[("Service", AGENT)]["spec"]
    assert service["internalTrafficPolicy"] == "Local"
    assert service["ports"] == [{"name": "api", "port": 7470, "targetPort": "api", "protocol": "TCP"}]


def checksum(chart: Any, values: dict[str, Any]) -> str:
    template = render(chart, values)[("DaemonSet", AGENT)]["spec"]["template"]
    return template["metadata"]["annotations"]["checksum/config"]  # type: ignore[no-any-return]


def test_config_checksum_rolls_agents_only_when_their_config_changes(chart: Any) -> None:
    base = checksum(chart, {})
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert checksum(chart, {}) == base
    assert checksum(chart, {"logLevel": "DEBUG"}) != base
    assert checksum(chart, {"agent": {"config": {"WEIGHTSWARM_STALL_TIMEOUT": "90"}}}) != base
    assert checksum(chart, {"origin": {"endpoint": "https://hub.internal"}}) != base
    assert checksum(chart, {"tracker": {"resources": {"requests": {"cpu": "1"}}}}) == base


def all_text(chart: Any, values: dict[str, Any]) -> str:
    return "\n".join(render_text(chart, values).values())


def test_tokens_live_in_secrets_and_are_referenced_not_inlined(chart: Any) -> None:
    hf, tracker_tok, redis_url = "hf_SECRETabc123", "trackerSECRET456", "redis://:pw0rdSECRET@redis:6379/0"
    values = {
        "hfToken": {"value": hf},
        "trackerToken": {"value": tracker_tok},
        "tracker": {"replicas": 2, "store": {"type": "redis", "redis": {"url": redis_url}}},
    }
    text = all_text(chart, values)
    for secret in (hf, tracker_tok, redis_url):
        assert secret not in text  # only base64 inside Secret objects
    objects = render(chart, values)
    secrets = {name: obj for (kind, name), obj in objects.items() if kind == "Secret"}
    decoded = {
        name: {k: base64.b64decode(v).decode() for k, v in s["data"].items()} for name, s in secrets.items()
    }
    assert decoded == {
        "ws-weightswarm-hf-token": {"token": hf},
        "ws-weightswarm-tracker-token": {"token": tracker_tok},
        "ws-weightswarm-tracker-redis": {"url": redis_url},
    }
    agent_spec = pod_spec(objects, "DaemonSet", AGENT)
    assert env_of(container(agent_spec, "agent"))["HF_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "ws-weightswarm-hf-token", "key": "token"}
    }
    tracker = container(pod_spec(objects, "Deployment", TRACKER), "tracker")
    assert env_of(tracker)["WEIGHTSWARM_REDIS"]["valueFrom"] == {
        "secretKeyRef": {"name": "ws-weightswarm-tracker-redis", "key": "url"}
    }
    for spec in (agent_spec, pod_spec(objects, "Deployment", TRACKER)):
        token_volumes = [v["secret"] for v in spec["volumes"] if "secret" in v]
        assert token_volumes == [
            {
                "secretName": "ws-weightswarm-tracker-token",
                "defaultMode": 0o440,
                "items": [{"key": "token", "path": "token"}],
            }
        ]


def test_existing_secrets_are_used_and_none_created(chart: Any) -> None:
    objects = render(chart, EXISTING_SECRETS)
    assert not [k for k in objects if k[0] == "Secret"]
    agent_spec = pod_spec(objects, "DaemonSet", AGENT)
    tracker_spec = pod_spec(objects, "Deployment", TRACKER)
    assert env_of(container(agent_spec, "agent"))["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "my-hf",
        "key": "hf",
    }
    assert env_of(container(tracker_spec, "tracker"))["WEIGHTSWARM_REDIS"]["valueFrom"]["secretKeyRef"] == {
        "name": "my-redis",
        "key": "u",
    }
    for spec in (agent_spec, tracker_spec):
        (secret,) = [v["secret"] for v in spec["volumes"] if "secret" in v]
        assert secret["secretName"] == "my-tracker" and secret["items"] == [{"key": "tok", "path": "token"}]


def test_generated_tracker_token_is_random_and_no_hf_token_by_default(chart: Any) -> None:
    first, second = (render(chart, {})[("Secret", "ws-weightswarm-tracker-token")] for _ in range(2))
    tokens = [base64.b64decode(s["data"]["token"]).decode() for s in (first, second)]
    assert all(re.fullmatch(r"[A-Za-z0-9]{48}", t) for t in tokens)
    assert tokens[0] != tokens[1]  # offline: no lookup, so a fresh one (in a cluster: reused)
    assert "lookup" in (CHART / "templates" / "secret.yaml").read_text()
    agent = container(pod_spec(render(chart, {}), "DaemonSet", AGENT), "agent")
    assert "HF_TOKEN" not in env_of(agent)


def test_sqlite_tracker_is_one_replica_on_a_pvc_with_recreate(chart: Any) -> None:
    values = {"tracker": {"persistence": {"storageClass": "fast", "size": "5Gi"}}}
    objects = render(chart, values)
    deployment = objects[("Deployment", TRACKER)]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    pvc = objects[("PersistentVolumeClaim", TRACKER)]["spec"]
    assert pvc["storageClassName"] == "fast" and pvc["resources"]["requests"]["storage"] == "5Gi"
    spec = deployment["template"]["spec"]
    data = next(v for v in spec["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"] == {"claimName": TRACKER}
    tracker = container(spec, "tracker")
    assert "--db=/data/tracker.db" in tracker["command"]
    assert tracker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert tracker["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert tracker["securityContext"]["readOnlyRootFilesystem"] is True
    no_pvc = render(chart, {"tracker": {"persistence": {"enabled": False}}})
    assert ("PersistentVolumeClaim", TRACKER) not in no_pvc


def test_redis_tracker_scales_out_without_a_pvc(chart: Any) -> None:
    objects = render(chart, REDIS_HA)
    deployment = objects[("Deployment", TRACKER)]["spec"]
    assert deployment["replicas"] == 3 and deployment["strategy"]["type"] == "RollingUpdate"
    assert ("PersistentVolumeClaim", TRACKER) not in objects
    command = container(deployment["template"]["spec"], "tracker")["command"]
    assert not any(a.startswith("--db") for a in command)


def test_more_than_one_sqlite_replica_fails_with_a_clear_message(chart: Any) -> None:
    with pytest.raises(helm.HelmError, match=r"tracker.replicas=3 needs tracker.store.type=redis"):
        render(chart, {"tracker": {"replicas": 3}})
    with pytest.raises(
        helm.HelmError, match=r"needs tracker.store.redis.url or tracker.store.redis.existingSecret"
    ):
        render(chart, {"tracker": {"store": {"type": "redis"}}})
    with pytest.raises(helm.HelmError, match=r"cannot select agents with agent.hostNetwork=true"):
        render(chart, {**MONITORED, **HOST_NETWORK})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tracker": {"replicas": "three"}}, "at '/tracker/replicas"),
        ({"tracker": {"replicas": 0}}, "at '/tracker/replicas"),
        ({"tracker": {"store": {"type": "etcd"}}}, "at '/tracker/store/type"),
        ({"agent": {"bittorrent": {"port": 70000}}}, "at '/agent/bittorrent/port"),
        ({"agent": {"hostPathRoot": "relative/dir"}}, "at '/agent/hostPathRoot"),
        ({"agent": {"nodeSelectr": {}}}, "at '/agent"),
        ({"trackerTokn": {}}, "at '"),
        ({"image": {"digest": "latest"}}, "at '/image/digest"),
        ({"agent": {"config": {"lower_case": "x"}}}, "invalid propertyName 'lower_case'"),
        ({"agent": {"startupProbe": {"periodSeconds": "5s"}}}, "at '/agent/startupProbe/periodSeconds"),
        ({"serviceMonitor": {"enabled": "yes"}}, "at '/serviceMonitor/enabled"),
    ],
)
def test_schema_rejects_wrong_values(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, values)
    assert message in str(caught.value)


def test_monitoring_and_network_policy(chart: Any) -> None:
    objects = render(chart, MONITORED)
    for name, port in ((AGENT, "api"), (TRACKER, "http")):
        monitor = objects[("ServiceMonitor", name)]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert monitor["spec"]["endpoints"][0]["port"] == port
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        service_labels = objects[("Service", name)]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    agent_labels = objects[("DaemonSet", AGENT)]["spec"]["selector"]["matchLabels"]
    agent_policy = objects[("NetworkPolicy", AGENT)]["spec"]
    bt, api = agent_policy["ingress"]
    assert bt["from"] == [{"podSelector": {"matchLabels": agent_labels}}]
    assert {p["port"] for p in bt["ports"]} == {"bittorrent", "bittorrent-utp"}
    assert api["ports"] == [{"port": "api", "protocol": "TCP"}]
    tracker_policy = objects[("NetworkPolicy", TRACKER)]["spec"]
    assert tracker_policy["ingress"][0]["from"] == [{"podSelector": {"matchLabels": agent_labels}}]
    plain = render(chart, {})
    assert not [k for k in plain if k[0] in {"ServiceMonitor", "NetworkPolicy"}]


def test_custom_placement_passes_through(chart: Any) -> None:
    spec = pod_spec(render(chart, PLACEMENT), "DaemonSet", AGENT)
    assert spec["nodeSelector"] == PLACEMENT["agent"]["nodeSelector"]
    assert spec["tolerations"] == PLACEMENT["agent"]["tolerations"]
    default = pod_spec(render(chart, {}), "DaemonSet", AGENT)
    assert "nodeSelector" not in default
    assert default["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_without_a_tracker_agents_run_origin_only(chart: Any) -> None:
    objects = render(chart, NO_TRACKER)
    assert not [k for k in objects if k[1] == TRACKER]
    assert "WEIGHTSWARM_TRACKER" not in objects[("ConfigMap", AGENT)]["data"]
    assert not [v for v in pod_spec(objects, "DaemonSet", AGENT)["volumes"] if "secret" in v]


def documented_values() -> dict[str, str]:
    """`dotted.key -> description` for every `# --` comment in values.yaml."""
    documented: dict[str, str] = {}
    stack: list[str] = []
    doc: str | None = None
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            doc = stripped[4:].strip()
            continue
        if stripped.startswith("#"):
            doc = None if doc is None else doc + " " + stripped[1:].strip()
            continue
        match = re.match(r"^( *)([A-Za-z]\w*):", line)
        if match:
            stack = stack[: len(match.group(1)) // 2] + [match.group(2)]
            if doc is not None:
                documented[".".join(stack)] = doc
            doc = None
    return documented


def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        if isinstance(value, dict) and value and not key.endswith(("resources", "Probe", "updateStrategy")):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def test_every_value_is_documented_in_values_yaml_and_the_readme(chart: Any) -> None:
    documented = documented_values()
    missing = [key for key in leaves(chart.values) if key not in documented]
    assert not missing, f"values without a `# --` comment: {missing}"
    readme = (CHART / "README.md").read_text()
    absent = [key for key in documented if f"| `{key}` |" not in readme]
    assert not absent, f"values missing from the README table: {absent}"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(chart.values) <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_vllm_example_is_valid_and_points_at_the_chart(chart: Any) -> None:
    (deployment,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    kv.validate(deployment, K8S_VERSION, strict=True)
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["weightswarm.io/models"] == "Qwen/Qwen2.5-7B-Instruct"
    spec = template["spec"]
    (wait,) = spec["initContainers"]
    assert wait["command"][:5] == ["agent", "wait", "Qwen/Qwen2.5-7B-Instruct", "--timeout", "3600"]
    # The chart installed as release "weightswarm" in namespace "weightswarm" serves that URL.
    agent_service = next(
        obj
        for (kind, _), obj in render(chart, {}, "weightswarm", "weightswarm").items()
        if kind == "Service" and obj["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    )
    port = agent_service["spec"]["ports"][0]["port"]
    assert wait["command"][6] == f"http://{agent_service['metadata']['name']}.weightswarm.svc:{port}"
    assert wait["command"][7:] == ["--cache-dir", "/models"]  # the offline fallback reads the hostPath
    assert wait["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    vllm = container(spec, "vllm")
    assert vllm["command"] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    assert {e["name"]: e["value"] for e in vllm["env"]} == {"HF_HUB_CACHE": "/models", "HF_HUB_OFFLINE": "1"}
    models = next(m for m in vllm["volumeMounts"] if m["name"] == "models")
    assert models == {"name": "models", "mountPath": "/models", "readOnly": True}
    hub = next(v for v in spec["volumes"] if v["name"] == "models")["hostPath"]["path"]
    chart_hub = next(
        v for v in pod_spec(render(chart, {}), "DaemonSet", AGENT)["volumes"] if v["name"] == "hub"
    )["hostPath"]["path"]
    assert hub == chart_hub
