"""The node's hub cache and the agent's state beside it: the Hugging Face layout and atomic writes
(`layout`), what is in the cache, pins and least-recently-used eviction, `agent rm` (`eviction`),
and full re-hashing with repair (`verify`). "Evict the LRU model" lives in `eviction.Evictor`.

May import `agent.core` only.
"""
