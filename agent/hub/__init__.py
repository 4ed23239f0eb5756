"""An HF-compatible origin hub serving a directory (tests, benchmarks, air-gapped clusters).

`agent.hub.server.HubServer` serves `root/<org>/<name>/` as model repos; `agent.hub.testmodel.make_model`
writes deterministic safetensors test models into that layout.
"""
