"""Serving pieces both services use (`agent serve`'s listeners, `tracker serve`): uvicorn with limits on
what one listener may hold (agent.daemon.listeners, tracker.cli).

A package of its own: the tracker must not import the agent, and neither owns this. Imports neither
`agent` nor `tracker` (an import-linter contract).
"""
