"""What a caller who may not see a job reads of the nodes, through the real API handlers (`nodes_changed`, `nodes`
whole and brief) over real node views that name the job everywhere a view can: masked after the view is made
brief, the same as masking the whole view first (what the handlers did before), and nothing of the job left."""

from __future__ import annotations

import asyncio
import json
import types
from typing import Any

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.scheduler.climbs import Climb
from ftconsole.scheduler.nodeops import NodeView
from ftconsole.scheduler.redaction import redact_json
from ftconsole.scheduler.serve.daemon import Operations
from ftconsole.scheduler.serve.nodelist import NodeChanges, brief_node, mask_held
from ftconsole.scheduler.serve.pictures import PictureOps
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.store.records import StoredProbe

HIDDEN = frozenset({7})
SECRETS = ("job 7", "job #7", '"job": 7', "secret-7", '"preempted_by": 7')


def views() -> list[NodeView]:
    named = NodeHealth("n1", NodeState.UNHEALTHY, ("isolated: job 7 attempt 1: xid 79 (bob's secret-7)",),
                       admin=NodeState.DRAINED, admin_reason="for job #7 debug", last_probe=1.0)  # fmt: skip
    probe = StoredProbe("n1", 1.0, "unreachable: during job 7 (bob)",
                        {"gpus": [{"index": 0, "name": "H100", "utilization": 9, "serial": "x"}],
                         "checks": [{"detail": "job 7"}], "facts": {"f": "job 7"}})  # fmt: skip
    return [
        NodeView(Node("n1", "h1", None, None, "p", {"rack": "r1"}), named, probe, 1.0, held=((0, 7), (1, 8)),
                 held_for_debug=((2, 7, 5.0),),
                 tests=({"test": "gpu", "data": {"summary": "after job 7 (secret-7)", "preempted_by": 7}},),
                 repair=Climb("n1", "ann", "isolated after job 7", 0.0)),
        NodeView(Node("n2", "h2", None, None, "p", {}), NodeHealth("n2", NodeState.HEALTHY, ("ok",), last_probe=1.0),
                 None, 1.0, held=((0, 8),)),
    ]  # fmt: skip


def test_a_caller_reads_the_nodes_masked_as_before_and_nothing_of_a_hidden_job() -> None:
    async def nodes(nodeset: Any = None) -> list[NodeView]:
        return views()

    async def hidden(caller: Any) -> frozenset[int]:
        return HIDDEN

    scheduler = types.SimpleNamespace(service=types.SimpleNamespace(nodes=nodes))
    pictures = PictureOps.__new__(PictureOps)
    pictures.ops = types.SimpleNamespace(scheduler=scheduler, _hidden=hidden)  # type: ignore[assignment]
    pictures._node_changes = NodeChanges()
    caller = types.SimpleNamespace(uid=1001, user="eve")
    before = [brief_node(redact_json(mask_held(v.to_json(), HIDDEN), HIDDEN)) for v in views()]

    async def read() -> tuple[Any, ...]:
        first = await pictures.nodes_changed(caller, {"since": None})  # type: ignore[arg-type]
        again = await pictures.nodes_changed(caller, {"since": first["cursor"], "patches": True})  # type: ignore[arg-type]
        ops = types.SimpleNamespace(scheduler=scheduler, _hidden=hidden)
        brief = await Operations._nodes(ops, caller, {"brief": True})  # type: ignore[arg-type]
        whole = await Operations._nodes(ops, caller, {})  # type: ignore[arg-type]
        return first, again, brief, whole

    first, again, brief, whole = asyncio.run(read())
    assert first["nodes"] == before and brief == before
    assert whole == [redact_json(mask_held(v.to_json(), HIDDEN), HIDDEN) for v in views()]
    assert again["nodes"] == [] and again["patches"] == []
    for answer in (first, brief, whole):
        text = json.dumps(answer)
        assert not [s for s in SECRETS if s in text], text
    assert first["nodes"][0]["held"] == [{"gpu": 0, "job": None, "private": True}, {"gpu": 1, "job": 8}]
