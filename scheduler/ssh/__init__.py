"""The SSH seam: everything that talks to a node.

`transport` is the one narrow interface in front of every remote command (a persistent connection per node,
keepalives, timeouts); on it, `runs` starts, reads and stops runs through the run supervisor, `probing` runs the
probe agent, `nodecache` keeps both programs on the node by hash, `silence` times a node's silence, `ciphers`
picks the SSH ciphers, `channel` keeps the node channels, and `shell` builds the debug terminal's ssh argv.

May import `scheduler.errors`, `scheduler.spec`, `scheduler.decide`, `scheduler.node` and `probes`; never the
store, the socket or the loop.
"""
