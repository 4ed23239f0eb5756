"""The Helm chart, rendered by Helm's own engine and every object checked against the Kubernetes
OpenAPI schemas (kubernetes-validate, strict): placement, probes, config, the tracker's store,
values and their documentation, the vLLM example. The trust boundaries (credentials, channels,
NetworkPolicy, RBAC, the admission policy) are in test_chart_security.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.deploy.chartkit import (
    AGENT,
    CHART,
    CRD_GROUPS,
    EXAMPLE,
    IMAGE,
    NAMESPACE,
    TRACKER,
    VAP_API,
    container,
    env_of,
    flags,
    helm,
    mounts_of,
    pod_spec,
    render,
    render_text,
    validate,
    volumes_of,
)

REDIS_HA = {
    "tracker": {"replicas": 3, "store": {"type": "redis", "redis": {"url": "redis://:pw0rd@redis:6379/0"}}}
}
EXISTING_SECRETS = {
    "hfToken": {"existingSecret": "my-hf", "existingSecretKey": "hf"},
    "trackerToken": {"existingSecret": "my-tracker", "existingSecretKey": "tok"},
    "announcePasskey": {"existingSecret": "my-passkey", "existingSecretKey": "pk"},
    "tracker": {
        "store": {"type": "redis", "redis": {"existingSecret": "my-redis", "existingSecretKey": "u"}}
    },
}
MONITORED = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "networkPolicy": {
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    },
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
NODE_CIDR = {"ipBlock": {"cidr": "10.0.0.0/16"}}
HOST_NETWORK = {"agent": {"hostNetwork": True}, "networkPolicy": {"tracker": {"extraFrom": [NODE_CIDR]}}}
NO_TRACKER = {"tracker": {"enabled": False}}
PUBLISHER_KEYS = {
    "publicKey": {"existingConfigMap": "ws-publisher-pub"},
    "signingKey": {"existingSecret": "ws-publisher-key"},
}
PUBLISHING = {
    "publisherToken": {"enabled": True},
    "publisherKeys": PUBLISHER_KEYS,
    "agent": {"publishRoots": ["/srv/publish/"]},
}
WATCH_NAMESPACE = {"agent": {"watchNamespace": "inference"}}
SOFT = {
    "networkPolicy": {"enabled": False},
    "agent": {"podsSocket": {"enabled": False}, "metricsOnNetwork": False},
    "admissionPolicy": {"enabled": False},
}
VALUE_SETS = {
    "defaults": {},
    "redis-ha": REDIS_HA,
    "existing-secrets": EXISTING_SECRETS,
    "monitoring": MONITORED,
    "placement": PLACEMENT,
    "host-network": HOST_NETWORK,
    "no-tracker": NO_TRACKER,
    "publishing": PUBLISHING,
    "watch-namespace": WATCH_NAMESPACE,
    "hardening-off": SOFT,
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid_kubernetes(chart: Any, values: dict[str, Any]) -> None:
    # With the admission-policy API served, so the policy and its binding are validated too.
    objects = render(chart, values, api_versions=[VAP_API])
    assert ("DaemonSet", AGENT) in objects
    checked = 0
    for obj in objects.values():
        if obj["apiVersion"].startswith(CRD_GROUPS):
            continue
        validate(obj)
        checked += 1
    assert checked >= 6


def test_lint_is_clean(chart: Any) -> None:
    report = helm.lint(CHART, strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 3] + report["errors"]
    assert not errors, errors


def test_agent_hostpaths_are_directory_or_create_under_the_configured_root(chart: Any) -> None:
    for values, root in (({}, "/var/lib/weightswarm"), (PLACEMENT, "/mnt/nvme/ws")):
        objects = render(chart, values)
        spec = pod_spec(objects, "DaemonSet", AGENT)
        volumes = volumes_of(spec)
        for name in ("hub", "state", "run"):
            assert volumes[name]["hostPath"] == {"path": f"{root}/{name}", "type": "DirectoryOrCreate"}
        assert "emptyDir" in volumes["tmp"]
        mounts = {m["name"]: m["mountPath"] for m in container(spec, "agent")["volumeMounts"]}
        assert mounts["tmp"] == "/tmp"
        config = objects[("ConfigMap", AGENT)]["data"]
        assert config["WEIGHTSWARM_CACHE_DIR"] == mounts["hub"]
        assert config["WEIGHTSWARM_STATE_DIR"] == mounts["state"]


def test_probes_target_the_probe_ports(chart: Any) -> None:
    # Their own port, under its own limits: the network listener full of hostile connections (issue 62)
    # must not fail the liveness probe and restart the agent or the tracker.
    values = {"agent": {"api": {"port": 9100}, "probe": {"port": 9101}}, "tracker": {"probePort": 9102}}
    objects = render(chart, values)
    agent = container(pod_spec(objects, "DaemonSet", AGENT), "agent")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["api"] == 9100 and ports["probe"] == 9101
    assert agent["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "probe"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probe"}
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probe"}
    assert flags(agent)["--probe-listen"] == ["$(POD_IP):9101"]
    tracker = container(pod_spec(objects, "Deployment", TRACKER), "tracker")
    assert {p["name"]: p["containerPort"] for p in tracker["ports"]}["probe"] == 9102
    assert "--probe-port=9102" in tracker["command"]
    paths = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for probe, path in paths.items():
        assert tracker[probe]["httpGet"] == {"path": path, "port": "probe"}
    # Lenient start: several minutes for restoring a large cache before liveness applies.
    startup = agent["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    # The pod IP only (what the kubelet probes), from the downward API; not loopback, not 0.0.0.0.
    assert flags(agent)["--api-listen"] == ["$(POD_IP):9100"]
    assert env_of(agent)["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_agent_runs_non_root_with_least_privilege(chart: Any) -> None:
    spec = pod_spec(render(chart, {"agent": {"runAsUser": 4242, "runAsGroup": 4343}}), "DaemonSet", AGENT)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 4242 and pod["runAsGroup"] == 4343
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostPID" not in spec and "hostIPC" not in spec and "hostNetwork" not in spec
    agent = container(spec, "agent")
    assert agent["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "hostPort" not in json.dumps(agent["ports"])
    chown = container(spec, "chown-hostpath", init=True)
    sc = chown["securityContext"]
    assert (
        sc["runAsUser"] == 0
        and sc["allowPrivilegeEscalation"] is False
        and sc["readOnlyRootFilesystem"] is True
    )
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert "privileged" not in sc
    script = chown["command"][-1]
    assert "chown -R 4242:4343" in script
    # Every hostPath dir the agent writes (it creates its sockets in state/ and run/) is handed over.
    chowned = set(re.search(r"for d in ([^;]+);", script).group(1).split())  # type: ignore[union-attr]
    agent_mounts = mounts_of(agent)
    assert chowned == {agent_mounts[n]["mountPath"] for n in ("hub", "state", "run")}
    assert spec["priorityClassName"] == "system-node-critical"
    assert "initContainers" not in pod_spec(
        render(chart, {"agent": {"chownHostPath": False}}), "DaemonSet", AGENT
    )


def test_tracker_runs_non_root_with_least_privilege(chart: Any) -> None:
    spec = pod_spec(render(chart, {}), "Deployment", TRACKER)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(spec, "tracker")["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert not [v for v in spec["volumes"] if "hostPath" in v]


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
    assert config["WEIGHTSWARM_CACHE_MAX_DISK_PERCENT"] == "85"
    assert "WEIGHTSWARM_WATCH_NAMESPACE" not in config
    custom = {"agent": {"cacheMaxDiskPercent": 70, "config": {"WEIGHTSWARM_KUBE": "off"}}}
    data = render(chart, custom)[("ConfigMap", AGENT)]["data"]
    assert data["WEIGHTSWARM_KUBE"] == "off" and data["WEIGHTSWARM_CACHE_MAX_DISK_PERCENT"] == "70"
    # agent.config overrides a chart-set key instead of repeating it.
    override = {"agent": {"config": {"WEIGHTSWARM_CACHE_MAX_DISK_PERCENT": "95"}}}
    text = next(t for p, t in render_text(chart, override).items() if p.endswith("configmap.yaml"))
    assert text.count("WEIGHTSWARM_CACHE_MAX_DISK_PERCENT") == 1 and '"95"' in text
    assert all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", k) for k in config)


def test_host_network_binds_the_listeners_to_the_node_ip_only(chart: Any) -> None:
    spec = pod_spec(render(chart, HOST_NETWORK), "DaemonSet", AGENT)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    agent = container(spec, "agent")
    assert flags(agent)["--api-listen"] == ["$(POD_IP):7470"]
    assert flags(agent)["--bt-listen"] == ["$(POD_IP):6881"]  # not 0.0.0.0: every node interface
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
    assert checksum(chart, {"agent": {"cacheMaxDiskPercent": 90}}) != base
    assert checksum(chart, {"origin": {"endpoint": "https://hub.internal"}}) != base
    assert checksum(chart, {"tracker": {"resources": {"requests": {"cpu": "1"}}}}) == base


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


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tracker": {"replicas": 3}}, r"tracker.replicas=3 needs tracker.store.type=redis"),
        ({"tracker": {"store": {"type": "redis"}}}, r"needs tracker.store.redis.url or tracker.store.redis"),
        ({"agent": {"hostNetwork": True}}, r"list them in networkPolicy.tracker.extraFrom"),
        ({"agent": {"publishRoots": ["/srv/p"]}}, r"agent.publishRoots needs publisherToken.enabled=true"),
        (
            {**PUBLISHING, "publisherKeys": {"publicKey": PUBLISHER_KEYS["publicKey"]}},
            r"agent.publishRoots needs publisherKeys.signingKey.existingSecret: agents sign",
        ),
        (
            {**PUBLISHING, "publisherKeys": {"signingKey": PUBLISHER_KEYS["signingKey"]}},
            r"agent.publishRoots needs publisherKeys.publicKey",
        ),
        (
            {**PUBLISHING, **NO_TRACKER},
            r"agent.publishRoots needs a tracker",
        ),
        (
            {"serviceMonitor": {"enabled": True}, "agent": {"metricsOnNetwork": False}},
            r"serviceMonitor.enabled=true needs agent.metricsOnNetwork=true",
        ),
        (
            {"tracker": {"enabled": False}, "agent": {"trackerUrl": "http://t:6969"}},
            r"needs the external tracker's agent-role token",
        ),
        (
            {
                "tracker": {"enabled": False},
                "agent": {"trackerUrl": "http://t:6969"},
                "trackerToken": {"existingSecret": "t"},
            },
            r"needs the external tracker's announce passkey",
        ),
    ],
    ids=[
        "sqlite-replicas",
        "redis-without-url",
        "host-network-policy",
        "publish-without-token",
        "publish-without-signing-key",
        "publish-without-public-key",
        "publish-without-tracker",
        "metrics-off-with-monitor",
        "external-tracker-token",
        "external-tracker-passkey",
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(
    chart: Any, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(chart, values)


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
        ({"admissionPolicy": {"enabled": "maybe"}}, "at '/admissionPolicy/enabled"),
        ({"agent": {"cacheMaxDiskPercent": 150}}, "at '/agent/cacheMaxDiskPercent"),
        ({"agent": {"publishRoots": ["srv/publish"]}}, "at '/agent/publishRoots/0"),
        ({"agent": {"publishRoots": ["/"]}}, "at '/agent/publishRoots/0"),
        ({"agent": {"watchNamespace": "Not_A_Namespace"}}, "at '/agent/watchNamespace"),
        ({"agent": {"podsSocket": {"enabled": "yes"}}}, "at '/agent/podsSocket/enabled"),
        ({"networkPolicy": {"metricsFrom": "monitoring"}}, "at '/networkPolicy/metricsFrom"),
        ({"publisherToken": {"enabld": True}}, "at '/publisherToken"),
        ({"announcePasskey": {"existingSecret": "Bad Name"}}, "at '/announcePasskey/existingSecret"),
    ],
)
def test_schema_rejects_wrong_values(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, values)
    assert message in str(caught.value)


def test_service_monitors_scrape_metrics_of_both_components(chart: Any) -> None:
    objects = render(chart, MONITORED)
    for name, port in ((AGENT, "api"), (TRACKER, "http")):
        monitor = objects[("ServiceMonitor", name)]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert monitor["spec"]["endpoints"][0]["port"] == port
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        service_labels = objects[("Service", name)]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    assert not [k for k in render(chart, {}) if k[0] == "ServiceMonitor"]


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
    spec = pod_spec(objects, "DaemonSet", AGENT)
    assert "credentials" not in volumes_of(spec)
    assert not [f for f in flags(container(spec, "agent")) if f.startswith(("--tracker", "--publish"))]
    assert not [k for k in objects if k[0] == "Secret"]  # no credentials for a tracker that is not there


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

    def schema_paths(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
        for key, sub in node.get("properties", {}).items():
            yield prefix + key
            yield from schema_paths(sub, f"{prefix}{key}.")

    typed = set(schema_paths(schema))
    untyped = [key for key in leaves(chart.values) if key not in typed]
    assert not untyped, f"values without a schema entry: {untyped}"


def test_vllm_example_is_valid_and_uses_the_pods_socket(chart: Any) -> None:
    (deployment,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    validate(deployment)
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["weightswarm.io/models"] == "Qwen/Qwen2.5-7B-Instruct"
    spec = template["spec"]
    (wait,) = spec["initContainers"]
    assert wait["command"][:5] == ["agent", "wait", "Qwen/Qwen2.5-7B-Instruct", "--timeout", "3600"]
    # The agent's own hostPaths and socket, as the chart renders them with its defaults.
    agent_spec = pod_spec(render(chart, {}, "weightswarm", "weightswarm"), "DaemonSet", "weightswarm-agent")
    agent = container(agent_spec, "agent")
    chart_volumes, agent_mounts = volumes_of(agent_spec), mounts_of(agent)
    (pods_socket,) = flags(agent)["--pods-socket"]
    assert wait["command"][5:7] == ["--agent", f"unix://{pods_socket}"]
    assert wait["command"][7:] == ["--cache-dir", "/models"]  # the offline fallback reads the hostPath
    # The socket's directory is the agent's run/ hostPath, mounted read-only at the same path, so the
    # socket path means the same in both pods and the workload cannot replace the socket.
    wait_mounts = mounts_of(wait)
    assert wait_mounts["weightswarm-run"] == {
        "name": "weightswarm-run",
        "mountPath": agent_mounts["run"]["mountPath"],
        "readOnly": True,
    }
    assert pods_socket.rpartition("/")[0] == agent_mounts["run"]["mountPath"]
    assert wait_mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    volumes = volumes_of(spec)
    assert volumes["weightswarm-run"]["hostPath"]["path"] == chart_volumes["run"]["hostPath"]["path"]
    assert volumes["models"]["hostPath"]["path"] == chart_volumes["hub"]["hostPath"]["path"]
    # The workload's own token, from its own Secret, goes with its request (optional: public repos).
    assert env_of(wait)["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    vllm = container(spec, "vllm")
    assert vllm["command"] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    assert {e["name"]: e["value"] for e in vllm["env"]} == {"HF_HUB_CACHE": "/models", "HF_HUB_OFFLINE": "1"}
    assert mounts_of(vllm)["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    assert "weightswarm-run" not in mounts_of(vllm)  # only the init container asks for models


def test_the_image_must_be_named_and_is_named_one_way_everywhere(chart: Any) -> None:
    """No image is published: an install that does not name one fails at once, saying what to do, rather
    than pulling a reference that does not exist; the README, the chart's README and the examples give one
    and the same reference, the one the README's build command tags."""
    with pytest.raises(helm.HelmError, match=r"image.repository is empty: no weightswarm image is published"):
        render(chart, {"image": {"repository": ""}})
    version = chart.metadata["appVersion"]
    agent_spec = pod_spec(render(chart, {}), "DaemonSet", "ws-weightswarm-agent")
    assert container(agent_spec, "agent")["image"] == f"{IMAGE}:{version}"
    # A registry host (it has a dot), any path, then the image's name, with or without a tag.
    reference = r"\b[a-z0-9-]+(?:\.[a-z0-9-]+)+(?::\d+)?(?:/[\w.-]+)*/weightswarm(?::[\w.-]+)?"
    root = CHART.parents[1]
    texts = [root / "README.md", CHART / "README.md", *sorted((CHART / "examples").glob("*.yaml"))]
    references = {
        (path.name, match)
        for path in texts
        for match in re.findall(reference, path.read_text())
    }
    assert references, "no image reference found"
    assert {ref.split(":")[0] for _, ref in references} == {IMAGE}, references
    tagged = {ref for _, ref in references if ":" in ref}
    assert tagged == {f"{IMAGE}:{version}"}, tagged
    assert f"docker build -t {IMAGE}:{version} ." in (root / "README.md").read_text()
