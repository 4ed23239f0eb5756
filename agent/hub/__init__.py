"""An HF-compatible origin hub serving a directory (tests, benchmarks, air-gapped clusters).

`agent.hub.server.HubServer` serves `root/<org>/<name>/` as model repos (`repos`: commits and blob ids,
`access`: who may read what, decided as huggingface.co decides it, `ranges`, `faults` for tests);
`agent.hub.testmodel` writes deterministic safetensors test models into that layout, sharing files
between repos as the real Hub's do.

May import `agent.cache`, `agent.core` and `tracker.auth`; nothing but the CLI imports it.
"""
