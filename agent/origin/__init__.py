"""The origin hub (huggingface.co or any HF-compatible hub): its HTTP API, errors and retries
(`client`: "retry a 429 from the origin" lives in `client.OriginClient.retrying`) and the parallel
range download of one blob into the cache (`ranges`).

May import `agent.cache` and `agent.core`.
"""
