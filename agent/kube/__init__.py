"""Kubernetes: the pod watcher and the status reporter, the only module that imports the
kubernetes client (`client`: "patch the pod status" is `StatusReporter`), the annotation grammar
and per-model request tracking (`requests`), and the glue to the daemon's jobs (`podsync`).

May import `agent.fetch` and below; never `agent.daemon` or `agent.http`.
"""
