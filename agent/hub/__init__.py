"""An HF-compatible origin hub serving a directory (tests, benchmarks, air-gapped clusters).

`agent.hub.server.HubServer` serves `root/<org>/<name>/` as model repos, answering as huggingface.co does
in 2026 or did in 2024 (`handler`: the routes, `sending`: file bodies, `cdn`: signed CDN URLs,
`ratelimit`: the Hub's request limits, `records`: what it saw; `repos`: commits and blob ids, `access`:
who may read what, decided as huggingface.co decides it, `ranges`, `faults` for tests);
`agent.hub.testmodel` writes deterministic safetensors test models into that layout, sharing files
between repos as the real Hub's do.

May import `agent.cache`, `agent.core` and `wirekit`; nothing but the CLI imports it.
"""
