"""The chart's fleet features: the ModelPreheat CRD (crds/), the node labels that say which nodes
hold a model (the `weightswarm.modelLabel` template, the vLLM example's affinity, the admission
policy that limits an agent to its own node's `model.weightswarm.io/` labels) and the Grafana
dashboard (its queries use only metrics the agent exports).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import inspect
import json
import re
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy.chartkit import (
    AGENT,
    CHART,
    EXAMPLE,
    NAMESPACE,
    VAP_API,
    helm,
    render,
    render_text,
    validate,
)
from tests.deploy.test_chart_admission import Admission, edit, policy_objects, userinfo
from tests.support.procs import require_module

jsonschema = require_module("jsonschema", "jsonschema (with kubernetes-validate): pip install -e '.[dev]'")

CRD_FILE = CHART / "crds" / "modelpreheats.yaml"
PREHEAT_EXAMPLE = CHART / "examples" / "preheat.yaml"
DASHBOARD_FILE = CHART / "dashboards" / "weightswarm.json"
DASHBOARD = "ws-weightswarm-dashboard"
NODE_POLICY = f"{AGENT}-node-labels"
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"


def load_crd() -> dict[str, Any]:
    (crd,) = [d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d]
    return crd  # type: ignore[no-any-return]


# --- the ModelPreheat CRD ----------------------------------------------------------------------


def test_crd_is_a_valid_cluster_scoped_custom_resource_definition() -> None:
    crd = load_crd()
    validate(crd)  # the apiextensions.k8s.io/v1 CustomResourceDefinition schema, strict
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1" and crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "modelpreheats.weightswarm.io"
    spec = crd["spec"]
    assert spec["group"] == "weightswarm.io" and spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": "ModelPreheat",
        "listKind": "ModelPreheatList",
        "plural": "modelpreheats",
        "singular": "modelpreheat",
        "shortNames": ["mph"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"].upper(), c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("MODEL", "string", ".spec.model"),
        ("READY", "string", ".status.ready"),
        ("ORIGIN", "integer", ".status.bytesFromOrigin"),
        ("PEERS", "integer", ".status.bytesFromPeers"),
        ("AGE", "date", ".metadata.creationTimestamp"),
    ]
    # A structural schema: the API server refuses `x-kubernetes-preserve-unknown-fields: false`
    # ("must be true or undefined"); undefined already prunes unknown fields, true would keep them.
    assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(version["schema"])


def test_helm_installs_the_crd_but_never_templates_it(chart: Any) -> None:
    assert [c["name"] for c in chart.crds] == ["crds/modelpreheats.yaml"]
    assert not [k for k in render(chart, {}) if k[0] == "CustomResourceDefinition"]
    readme = (CHART / "README.md").read_text()
    assert "kubectl apply -f charts/weightswarm/crds/modelpreheats.yaml" in readme


def to_json_schema(node: Any) -> Any:
    """An OpenAPI v3 (Kubernetes structural) schema as JSON Schema: `nullable` becomes a null type."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"
    }
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


@pytest.fixture(scope="module")
def preheat_schema() -> Any:
    (version,) = load_crd()["spec"]["versions"]
    schema = to_json_schema(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def preheat(model: Any = "Qwen/Qwen2.5-72B-Instruct@main", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "weightswarm.io/v1alpha1", "kind": "ModelPreheat"}
    body["metadata"] = {"name": "qwen-72b"}
    body["spec"] = {"model": model, **spec} if model is not None else dict(spec)
    return body


GOOD = {
    "the-example": yaml.safe_load(PREHEAT_EXAMPLE.read_text()),
    "no-revision": preheat("Qwen/Qwen2.5-7B-Instruct"),
    "branch": preheat("meta-llama/Llama-3.1-8B-Instruct@main", nodeSelector={}),
    "commit": preheat(f"org/name_1.x@{COMMIT}", nodeSelector={"gpu": "h100", "zone": "a"}),
    "pr-ref": preheat("org/name@refs/pr/1"),
    "longest-repo-id": preheat("o/" + "n" * 94 + "@" + "r" * 255),
    "bucket": preheat("acme/llama-ft=s3://models/llama-ft"),
    "bucket-root": preheat("acme/llama-ft=gs://models"),
}
BAD = {
    "no-slash": preheat("not-a-model"),
    "spaces": preheat("Qwen/Qwen 2.5"),
    "two-slashes": preheat("a/b/c"),
    "empty-revision": preheat("Qwen/Qwen2.5-7B-Instruct@"),
    "part-ends-with-dot": preheat("Qwen./name"),
    "revision-too-long": preheat("org/name@" + "r" * 256),
    "bucket-not-a-bucket-url": preheat("acme/llama-ft=https://models/llama-ft"),
    "bucket-with-a-query": preheat("acme/llama-ft=s3://models/m?x=1"),
    "bucket-and-revision": preheat("acme/llama-ft@main=s3://models/m"),
    "missing-model": preheat(None, nodeSelector={"gpu": "h100"}),
    "model-not-a-string": preheat(42),
    "selector-value-not-a-string": preheat(nodeSelector={"gpu": 1}),
    "selector-value-a-list": preheat(nodeSelector={"gpu": ["h100"]}),
    "no-spec": {"apiVersion": "weightswarm.io/v1alpha1", "kind": "ModelPreheat", "metadata": {"name": "x"}},
}


@pytest.mark.parametrize("case", GOOD.keys())
def test_crd_schema_accepts_good_preheats(preheat_schema: Any, case: str) -> None:
    preheat_schema.validate(GOOD[case])


@pytest.mark.parametrize("case", BAD.keys())
def test_crd_schema_rejects_bad_preheats(preheat_schema: Any, case: str) -> None:
    assert list(preheat_schema.iter_errors(BAD[case])), f"{case}: accepted"


def model_rule() -> str:
    (version,) = load_crd()["spec"]["versions"]
    (rule,) = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"][
        "x-kubernetes-validations"
    ]
    return str(rule["rule"])


@pytest.mark.parametrize(
    ("model", "ok"),
    [
        ("Qwen/Qwen2.5-72B-Instruct", True),
        (f"Qwen/Qwen2.5-72B-Instruct@{COMMIT}", True),
        ("o/" + "n" * 94, True),
        ("o/" + "n" * 94 + "@" + "r" * 255, True),
        ("o/" + "n" * 95, False),
        ("o/" + "n" * 95 + "@main", False),
        ("o/" + "n" * 94 + "=s3://" + "b" * 200, True),
        ("o/" + "n" * 95 + "=s3://b/p", False),
    ],
)
def test_crd_rule_limits_the_repo_id_to_96_characters(model: str, ok: bool) -> None:
    """The one check the pattern cannot make (RE2 has no look-ahead), a CEL rule the API server runs."""
    celpy = require_module("celpy", "cel-python: pip install -e '.[dev]' (./dev does)")
    env = celpy.Environment()
    result = env.program(env.compile(model_rule())).evaluate({"self": celpy.json_to_cel(model)})
    assert bool(result) is ok


def test_the_agents_status_entries_fit_the_crd(preheat_schema: Any) -> None:
    """What agent/kube/preheat.py writes under status (the agent side: written alongside the chart)."""
    preheat_mod = importlib.import_module("agent.kube.preheat")
    requests = importlib.import_module("agent.kube.requests")
    statuses = [
        requests.ModelStatus(phase="Pending"),
        requests.ModelStatus(
            phase="Downloading",
            bytes_done=10,
            bytes_total=100,
            bytes_from_peers=6,
            bytes_from_origin=4,
            stage="peers",
            rate=1.5e9,
            eta_seconds=12.5,
            commit=COMMIT,
        ),
        requests.ModelStatus(phase="Downloading"),  # no stage, rate, ETA or commit known yet
        requests.ModelStatus(phase="Ready", bytes_done=100, bytes_total=100, commit=COMMIT),
        requests.ModelStatus(phase="Failed", error="the origin refused the token (HTTP 401)"),
    ]
    nodes = {f"node-{i}": preheat_mod.node_entry(st) for i, st in enumerate(statuses)}
    parsed = preheat_mod.parse_preheat({**GOOD["the-example"], "metadata": {"name": "qwen-72b", "uid": "u1"}})
    counts = preheat_mod.summarise(parsed, nodes, sorted(nodes))
    obj = {**GOOD["the-example"], "status": {**counts, "nodes": nodes}}
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in preheat_schema.iter_errors(obj)]
    assert not errors, errors
    assert counts["ready"] == "1/5"


# --- node labels -------------------------------------------------------------------------------


def reference_label_key(ref: str) -> str:
    """The contract, written out here on its own: `model.weightswarm.io/<slug>.<h>`, h = sha256 of
    "org/name@rev" (rev defaults to main), first 10 hex; slug = the name part, characters outside
    [A-Za-z0-9._-] to "-", non-alphanumerics stripped at both ends, cut to 52, stripped at the end
    again (no slug left: just <h>). agent/kube/labels.py implements the same rule for the agent."""
    if "@" not in ref:
        ref += "@main"
    name = ref.partition("@")[0].partition("/")[2]
    slug = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", re.sub(r"[^A-Za-z0-9._-]", "-", name))
    slug = re.sub(r"[^A-Za-z0-9]+$", "", slug[:52])
    digest = hashlib.sha256(ref.encode()).hexdigest()[:10]
    return f"model.weightswarm.io/{slug}.{digest}" if slug else f"model.weightswarm.io/{digest}"


REFS = [
    "Qwen/Qwen2.5-72B-Instruct@main",
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct@main",
    f"meta-llama/Llama-3.1-8B-Instruct@{COMMIT}",
    "org/name@refs/pr/1",
    "org/_under_score_@v1.0",
    "org/name+with~odd chars@dev",
    "org/modèle-été@main",
    "org/" + "x" * 51 + "-" + "y" * 10 + "@main",  # the cut at 52 ends on "-": stripped again
    "org/" + "a" * 90 + "@" + "r" * 200,
    "org/___@main",  # nothing alphanumeric: no slug
]
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@pytest.fixture(scope="module")
def helper_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """ref -> what `include "weightswarm.modelLabel" ref` renders, in a copy of the chart with one
    extra template that calls it for every ref."""
    copy_dir = tmp_path_factory.mktemp("chart") / "weightswarm"
    shutil.copytree(CHART, copy_dir)
    refs = " ".join(json.dumps(r) for r in REFS)  # JSON strings are Go template string literals
    (copy_dir / "templates" / "zz-model-labels.yaml").write_text(
        "{{- range list " + refs + " }}\n"
        '{{ dict "ref" . "key" (include "weightswarm.modelLabel" .) | toJson }}\n'
        "{{- end }}\n"
    )
    with helm.Chart.load(copy_dir) as chart:
        rendered = render_text(chart, {})
    text = next(t for p, t in rendered.items() if p.endswith("zz-model-labels.yaml"))
    pairs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {p["ref"]: p["key"] for p in pairs}


@pytest.mark.parametrize("ref", REFS)
def test_model_label_template_follows_the_rule(helper_keys: dict[str, str], ref: str) -> None:
    key = helper_keys[ref]
    assert key == reference_label_key(ref)
    prefix, _, name = key.partition("/")
    assert prefix == "model.weightswarm.io" and LABEL_NAME.match(name), key
    # The agent's own implementation (agent/kube/labels.py) takes the full "org/name@rev" key.
    labels = importlib.import_module("agent.kube.labels")
    assert labels.model_label_key(ref if "@" in ref else ref + "@main") == key


def test_model_label_examples() -> None:
    digest = hashlib.sha256(b"Qwen/Qwen2.5-72B-Instruct@main").hexdigest()[:10]
    expected = f"model.weightswarm.io/Qwen2.5-72B-Instruct.{digest}"
    assert reference_label_key("Qwen/Qwen2.5-72B-Instruct") == expected
    assert reference_label_key("org/" + "x" * 51 + "-" + "y" * 10).split("/")[1].split(".")[0] == "x" * 51


def test_vllm_example_prefers_nodes_that_hold_its_model() -> None:
    (deployment,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    template = deployment["spec"]["template"]
    model = template["metadata"]["annotations"]["weightswarm.io/models"]
    affinity = template["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["preference"] == {
        "matchExpressions": [{"key": reference_label_key(model), "operator": "Exists"}]
    }
    readme = (CHART / "README.md").read_text()
    assert f"kubectl get nodes -L {reference_label_key(model)}" in readme


# --- the node-labels admission policy ----------------------------------------------------------

MODEL_LABEL = reference_label_key("Qwen/Qwen2.5-7B-Instruct@main")
OTHER_MODEL_LABEL = reference_label_key(f"meta-llama/Llama-3.1-8B-Instruct@{COMMIT}")
NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "node-a",
        "uid": "0f0e9d1c-0000-4000-8000-00000000000a",
        "labels": {
            "kubernetes.io/hostname": "node-a",
            "node-role.kubernetes.io/worker": "",
            "gpu": "h100",
            MODEL_LABEL: COMMIT,
        },
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
    },
    "spec": {
        "podCIDR": "10.244.1.0/24",
        "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    },
}


def set_label(key: str, value: str = COMMIT) -> Callable[[dict[str, Any]], None]:
    return lambda n: n["metadata"].setdefault("labels", {}).__setitem__(key, value)


def drop_label(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda n: n["metadata"]["labels"].pop(key)


def no_labels(node: dict[str, Any]) -> None:
    del node["metadata"]["labels"]


# (old node, new node, caller) -> allowed? The agent may add, change and remove the
# model.weightswarm.io/ labels of its own node, and nothing else.
NODE_CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any], dict[str, Any], bool]] = {
    "model-label-added": (edit(), edit(set_label(OTHER_MODEL_LABEL)), userinfo(), True),
    "model-label-changed": (edit(), edit(set_label(MODEL_LABEL, "f" * 40)), userinfo(), True),
    "model-label-removed": (edit(), edit(drop_label(MODEL_LABEL)), userinfo(), True),
    "added-to-a-node-without-labels": (
        edit(no_labels),
        edit(no_labels, set_label(MODEL_LABEL)),
        userinfo(),
        True,
    ),
    "unchanged": (edit(), edit(), userinfo(), True),
    "other-node": (edit(), edit(set_label(OTHER_MODEL_LABEL)), userinfo(node="node-b"), False),
    "token-without-node": (edit(), edit(set_label(OTHER_MODEL_LABEL)), userinfo(node=None), False),
    "token-without-extra": (edit(), edit(set_label(OTHER_MODEL_LABEL)), userinfo(extra=False), False),
    "node-role-added": (edit(), edit(set_label("node-role.kubernetes.io/x", "")), userinfo(), False),
    "node-role-removed": (edit(), edit(drop_label("node-role.kubernetes.io/worker")), userinfo(), False),
    "hostname-changed": (edit(), edit(set_label("kubernetes.io/hostname", "node-b")), userinfo(), False),
    "selector-label-changed": (
        edit(),
        edit(set_label(OTHER_MODEL_LABEL), set_label("gpu", "a100")),
        userinfo(),
        False,
    ),
    "look-alike-prefix": (edit(), edit(set_label("model.weightswarm.io.evil/x", "1")), userinfo(), False),
    "prefix-inside-a-key": (edit(), edit(set_label("x.model.weightswarm.io/y", "1")), userinfo(), False),
    "taint-removed": (edit(), edit(lambda n: n["spec"].pop("taints")), userinfo(), False),
    "taint-added": (
        edit(),
        edit(lambda n: n["spec"]["taints"].append({"key": "evil", "effect": "NoExecute"})),
        userinfo(),
        False,
    ),
    "cordoned": (edit(), edit(lambda n: n["spec"].update(unschedulable=True)), userinfo(), False),
    "annotation-changed": (
        edit(),
        edit(set_label(OTHER_MODEL_LABEL), lambda n: n["metadata"]["annotations"].update(x="1")),
        userinfo(),
        False,
    ),
    "finalizer-added": (
        edit(),
        edit(lambda n: n["metadata"].update(finalizers=["example.com/block"])),
        userinfo(),
        False,
    ),
}


@pytest.fixture(scope="module")
def node_admission(chart: Any) -> Admission:
    return Admission(policy_objects(chart, {}, served=True, name=NODE_POLICY)["ValidatingAdmissionPolicy"])


@pytest.mark.parametrize("case", NODE_CASES.keys())
def test_node_policy_cel_allows_only_model_labels_on_the_own_node(
    node_admission: Admission, case: str
) -> None:
    make_old, make_new, user, allowed = NODE_CASES[case]
    applies, failed = node_admission.review(user, make_new(NODE), make_old(NODE))
    assert applies
    assert (not failed) is allowed, failed
    if case == "other-node":
        (message,) = failed  # nothing else is wrong with that update
        assert "only its own node" in message


def test_node_policy_leaves_other_users_alone(node_admission: Admission) -> None:
    kubelet = userinfo(user="system:node:node-a")
    new = edit(set_label("node-role.kubernetes.io/x", ""))(NODE)
    assert node_admission.review(kubelet, new, copy.deepcopy(NODE)) == (False, [])


def test_node_policy_binds_node_updates_and_follows_node_labels(chart: Any) -> None:
    found = policy_objects(chart, {}, served=True, name=NODE_POLICY)
    policy, binding = found["ValidatingAdmissionPolicy"], found["ValidatingAdmissionPolicyBinding"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    (condition,) = policy["spec"]["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{AGENT}"' in condition["expression"]
    assert binding["spec"] == {"policyName": NODE_POLICY, "validationActions": ["Deny"]}
    assert not policy_objects(chart, {"nodeLabels": {"enabled": False}}, served=True, name=NODE_POLICY)
    assert policy_objects(chart, {"nodeLabels": {"enabled": False}}, served=True)  # the pod policy stays
    assert not policy_objects(chart, {}, served=False, name=NODE_POLICY)


FLEET_VALUES = {
    "defaults": {},
    "dashboard": {
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "weightswarm"},
        }
    },
    "features-off": {"preheat": {"enabled": False}, "nodeLabels": {"enabled": False}},
    "watch-namespace": {"agent": {"watchNamespace": "inference"}},
}


@pytest.mark.parametrize("values", FLEET_VALUES.values(), ids=FLEET_VALUES.keys())
def test_fleet_renders_are_valid_kubernetes(chart: Any, values: dict[str, Any]) -> None:
    for obj in render(chart, values, api_versions=[VAP_API]).values():
        validate(obj)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"preheat": {"enabled": "yes"}}, "at '/preheat/enabled"),
        ({"nodeLabels": {"enabld": True}}, "at '/nodeLabels"),
        ({"grafanaDashboard": {"namespace": "Not_A_Namespace"}}, "at '/grafanaDashboard/namespace"),
        ({"grafanaDashboard": {"labelValue": 1}}, "at '/grafanaDashboard/labelValue"),
        ({"grafanaDashboard": {"annotations": {"a": 1}}}, "at '/grafanaDashboard/annotations"),
    ],
)
def test_schema_rejects_wrong_fleet_values(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, values)
    assert message in str(caught.value)


# --- the Grafana dashboard ---------------------------------------------------------------------


def test_dashboard_is_off_by_default(chart: Any) -> None:
    objects = render(chart, {})
    assert ("ConfigMap", DASHBOARD) not in objects
    assert not [o for o in objects.values() if "grafana_dashboard" in o["metadata"].get("labels", {})]


def dashboard(chart: Any, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    config_map = render(chart, {"grafanaDashboard": {"enabled": True, **values}})[("ConfigMap", DASHBOARD)]
    (body,) = config_map["data"].values()
    return config_map, json.loads(body)


def test_dashboard_config_map_is_labelled_for_the_grafana_sidecar(chart: Any) -> None:
    config_map, board = dashboard(chart, {})
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in config_map["metadata"]
    assert board == json.loads(DASHBOARD_FILE.read_text())
    custom, _ = dashboard(
        chart,
        {
            "label": "grafana.io/dashboard",
            "labelValue": "weightswarm",
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "GPU fleet"},
        },
    )
    assert custom["metadata"]["namespace"] == "monitoring"
    assert custom["metadata"]["labels"]["grafana.io/dashboard"] == "weightswarm"
    assert custom["metadata"]["annotations"] == {"grafana_folder": "GPU fleet"}
    validate(custom)


def test_dashboard_has_a_prometheus_datasource_and_queries_in_every_panel(chart: Any) -> None:
    _, board = dashboard(chart, {})
    assert board["uid"] == "weightswarm" and 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["type"] in {"timeseries", "stat", "table"}, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["expr"].strip() and "weightswarm_" in target["expr"], panel["title"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for wanted in (
        "histogram_quantile(0.95, sum by (le, model) (rate(weightswarm_agent_time_to_ready_seconds_bucket",
        "sum by (le, source)",
        'increase(weightswarm_agent_model_bytes_total{source="origin"',
        "sum by (stage) (weightswarm_agent_fetch_stage",
        "weightswarm_agent_blob_peers",
        "rate(weightswarm_agent_upload_bytes_total",
        "weightswarm_agent_cache_bytes",
        'increase(weightswarm_agent_fetches_total{outcome="failed"',
        "sum by (status) (rate(weightswarm_agent_hf_requests_total",
        "sum by (phase) (weightswarm_agent_preheats",
    ):
        assert wanted in exprs, wanted
    # One vocabulary of sources in every query (issue 63 item 8): the agent's words, no `peer`/`cache_hit`.
    sources = set(re.findall(r'source\s*=~?\s*"([^"]*)"', exprs))
    assert sources and sources <= {"peers", "origin", "cache"}, sources


def exported_metric_names() -> set[str]:
    """Every series name the agent's /metrics can have: the families its registry collects (the
    scrape-time collectors bound to empty state) with their exposition suffixes."""
    metrics = importlib.import_module("agent.http.metrics")
    names = importlib.import_module("agent.core.modelnames").ModelNames(b"k", lambda _repo: False)
    agent_metrics = metrics.AgentMetrics(names)
    snapshot = metrics.SwarmSnapshot(
        **{
            f.name: 0
            for f in dataclasses.fields(metrics.SwarmSnapshot)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
    )
    empty: dict[str, Callable[[], Any]] = {
        "swarm": lambda: snapshot,
        "cache_bytes": lambda: 0,
        "jobs": list,
        "preheats": dict,
    }
    params = list(inspect.signature(agent_metrics.bind_state).parameters)
    assert set(params) <= set(empty), f"bind_state takes {params}: teach this test what to pass"
    agent_metrics.bind_state(**{p: empty[p] for p in params})
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "summary": ["_sum", "_count"],
    }
    names: set[str] = set()
    for family in agent_metrics.registry.collect():
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, []))
        names.update(sample.name for sample in family.samples)
    return names


def test_dashboard_uses_only_metrics_the_agent_exports(chart: Any) -> None:
    """Fails until the agent exports every metric the dashboard charts (agent/http/metrics.py)."""
    _, board = dashboard(chart, {})
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    used = {name for q in queries for name in re.findall(r"weightswarm_[a-z_]+", q)}
    exported = exported_metric_names()
    assert used - exported == set(), f"not exported by the agent: {sorted(used - exported)}"
    assert len(used) >= 10


def test_readme_shows_the_preheat_columns_and_the_example_is_what_the_readme_says() -> None:
    readme = (CHART / "README.md").read_text()
    assert re.search(r"NAME\s+MODEL\s+READY\s+ORIGIN\s+PEERS\s+AGE", readme)
    for command in (
        "kubectl apply -f charts/weightswarm/examples/preheat.yaml",
        "kubectl get mph",
        "kubectl delete mph",
    ):
        assert command in readme
    example = GOOD["the-example"]
    assert example["spec"]["nodeSelector"] == {"gpu": "h100"}
    repo, _, commit = example["spec"]["model"].partition("@")
    assert repo == "Qwen/Qwen2.5-72B-Instruct" and re.fullmatch(r"[0-9a-f]{40}", commit)
    assert "weightswarm.modelLabel" in readme and "weightswarm.modelLabel" in (
        CHART / "templates" / "_helpers.tpl"
    ).read_text()


def test_the_preheat_example_parses_as_the_agent_parses_it() -> None:
    preheat_mod = importlib.import_module("agent.kube.preheat")
    example = copy.deepcopy(GOOD["the-example"])
    example["metadata"]["uid"] = "u1"
    parsed = preheat_mod.parse_preheat(example)
    assert parsed.model.key == example["spec"]["model"]
    assert parsed.selects({"gpu": "h100", "kubernetes.io/hostname": "n1"})
    assert not parsed.selects({"gpu": "a100"})
