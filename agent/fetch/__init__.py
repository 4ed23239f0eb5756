"""Getting a model into the cache: planning a snapshot from the origin or the tracker (`engine`,
`planning`), the engine that fetches its missing blobs from a source and makes them visible
(`engine`), safetensors checks, the daemon's fetch jobs (`jobs`, `job`) and `agent publish`.

May import `agent.swarm`, `agent.origin`, `agent.cache` and `agent.core`.
"""
