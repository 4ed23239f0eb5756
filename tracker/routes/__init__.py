"""The JSON API's routers, one module per concern; `tracker.api.create_api` wires them together.

Each router is built by a function that takes only what it uses: the settings, the narrow store
interface of its concern (`tracker.store`), the metrics, and the role checks (`access.Access`).
"""
