"""Node labels that say "this node holds model X", so a Deployment can prefer those nodes.

One label per requested model reference, on the agent's own Node:

    model.weightswarm.io/<slug>.<h>: <commit>

`<h>` is the first 10 hex digits of sha256("org/name@rev"), the reference exactly as a pod or a
ModelPreheat asks for it (rev defaults to "main"): unique per reference, and computable in a Helm
template (`weightswarm.modelLabel` in the chart) or with `agent label-key`. `<slug>` is the repo's
name part, cut so the whole name stays within the 63 characters a label name may have; it is there
for people reading `kubectl get nodes --show-labels`, the hash alone decides. The value is the
40-hex commit the node holds (a label value may have 63 characters).
"""

from __future__ import annotations

import hashlib
import re

LABEL_PREFIX = "model.weightswarm.io/"
_HASH_DIGITS = 10
_NAME_MAX = 63  # Kubernetes: the name part of a label key
_SLUG_MAX = _NAME_MAX - _HASH_DIGITS - 1
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def model_label_key(ref_key: str) -> str:
    """The node label key of "org/name@rev" (see the module doc)."""
    name = ref_key.partition("@")[0].rpartition("/")[2]
    slug = _EDGE.sub("", _NOT_LABEL.sub("-", name))
    slug = _EDGE.sub("", slug[:_SLUG_MAX])
    digest = hashlib.sha256(ref_key.encode()).hexdigest()[:_HASH_DIGITS]
    return f"{LABEL_PREFIX}{slug}.{digest}" if slug else f"{LABEL_PREFIX}{digest}"
