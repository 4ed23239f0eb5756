"""What the tests share, so no test file starts servers its own way:

- `procs`: bounded waits (`loop_until`), free ports, stopping processes by PID, `require` (a missing
  dependency fails under CI and skips locally);
- `cluster`: the real origin (HubServer), tracker (`tracker serve` subprocess) and agents (in-process
  daemons or `agent serve` subprocesses) on 127.0.0.1, as pytest fixtures (loaded by tests/conftest.py);
- `trackerkit`: the tracker's app in-process (`run_server`), its settings and stores (`store_settings`
  runs a test against SQLite and Redis), torrent and peer helpers;
- `fetchkit`: a small model on a real test hub and settings for the fetch engine;
- `hostile_relay`: a relay source that misbehaves on purpose (closes, stalls, trickles, records who asks);
- `ocikit`: a real OCI registry (Debian's docker-registry) with Basic or token auth, its access log as
  the count of what it served, a storage host it redirects blob reads to, and the OCI API pusher
  (bench.oci_push, which the registry benchmark shares);
- `kube_memory`: the in-memory twin of the agent's Kubernetes port (agent.kube.api), for the watchers and
  podsync without HTTP; `fake_kube`: the same store served over HTTP as a loopback API server speaking
  list/watch, for the real kubernetes client (agent.kube.adapter); `kube_api`: what their patches,
  selectors, objects and watch events mean, as a real API server means them.
"""
