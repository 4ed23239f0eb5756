"""The relay: a blob still arriving (or held whole) streamed over HTTP from the node that has it to the
nodes that want it, hop by hop, before BitTorrent could (it needs the blob's metainfo).

`directory`: who relays which blob (through the tracker), the relay credential, blobs in parts;
`admission`: which sources a receiver takes; `receiver`: pulling a blob (or a part of one) from them
into the cache, `splicing` moving its bytes from the socket into the file in the kernel; `routes`: the
network listener's `/v1/relay/{blob}` route that serves it.
"""
