"""The decisions, pure: data in, decision out, tested from tables without SSH, a store or a clock.

Jobs and their statuses, placement (its inputs and its index), elastic sizing, launch planning (every launcher's
argv, env and files; the steps of a run), reconcile (the loop's table: what to do with each run), the hang and
slow detectors, what a node's run status says, and the cluster view.

Pure (tests/unit/test_layers.py): imports the standard library, pydantic, `scheduler.errors`, `scheduler.spec`,
`scheduler.node`'s constants, `probes` and this folder; never the SSH layer, the store, the socket or asyncio.
"""
