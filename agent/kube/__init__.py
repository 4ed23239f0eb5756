"""Kubernetes: the pod watcher and the status reporter (`client`: "patch the pod status" is
`StatusReporter`), the fleet side (`fleet`: ModelPreheats, node labels); these two are the only
modules that import the kubernetes client. Free of it: the annotation grammar and per-model request
tracking (`requests`), the ModelPreheat object (`preheat`), the node label rule (`labels`), and the
glue to the daemon's jobs (`podsync`).

May import `agent.fetch` and below; never `agent.daemon` or `agent.http`.
"""
