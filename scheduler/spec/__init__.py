"""What people write, checked: the cluster config and the job spec, each a pydantic model whose every problem
names the file, the line and the key path.

Pure (tests/unit/test_layers.py): imports the standard library, pydantic, yaml, ClusterShell,
`scheduler.errors`, this folder and `scheduler.node`'s constants; never the SSH layer, the store or the socket.
"""
