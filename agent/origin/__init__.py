"""Where a model comes from when no peer has it: the origin interface (`base.Kind`) and its kinds (`hub`,
`bucket`), registered by URL scheme in `kinds`; `client.Origin` wraps any kind with the retries and
patience ("retry a 429 from the origin" lives in `client.Origin.retrying`); `ranges` is the parallel range
download of one blob into the cache, shared by every kind.

May import `agent.cache` and `agent.core`.
"""
