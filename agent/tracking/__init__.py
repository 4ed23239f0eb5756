"""The tracker's client: leases, metainfo, manifests, peers and the relay's directory entries, over
the tracker's HTTP API (`client.TrackerClient`). Below every transport and the fetch policy; imports
only `agent.core`."""
