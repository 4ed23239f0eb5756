"""The chart's trust boundaries, as the default values render them (docs/security.md, "The chart"):

- the tracker's credentials (agent-role token, announce passkey, publisher token) are files from
  Secrets, never variables or arguments; generated once and reused on upgrade;
- the agent's channels: the network listener (health, metrics, HF endpoint), the admin socket in
  the state dir (only the agent mounts it), the pods' socket in `<hostPathRoot>/run`;
- NetworkPolicies: BitTorrent and the tracker only from agents, the listener only from the
  release's namespace and listed peers;
- RBAC: exactly what agent/kube/ calls (the admission policies that narrow it further:
  test_chart_admission.py, test_chart_fleet.py).
"""

from __future__ import annotations

import ast
import base64
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chartkit import (
    AGENT,
    CHART,
    CREDENTIALS_DIR,
    NAMESPACE,
    TRACKER,
    Objects,
    all_text,
    container,
    env_of,
    flags,
    mounts_of,
    pod_spec,
    render,
    volumes_of,
)

KUBE_DIR = Path(__file__).resolve().parents[2] / "agent" / "kube"
TOKEN_SECRET, PASSKEY_SECRET, PUBLISHER_SECRET = (
    "ws-weightswarm-tracker-token",
    "ws-weightswarm-announce-passkey",
    "ws-weightswarm-publisher-token",
)
PUBLIC_KEY = {"publicKey": {"existingConfigMap": "ws-publisher-pub"}}
PUBLISHING = {
    "publisherToken": {"enabled": True},
    "publisherKeys": {**PUBLIC_KEY, "signingKey": {"existingSecret": "ws-publisher-key", "key": "ed25519"}},
    "agent": {"publishRoots": ["/srv/publish/", "/mnt/models"]},
}
KEYS_DIR = "/etc/weightswarm/publisher"


def agent_and_tracker(objects: Objects) -> tuple[dict[str, Any], dict[str, Any]]:
    return pod_spec(objects, "DaemonSet", AGENT), pod_spec(objects, "Deployment", TRACKER)


def projected(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """file name -> (Secret, key) of the pod's credentials volume."""
    volume = volumes_of(spec)["credentials"]["projected"]
    assert volume["defaultMode"] == 0o440
    return {
        item["path"]: (source["secret"]["name"], item["key"])
        for source in volume["sources"]
        for item in source["secret"]["items"]
    }


def secrets(objects: Objects) -> dict[str, dict[str, str]]:
    return {
        name: {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}
        for (kind, name), obj in objects.items()
        if kind == "Secret"
    }


# --- credentials -------------------------------------------------------------------------------


def test_tracker_credentials_are_mounted_files_in_agents_and_tracker_by_default(chart: Any) -> None:
    objects = render(chart, {})
    agent_spec, tracker_spec = agent_and_tracker(objects)
    expected = {"tracker-token": (TOKEN_SECRET, "token"), "announce-passkey": (PASSKEY_SECRET, "passkey")}
    for spec, name in ((agent_spec, "agent"), (tracker_spec, "tracker")):
        assert projected(spec) == expected
        assert mounts_of(container(spec, name))["credentials"] == {
            "name": "credentials",
            "mountPath": CREDENTIALS_DIR,
            "readOnly": True,
        }
    agent_flags = flags(container(agent_spec, "agent"))
    assert agent_flags["--tracker-token-file"] == [f"{CREDENTIALS_DIR}/tracker-token"]
    assert agent_flags["--tracker-passkey-file"] == [f"{CREDENTIALS_DIR}/announce-passkey"]
    assert "--publisher-token-file" not in agent_flags
    tracker_flags = flags(container(tracker_spec, "tracker"))
    assert tracker_flags["--token-file"] == [f"{CREDENTIALS_DIR}/tracker-token"]
    assert tracker_flags["--announce-passkey-file"] == [f"{CREDENTIALS_DIR}/announce-passkey"]
    assert "--publisher-token-file" not in tracker_flags
    # Off: the tracker records the address an announce comes from, never one the client claims.
    assert "--trust-announce-ip" not in tracker_flags


@pytest.mark.parametrize("values", [{}, PUBLISHING], ids=["defaults", "publishing"])
def test_no_credential_in_an_env_var_or_argument(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    created = secrets(objects)
    credential_secrets = {TOKEN_SECRET, PASSKEY_SECRET, PUBLISHER_SECRET}
    for spec in agent_and_tracker(objects):
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef", {})
                assert ref.get("name") not in credential_secrets, (c["name"], env)
                assert not re.search(r"TOKEN|PASSKEY", env["name"]) or env["name"] == "HF_TOKEN_PATH", env
            assert not [e for e in c.get("envFrom", []) if "secretRef" in e]
            args = " ".join([*c.get("command", []), *c.get("args", [])])
            for data in created.values():
                for value in data.values():
                    assert value not in args
            # Every credential option names a file under the read-only credentials mount.
            for name, values_ in flags(c).items():
                if re.search(r"token|passkey", name):
                    assert name.endswith("-file") and all(
                        v.startswith(CREDENTIALS_DIR + "/") for v in values_
                    )


def test_given_credentials_live_in_secrets_and_are_referenced_not_inlined(chart: Any) -> None:
    hf, token, passkey, publisher = "hf_SECRETabc123", "trackerSECRET456", "passSECRET789", "pubSECRET012"
    redis_url = "redis://:pw0rdSECRET@redis:6379/0"
    values = {
        "hfToken": {"value": hf},
        "trackerToken": {"value": token},
        "announcePasskey": {"value": passkey},
        "publisherToken": {"enabled": True, "value": publisher},
        "tracker": {"replicas": 2, "store": {"type": "redis", "redis": {"url": redis_url}}},
    }
    text = all_text(chart, values)
    for secret in (hf, token, passkey, publisher, redis_url):
        assert secret not in text  # only base64 inside Secret objects
    objects = render(chart, values)
    assert secrets(objects) == {
        "ws-weightswarm-hf-token": {"token": hf},
        TOKEN_SECRET: {"token": token},
        PASSKEY_SECRET: {"passkey": passkey},
        PUBLISHER_SECRET: {"token": publisher},
        "ws-weightswarm-tracker-redis": {"url": redis_url},
    }
    agent_spec, tracker_spec = agent_and_tracker(objects)
    assert hf_token_file(agent_spec) == ("ws-weightswarm-hf-token", "token")
    assert env_of(container(tracker_spec, "tracker"))["WEIGHTSWARM_REDIS"]["valueFrom"] == {
        "secretKeyRef": {"name": "ws-weightswarm-tracker-redis", "key": "url"}
    }
    assert projected(tracker_spec)["publisher-token"] == (PUBLISHER_SECRET, "token")


def hf_token_file(agent_spec: dict[str, Any]) -> tuple[str, str]:
    """(Secret, key) of the node's HF token, which the agent reads from the file HF_TOKEN_PATH names."""
    agent = container(agent_spec, "agent")
    path = env_of(agent)["HF_TOKEN_PATH"]["value"]
    mount = next(m for m in agent["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True and "HF_TOKEN" not in env_of(agent)
    volume = next(v for v in agent_spec["volumes"] if v["name"] == mount["name"])
    (item,) = volume["secret"]["items"]
    assert path == f"{mount['mountPath']}/{item['path']}"
    return volume["secret"]["secretName"], item["key"]


def test_existing_secrets_are_used_and_none_created(chart: Any) -> None:
    values = {
        "hfToken": {"existingSecret": "my-hf", "existingSecretKey": "hf"},
        "trackerToken": {"existingSecret": "my-tracker", "existingSecretKey": "tok"},
        "announcePasskey": {"existingSecret": "my-passkey", "existingSecretKey": "pk"},
        "publisherToken": {"enabled": True, "existingSecret": "my-publisher", "existingSecretKey": "pub"},
        "tracker": {
            "store": {"type": "redis", "redis": {"existingSecret": "my-redis", "existingSecretKey": "u"}}
        },
    }
    objects = render(chart, values)
    assert not [k for k in objects if k[0] == "Secret"]
    agent_spec, tracker_spec = agent_and_tracker(objects)
    assert hf_token_file(agent_spec) == ("my-hf", "hf")
    assert env_of(container(tracker_spec, "tracker"))["WEIGHTSWARM_REDIS"]["valueFrom"]["secretKeyRef"] == {
        "name": "my-redis",
        "key": "u",
    }
    shared = {"tracker-token": ("my-tracker", "tok"), "announce-passkey": ("my-passkey", "pk")}
    assert projected(agent_spec) == shared
    assert projected(tracker_spec) == {**shared, "publisher-token": ("my-publisher", "pub")}


def test_generated_credentials_are_random_and_reused_on_upgrade(chart: Any) -> None:
    first, second = (secrets(render(chart, {})) for _ in range(2))
    values = [first[TOKEN_SECRET]["token"], first[PASSKEY_SECRET]["passkey"], second[TOKEN_SECRET]["token"]]
    assert all(re.fullmatch(r"[A-Za-z0-9]{48}", v) for v in values)
    assert len(set(values)) == 3  # offline: no lookup, so fresh ones (in a cluster: the stored ones)
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "v1" "Secret"' in helpers
    assert (CHART / "templates" / "secret.yaml").read_text().count('include "weightswarm.credential"') == 1
    assert PUBLISHER_SECRET not in first  # only when publishing is enabled
    agent = container(pod_spec(render(chart, {}), "DaemonSet", AGENT), "agent")
    assert "HF_TOKEN" not in env_of(agent) and "HF_TOKEN_PATH" not in env_of(agent)


def test_publisher_token_reaches_agents_only_when_they_publish(chart: Any) -> None:
    tracker_only = render(chart, {"publisherToken": {"enabled": True}})
    agent_spec, tracker_spec = agent_and_tracker(tracker_only)
    assert "publisher-token" in projected(tracker_spec)
    assert flags(container(tracker_spec, "tracker"))["--publisher-token-file"] == [
        f"{CREDENTIALS_DIR}/publisher-token"
    ]
    assert "publisher-token" not in projected(agent_spec)
    assert "--publish-root" not in flags(container(agent_spec, "agent"))

    agent_spec = pod_spec(render(chart, PUBLISHING), "DaemonSet", AGENT)
    agent = container(agent_spec, "agent")
    assert projected(agent_spec)["publisher-token"] == (PUBLISHER_SECRET, "token")
    assert flags(agent)["--publisher-token-file"] == [f"{CREDENTIALS_DIR}/publisher-token"]
    assert flags(agent)["--publish-root"] == ["/srv/publish", "/mnt/models"]
    volumes, mounts = volumes_of(agent_spec), mounts_of(agent)
    for i, root in enumerate(["/srv/publish", "/mnt/models"]):
        assert volumes[f"publish-root-{i}"]["hostPath"] == {"path": root, "type": "DirectoryOrCreate"}
        assert mounts[f"publish-root-{i}"] == {
            "name": f"publish-root-{i}",
            "mountPath": root,
            "readOnly": True,
        }


def publisher_keys(spec: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """file name -> (kind, name, key) of the agent's publisher-keys volume."""
    volume = volumes_of(spec)["publisher-keys"]["projected"]
    assert volume["defaultMode"] == 0o440
    return {
        item["path"]: (kind, source[kind]["name"], item["key"])
        for source in volume["sources"]
        for kind in source
        for item in source[kind]["items"]
    }


def test_publisher_keys_public_one_in_every_agent_signing_one_only_where_agents_publish(chart: Any) -> None:
    """The public key (hub-less manifests must verify with it) goes to every agent when set; the
    private key only to agents that publish; the tracker gets neither (it verifies nothing)."""
    agent_spec, tracker_spec = agent_and_tracker(render(chart, {}))
    assert "publisher-keys" not in volumes_of(agent_spec)
    assert not {"--publisher-public-key-file", "--publisher-signing-key-file"} & set(
        flags(container(agent_spec, "agent"))
    )

    for public, source in (
        (PUBLIC_KEY, ("configMap", "ws-publisher-pub", "publisher.pub")),
        ({"publicKey": {"existingSecret": "pub-secret", "existingConfigMap": "ignored", "key": "pk"}},
         ("secret", "pub-secret", "pk")),
    ):  # fmt: skip
        agent_spec, tracker_spec = agent_and_tracker(render(chart, {"publisherKeys": public}))
        agent = container(agent_spec, "agent")
        assert publisher_keys(agent_spec) == {"publisher.pub": source}
        assert flags(agent)["--publisher-public-key-file"] == [f"{KEYS_DIR}/publisher.pub"]
        assert "--publisher-signing-key-file" not in flags(agent)
        assert mounts_of(agent)["publisher-keys"] == {
            "name": "publisher-keys",
            "mountPath": KEYS_DIR,
            "readOnly": True,
        }
        assert "publisher-keys" not in volumes_of(tracker_spec)

    agent_spec, tracker_spec = agent_and_tracker(render(chart, PUBLISHING))
    agent = container(agent_spec, "agent")
    assert publisher_keys(agent_spec) == {
        "publisher.pub": ("configMap", "ws-publisher-pub", "publisher.pub"),
        "publisher.key": ("secret", "ws-publisher-key", "ed25519"),
    }
    assert flags(agent)["--publisher-signing-key-file"] == [f"{KEYS_DIR}/publisher.key"]
    assert flags(agent)["--publisher-public-key-file"] == [f"{KEYS_DIR}/publisher.pub"]
    assert "publisher-keys" not in volumes_of(tracker_spec)
    tracker_flags = flags(container(tracker_spec, "tracker"))
    assert [a for a in tracker_flags if a.startswith("--publisher-")] == ["--publisher-token-file"]


# --- the agent's channels ----------------------------------------------------------------------


def test_agent_channels_admin_socket_in_state_pods_socket_in_run(chart: Any) -> None:
    spec = pod_spec(render(chart, {}), "DaemonSet", AGENT)
    agent = container(spec, "agent")
    mounts, volumes = mounts_of(agent), volumes_of(spec)
    (admin,) = flags(agent)["--admin-socket"]
    (pods,) = flags(agent)["--pods-socket"]
    # The admin socket (every route) is in the state dir, a hostPath no workload mounts; the node's
    # CLI in the agent container (`kubectl exec ... agent ls`) finds it through WEIGHTSWARM_AGENT.
    assert admin.rpartition("/")[0] == mounts["state"]["mountPath"]
    assert env_of(agent)["WEIGHTSWARM_AGENT"]["value"] == f"unix://{admin}"
    # The pods' socket is alone in <hostPathRoot>/run, the directory workloads mount for it.
    assert pods.rpartition("/")[0] == mounts["run"]["mountPath"]
    assert volumes["run"]["hostPath"]["path"] == "/var/lib/weightswarm/run"
    assert "--no-metrics-on-network" not in flags(agent)

    off = {"agent": {"podsSocket": {"enabled": False}, "metricsOnNetwork": False}}
    spec = pod_spec(render(chart, off), "DaemonSet", AGENT)
    agent = container(spec, "agent")
    assert "--pods-socket" not in flags(agent) and "run" not in volumes_of(spec)
    assert "/run/weightswarm" not in container(spec, "chown-hostpath", init=True)["command"][-1]
    assert "--no-metrics-on-network" in flags(agent)
    assert "--admin-socket" in flags(agent)  # the admin channel is always there


# --- NetworkPolicy -----------------------------------------------------------------------------


def agent_selector(objects: Objects) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": objects[("DaemonSet", AGENT)]["spec"]["selector"]["matchLabels"]}}


def test_network_policy_is_on_by_default_and_admits_only_agents_and_the_namespace(chart: Any) -> None:
    objects = render(chart, {})
    agents = agent_selector(objects)
    policy = objects[("NetworkPolicy", AGENT)]["spec"]
    assert policy["podSelector"] == agents["podSelector"] and policy["policyTypes"] == ["Ingress"]
    bt, api = policy["ingress"]
    assert bt["from"] == [agents]
    assert bt["ports"] == [
        {"port": "bittorrent", "protocol": "TCP"},
        {"port": "bittorrent-utp", "protocol": "UDP"},
    ]
    # The listener: only the release's namespace (a bare podSelector), not every namespace.
    assert api["from"] == [{"podSelector": {}}]
    assert api["ports"] == [{"port": "api", "protocol": "TCP"}]
    tracker = objects[("NetworkPolicy", TRACKER)]["spec"]
    assert tracker["policyTypes"] == ["Ingress"]
    (rule,) = tracker["ingress"]
    assert rule["from"] == [agents] and rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    # The named ports exist on the pods they select.
    agent_ports = {p["name"] for p in container(pod_spec(objects, "DaemonSet", AGENT), "agent")["ports"]}
    assert {"bittorrent", "bittorrent-utp", "api"} <= agent_ports
    assert container(pod_spec(objects, "Deployment", TRACKER), "tracker")["ports"][0]["name"] == "http"
    assert not render(chart, {"networkPolicy": {"enabled": False}}).keys() & {
        ("NetworkPolicy", AGENT),
        ("NetworkPolicy", TRACKER),
    }


def test_network_policy_extra_peers_for_metrics_and_the_hf_endpoint(chart: Any) -> None:
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    inference = {"namespaceSelector": {"matchLabels": {"team": "inference"}}}
    values = {"networkPolicy": {"metricsFrom": [prometheus], "agent": {"apiFrom": [inference]}}}
    objects = render(chart, values)
    agents = agent_selector(objects)
    bt, api = objects[("NetworkPolicy", AGENT)]["spec"]["ingress"]
    assert bt["from"] == [agents]  # BitTorrent never widens
    assert api["from"] == [{"podSelector": {}}, inference, prometheus]
    (rule,) = objects[("NetworkPolicy", TRACKER)]["spec"]["ingress"]
    assert rule["from"] == [agents, prometheus]


def test_host_network_agents_reach_the_tracker_through_listed_node_addresses(chart: Any) -> None:
    nodes = {"ipBlock": {"cidr": "10.0.0.0/16"}}
    values = {"agent": {"hostNetwork": True}, "networkPolicy": {"tracker": {"extraFrom": [nodes]}}}
    objects = render(chart, values)
    # Policies do not apply to host-network pods: none that would only pretend to.
    assert ("NetworkPolicy", AGENT) not in objects
    (rule,) = objects[("NetworkPolicy", TRACKER)]["spec"]["ingress"]
    assert nodes in rule["from"]


# --- RBAC --------------------------------------------------------------------------------------

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)
POD_WATCHER: set[Rule] = {
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "patch"),
    ("", "events", "create"),
}
PREHEAT: set[Rule] = {
    ("weightswarm.io", "modelpreheats", "get"),
    ("weightswarm.io", "modelpreheats", "list"),
    ("weightswarm.io", "modelpreheats", "watch"),
    ("weightswarm.io", "modelpreheats/status", "get"),
    ("weightswarm.io", "modelpreheats/status", "patch"),
}
NODE_LABELS: set[Rule] = {("", "nodes", verb) for verb in ("get", "list", "watch", "patch")}
_VERBS = {
    "list": "list",
    "read": "get",
    "get": "get",
    "patch": "patch",
    "create": "create",
    "replace": "update",
    "delete": "delete",
}
# kubernetes-client methods: CoreV1Api ({verb}_[namespaced_]{kind}[_status][_for_all_namespaces]) and
# CustomObjectsApi ({verb}_cluster_custom_object[_status]: the ModelPreheats, cluster-scoped).
_CORE_METHOD = re.compile(
    r"^(list|read|patch|create|replace|delete)_(?:namespaced_)?(pod|event|node)(_status)?(?:_for_all_namespaces)?$"
)
_CUSTOM_METHOD = re.compile(
    r"^(get|list|patch|create|replace|delete)_(cluster|namespaced)_custom_object(_status)?$"
)


def kube_client_permissions() -> set[Rule]:
    """(apiGroup, resource, verb) that the agent's Kubernetes code (agent/kube/*.py) needs, read from
    the kubernetes-client methods it names (called, or handed to a watch); a module that watches
    (`Watch`, `.stream`, a `ListWatch` subclass) also needs watch on what it lists."""
    needed: set[Rule] = set()
    for path in sorted(KUBE_DIR.glob("*.py")):
        source = path.read_text()
        apis = set(re.findall(r"client\.(\w+Api)\(", source))
        assert apis <= {"CoreV1Api", "CustomObjectsApi"}, f"{path.name}: new API {apis}: update the chart"
        names = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
        found: set[Rule] = set()
        for name in names:
            if core := _CORE_METHOD.match(name):
                verb, kind, status = core.groups()
                found.add(("", f"{kind}s" + ("/status" if status else ""), _VERBS[verb]))
            elif custom := _CUSTOM_METHOD.match(name):
                verb, scope, status = custom.groups()
                assert scope == "cluster", f"{path.name}: {name}: ModelPreheats are cluster-scoped"
                assert "modelpreheats" in source, f"{path.name}: {name} on an unknown custom resource"
                found.add(("weightswarm.io", "modelpreheats" + ("/status" if status else ""), _VERBS[verb]))
        if names & {"Watch", "stream"} or re.search(r"\(\s*ListWatch\s*\)", source):
            found |= {(g, r, "watch") for g, r, v in found if v == "list"}
        needed |= found
    return needed


def granted(role: dict[str, Any]) -> set[Rule]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def check_exactly_what_the_agent_calls(grant: set[Rule]) -> None:
    """Every call the agent makes is granted; nothing is granted that it never calls. The one
    exception: `get` where `list` of the same objects is granted (the contract grants it, it reads
    nothing a list does not). The agent's preheat and node-label code is written alongside the
    chart: a group the agent code does not call at all yet is only checked for the first half."""
    needed = kube_client_permissions()
    assert needed <= grant, f"the agent calls what the chart does not grant: {sorted(needed - grant)}"
    for group in (POD_WATCHER, PREHEAT, NODE_LABELS):
        if not needed & group:
            continue  # the agent side of this feature has not landed (yet)
        unused = (grant & group) - needed
        listed = {(g, r.partition("/")[0]) for g, r, v in grant if v == "list"}
        assert all(v == "get" and (g, r.partition("/")[0]) in listed for g, r, v in unused), (
            f"granted but never called: {sorted(unused)}"
        )


def test_rbac_grants_exactly_what_the_kube_client_calls(chart: Any) -> None:
    assert POD_WATCHER <= kube_client_permissions()
    objects = render(chart, {})
    role = objects[("ClusterRole", AGENT)]
    assert granted(role) == POD_WATCHER | PREHEAT | NODE_LABELS
    check_exactly_what_the_agent_calls(granted(role))
    binding = objects[("ClusterRoleBinding", AGENT)]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": AGENT,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}]
    assert pod_spec(objects, "DaemonSet", AGENT)["serviceAccountName"] == AGENT
    tracker = pod_spec(objects, "Deployment", TRACKER)
    assert tracker["automountServiceAccountToken"] is False
    assert tracker["serviceAccountName"] == TRACKER
    assert not any(o.get("subjects", [{}])[0].get("name") == TRACKER for o in objects.values())
    no_rbac = render(chart, {"rbac": {"create": False}})
    assert not [k for k in no_rbac if k[0] in {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]


@pytest.mark.parametrize(
    ("preheat", "node_labels", "extra"),
    [(True, False, PREHEAT), (False, True, NODE_LABELS), (False, False, set())],
    ids=["preheat-only", "node-labels-only", "neither"],
)
def test_preheat_and_node_label_rules_follow_their_values(
    chart: Any, preheat: bool, node_labels: bool, extra: set[Rule]
) -> None:
    values = {"preheat": {"enabled": preheat}, "nodeLabels": {"enabled": node_labels}}
    objects = render(chart, values)
    assert granted(objects[("ClusterRole", AGENT)]) == POD_WATCHER | extra
    config = objects[("ConfigMap", AGENT)]["data"]
    assert config["WEIGHTSWARM_KUBE_PREHEAT"] == ("on" if preheat else "off")
    assert config["WEIGHTSWARM_KUBE_NODE_LABELS"] == ("on" if node_labels else "off")
    # With a watched namespace: pods and events in the Role, cluster-scoped rules (if any) in a ClusterRole.
    scoped = render(chart, {**values, "agent": {"watchNamespace": "inference"}})
    assert granted(scoped[("Role", AGENT)]) == POD_WATCHER
    assert (("ClusterRole", AGENT) in scoped) is bool(extra)
    assert (("ClusterRoleBinding", AGENT) in scoped) is bool(extra)
    if extra:
        assert granted(scoped[("ClusterRole", AGENT)]) == extra


def test_watch_namespace_narrows_rbac_to_a_role_there(chart: Any) -> None:
    objects = render(chart, {"agent": {"watchNamespace": "inference"}})
    role, binding = objects[("Role", AGENT)], objects[("RoleBinding", AGENT)]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "inference"
    assert granted(role) == POD_WATCHER
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT}
    # The service account stays in the release's namespace; the agent watches only "inference".
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}]
    assert objects[("ConfigMap", AGENT)]["data"]["WEIGHTSWARM_WATCH_NAMESPACE"] == "inference"
    # Nodes and ModelPreheats are cluster-scoped: their rules stay cluster-wide, and only they.
    cluster_role, cluster_binding = objects[("ClusterRole", AGENT)], objects[("ClusterRoleBinding", AGENT)]
    assert "namespace" not in cluster_role["metadata"]
    assert granted(cluster_role) == PREHEAT | NODE_LABELS
    check_exactly_what_the_agent_calls(granted(role) | granted(cluster_role))
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": AGENT,
    }
    assert cluster_binding["subjects"] == binding["subjects"]
