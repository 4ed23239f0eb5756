"""The chart's ValidatingAdmissionPolicy: rendered when the cluster serves the API (or forced),
bound to the agent's ServiceAccount, and its CEL evaluated with cel-python on the patches the
trust model says it must allow (the status annotation, on the agent's own node) and deny.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.chartkit import AGENT_SA_USER, NAMESPACE, VAP_API, VAP_NAME, notes, render
from tests.support.procs import require_module


def policy_objects(
    chart: Any, values: dict[str, Any], served: bool, name: str = VAP_NAME
) -> dict[str, dict[str, Any]]:
    """The policy called `name` and its binding, by kind (the node-labels policy: test_chart_fleet.py)."""
    objects = render(chart, values, api_versions=[VAP_API] if served else [])
    return {
        kind: obj
        for (kind, obj_name), obj in objects.items()
        if kind.startswith("ValidatingAdmissionPolicy") and obj_name == name
    }


@pytest.mark.parametrize(
    ("enabled", "served", "created"),
    [("auto", True, True), ("auto", False, False), (True, False, True), (False, True, False)],
)
def test_admission_policy_follows_the_cluster_or_the_value(
    chart: Any, enabled: str | bool, served: bool, created: bool
) -> None:
    found = policy_objects(chart, {"admissionPolicy": {"enabled": enabled}}, served)
    assert bool(found) is created
    note = notes(chart, {"admissionPolicy": {"enabled": enabled}}, [VAP_API] if served else [])
    assert ("no ValidatingAdmissionPolicy" in note) is not created
    # The note gives the reason that applies: the value, or a cluster that does not serve the API.
    assert ("admissionPolicy.enabled=false" in note) is (enabled is False)
    assert ("does not serve" in note) is (not created and enabled is not False)


def test_admission_policy_binds_the_agent_updates_of_pods(chart: Any) -> None:
    found = policy_objects(chart, {}, served=True)
    policy, binding = found["ValidatingAdmissionPolicy"], found["ValidatingAdmissionPolicyBinding"]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["metadata"]["name"] == VAP_NAME
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    assert binding["spec"] == {"policyName": VAP_NAME, "validationActions": ["Deny"]}
    sa = policy_objects(chart, {"serviceAccount": {"name": "custom"}}, served=True)
    (condition,) = sa["ValidatingAdmissionPolicy"]["spec"]["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:custom"' in condition["expression"]


# The pod the agent on node-a reports on, as the API server holds it (oldObject).
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "vllm-0",
        "namespace": "ml",
        "uid": "0f0e9d1c-0000-4000-8000-000000000001",
        "labels": {"app": "vllm"},
        "annotations": {"weightswarm.io/models": "Qwen/Qwen2.5-7B-Instruct"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "vllm-7d4",
                "uid": "rs-1",
                "controller": True,
            }
        ],
    },
    "spec": {
        "nodeName": "node-a",
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.8.5"}],
    },
}
STATUS = "weightswarm.io/status"
NODE_KEY = "authentication.kubernetes.io/node-name"


def userinfo(node: str | None = "node-a", user: str = AGENT_SA_USER, extra: bool = True) -> dict[str, Any]:
    info: dict[str, Any] = {"username": user, "uid": "sa-uid", "groups": ["system:serviceaccounts"]}
    if extra:
        info["extra"] = {"authentication.kubernetes.io/pod-name": ["ws-weightswarm-agent-x1"]}
        if node is not None:
            info["extra"][NODE_KEY] = [node]
    return info


def edit(*steps: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(pod: dict[str, Any]) -> dict[str, Any]:
        pod = copy.deepcopy(pod)
        for step in steps:
            step(pod)
        return pod

    return apply


def set_status(pod: dict[str, Any]) -> None:
    pod["metadata"].setdefault("annotations", {})[STATUS] = (
        '{"Qwen/Qwen2.5-7B-Instruct@main":{"phase":"Ready"}}'
    )


def old_had_status(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"][STATUS] = '{"Qwen/Qwen2.5-7B-Instruct@main":{"phase":"Downloading"}}'


def no_annotations(pod: dict[str, Any]) -> None:
    del pod["metadata"]["annotations"]


# (old pod, new pod, caller) -> allowed? Expectations from the trust model: the agent may write
# its status annotation on pods of its own node, and nothing else.
CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any], dict[str, Any], bool]] = {
    "status-added-on-own-node": (edit(), edit(set_status), userinfo(), True),
    "status-updated-on-own-node": (edit(old_had_status), edit(set_status), userinfo(), True),
    "status-on-a-pod-without-annotations": (
        edit(no_annotations),
        edit(no_annotations, set_status),
        userinfo(),
        True,
    ),
    "status-removed": (edit(old_had_status), edit(), userinfo(), True),
    "unchanged": (edit(), edit(), userinfo(), True),
    "other-node": (edit(), edit(set_status), userinfo(node="node-b"), False),
    "token-without-node": (edit(), edit(set_status), userinfo(node=None), False),
    "token-without-extra": (edit(), edit(set_status), userinfo(extra=False), False),
    "unscheduled-pod": (
        edit(lambda p: p["spec"].pop("nodeName")),
        edit(lambda p: p["spec"].pop("nodeName"), set_status),
        userinfo(),
        False,
    ),
    "label-changed": (
        edit(),
        edit(set_status, lambda p: p["metadata"]["labels"].update(app="x")),
        userinfo(),
        False,
    ),
    "label-added": (edit(), edit(lambda p: p["metadata"]["labels"].update(extra="1")), userinfo(), False),
    "labels-removed": (edit(), edit(set_status, lambda p: p["metadata"].pop("labels")), userinfo(), False),
    "other-annotation-changed": (
        edit(),
        edit(
            set_status, lambda p: p["metadata"]["annotations"].update({"weightswarm.io/models": "evil/model"})
        ),
        userinfo(),
        False,
    ),
    "other-annotation-removed": (
        edit(),
        edit(set_status, lambda p: p["metadata"]["annotations"].pop("weightswarm.io/models")),
        userinfo(),
        False,
    ),
    "other-annotation-added": (
        edit(),
        edit(set_status, lambda p: p["metadata"]["annotations"].update({"kubectl.kubernetes.io/x": "1"})),
        userinfo(),
        False,
    ),
    "image-changed": (
        edit(),
        edit(set_status, lambda p: p["spec"]["containers"][0].update(image="evil/image:1")),
        userinfo(),
        False,
    ),
    "owner-references-dropped": (
        edit(),
        edit(set_status, lambda p: p["metadata"].pop("ownerReferences")),
        userinfo(),
        False,
    ),
    "finalizer-added": (
        edit(),
        edit(set_status, lambda p: p["metadata"].update(finalizers=["example.com/block"])),
        userinfo(),
        False,
    ),
}


class Admission:
    """Evaluates a ValidatingAdmissionPolicy's CEL as the API server does: matchConditions decide
    whether it applies, variables are bound, and every validation must be true; an evaluation
    error counts as a denial (failurePolicy: Fail)."""

    def __init__(self, policy: dict[str, Any]) -> None:
        self.celpy = require_module("celpy", "cel-python: pip install -e '.[dev]' (./dev does)")
        self.env = self.celpy.Environment()
        self.spec = policy["spec"]

    def _eval(self, expression: str, activation: dict[str, Any]) -> Any:
        return self.env.program(self.env.compile(expression)).evaluate(activation)

    def review(
        self, user: dict[str, Any], new: dict[str, Any], old: dict[str, Any]
    ) -> tuple[bool, list[str]]:
        """(applies, messages of the failed validations)."""
        to_cel = self.celpy.json_to_cel
        # Cluster-scoped objects (nodes) have no namespace: the request's is then "".
        request = {"operation": "UPDATE", "userInfo": user, "namespace": new["metadata"].get("namespace", "")}
        activation: dict[str, Any] = {
            "request": to_cel(request),
            "object": to_cel(new),
            "oldObject": to_cel(old),
        }
        if not all(
            bool(self._eval(c["expression"], activation)) for c in self.spec.get("matchConditions", [])
        ):
            return False, []
        types = self.celpy.celtypes
        bound = types.MapType({})
        for variable in self.spec.get("variables", []):  # in order: a variable may use the earlier ones
            activation["variables"] = bound
            bound = types.MapType(
                {**bound, types.StringType(variable["name"]): self._eval(variable["expression"], activation)}
            )
        activation["variables"] = bound
        failed = []
        for validation in self.spec["validations"]:
            try:
                ok = self._eval(validation["expression"], activation)
            except self.celpy.CELEvalError:
                ok = False
            if not (isinstance(ok, types.BoolType) and bool(ok)):
                failed.append(validation["message"])
        return True, failed


@pytest.fixture(scope="module")
def admission(chart: Any) -> Admission:
    return Admission(policy_objects(chart, {}, served=True)["ValidatingAdmissionPolicy"])


@pytest.mark.parametrize("case", CASES.keys())
def test_admission_policy_cel_allows_only_status_patches_on_the_own_node(
    admission: Admission, case: str
) -> None:
    make_old, make_new, user, allowed = CASES[case]
    applies, failed = admission.review(user, make_new(POD), make_old(POD))
    assert applies
    assert (not failed) is allowed, failed
    if case == "other-node":
        (message,) = failed  # nothing else is wrong with that patch
        assert "only pods on its own node" in message


def test_admission_policy_leaves_other_users_alone(admission: Admission) -> None:
    controller = userinfo(user="system:serviceaccount:kube-system:replicaset-controller")
    new = edit(lambda p: p["metadata"]["labels"].update(app="x"))(POD)
    assert admission.review(controller, new, POD) == (False, [])
