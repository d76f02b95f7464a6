"""The console's node list by change (`nodes_changed`, scheduler/serve/nodelist.py): a caller with a cursor is
answered only the nodes whose brief view changed since, and the names only when a node came or went."""

from __future__ import annotations

from typing import Any

from ftconsole.scheduler.serve.nodelist import FORGET_AFTER_S, NodeChanges, brief_node


def node(name: str, util: float = 0.0, **more: Any) -> dict[str, Any]:
    return {"name": name, "state": "healthy", "last_probe": 100.0, "last_probe_age_s": 1.5, "held": [],
            "checks": [{"name": "disk"}], "facts": {"load1": 1.0},
            "gpus": [{"index": 0, "name": "H100", "utilization": util, "temperature": 40.0}], **more}  # fmt: skip


def names(reply: dict[str, Any]) -> list[str]:
    return [n["name"] for n in reply["nodes"]]


def test_a_brief_view_has_no_checks_facts_or_probe_age_and_three_fields_per_gpu() -> None:
    brief = brief_node(node("a", 50.0))
    assert brief.keys() == {"name", "state", "last_probe", "held", "gpus"}
    assert brief["gpus"] == [{"index": 0, "name": "H100", "utilization": 50.0}]


def test_a_cursor_answers_only_what_changed_since() -> None:
    changes = NodeChanges()
    first = changes.changed(None, [node("a"), node("b"), node("c")], None)
    assert names(first) == ["a", "b", "c"] and first["names"] == ["a", "b", "c"]

    # the probe's age moves with the clock alone: not a change
    same = changes.changed(None, [node("a", last_probe_age_s=9.0), node("b"), node("c")], first["cursor"])
    assert same["nodes"] == [] and same["names"] is None

    moved = changes.changed(None, [node("a"), node("b", 80.0), node("c", state="drained")], same["cursor"])
    assert names(moved) == ["b", "c"] and moved["names"] is None
    assert moved["nodes"][0]["gpus"][0]["utilization"] == 80.0

    # an older cursor still gets everything changed since it
    again = changes.changed(None, [node("a"), node("b", 80.0), node("c", state="drained")], first["cursor"])
    assert names(again) == ["b", "c"]


def test_a_node_that_comes_or_goes_sends_the_names() -> None:
    changes = NodeChanges()
    cursor = changes.changed(None, [node("a"), node("b")], None)["cursor"]
    gone = changes.changed(None, [node("a")], cursor)
    assert gone["nodes"] == [] and gone["names"] == ["a"]
    came = changes.changed(None, [node("a"), node("d")], gone["cursor"])
    assert names(came) == ["d"] and came["names"] == ["a", "d"]


def test_an_unknown_or_malformed_cursor_answers_everything() -> None:
    changes, other = NodeChanges(), NodeChanges()
    changes.changed(None, [node("a")], None)
    foreign = other.changed(None, [node("a")], None)["cursor"]  # another scheduler's (a restart, a new leader)
    for cursor in (foreign, "nonsense", "x:y", 12, None, foreign.split(":")[0] + ":99999"):
        reply = changes.changed(None, [node("a")], cursor)
        assert names(reply) == ["a"] and reply["names"] == ["a"], cursor


def test_each_caller_has_its_own_cursor_and_views() -> None:
    changes = NodeChanges()
    root = changes.changed(None, [node("a", held=[{"gpu": 0, "job": 7}])], None)["cursor"]
    ann = changes.changed(1000, [node("a", held=[{"gpu": 0, "job": None, "private": True}])], None)["cursor"]
    # the job ends: both see the change, each from their own cursor, and then nothing more
    ended = changes.changed(None, [node("a")], root)
    assert ended["nodes"] == [brief_node(node("a"))]
    later = changes.changed(1000, [node("a")], ann)
    assert later["nodes"] == [brief_node(node("a"))]
    assert changes.changed(None, [node("a")], ended["cursor"])["nodes"] == []
    assert changes.changed(1000, [node("a")], later["cursor"])["nodes"] == []


def test_the_longest_unseen_caller_is_forgotten_and_then_answered_everything() -> None:
    changes = NodeChanges(keep=2)
    first = changes.changed(1, [node("a")], None)["cursor"]
    changes.changed(2, [node("a")], None)
    changes.changed(3, [node("a")], None)  # caller 1 is forgotten
    reply = changes.changed(1, [node("a")], first)
    assert names(reply) == ["a"] and reply["names"] == ["a"]


def test_a_caller_unseen_for_minutes_is_forgotten() -> None:
    now = [0.0]
    changes = NodeChanges(clock=lambda: now[0])
    first = changes.changed(1, [node("a")], None)["cursor"]
    now[0] += FORGET_AFTER_S + 1
    changes.changed(2, [node("a")], None)  # caller 1's copy of every node is let go
    assert len(changes._callers) == 1
    reply = changes.changed(1, [node("a")], first)
    assert names(reply) == ["a"] and reply["names"] == ["a"]


def test_patches_are_the_keys_that_changed_and_only_at_the_newest_cursor() -> None:
    changes = NodeChanges()
    first = changes.changed(None, [node("a"), node("b")], None, patches=True)
    assert names(first) == ["a", "b"] and first["patches"] == []  # nothing held yet: whole views

    moved = changes.changed(None, [node("a", 80.0, last_probe=101.0), node("b")], first["cursor"], patches=True)
    assert moved["nodes"] == []
    assert moved["patches"] == [{"name": "a", "last_probe": 101.0, "gpus_utilization": [80.0]}]

    # GPUs that differ by more than their utilisation come whole
    other = node("a", 80.0, last_probe=101.0, gpus=[{"index": 0, "name": "H200", "utilization": 80.0}])
    renamed = changes.changed(None, [other, node("b")], moved["cursor"], patches=True)
    assert renamed["patches"] == [{"name": "a", "gpus": [{"index": 0, "name": "H200", "utilization": 80.0}]}]
    back = changes.changed(None, [node("a", 80.0, last_probe=101.0), node("b")], renamed["cursor"], patches=True)
    assert back["patches"] == [{"name": "a", "gpus": [{"index": 0, "name": "H100", "utilization": 80.0}]}]

    # a view with another set of keys comes whole
    grown = changes.changed(
        None, [node("a", 80.0, last_probe=101.0), node("b", flaky=True)], back["cursor"], patches=True
    )
    assert names(grown) == ["b"] and grown["patches"] == []

    # an older cursor (a reply lost on the way) is not the caller's newest: whole views since it
    again = changes.changed(
        None, [node("a", 70.0, last_probe=102.0), node("b", flaky=True)], first["cursor"], patches=True
    )
    assert names(again) == ["a", "b"] and again["patches"] == []

    # without `patches`, as before
    plain = changes.changed(None, [node("a", 60.0, last_probe=103.0), node("b", flaky=True)], again["cursor"])
    assert names(plain) == ["a"] and "patches" not in plain


def test_each_console_of_a_caller_has_its_own_chain_of_cursors() -> None:
    """Two consoles of one caller (two admins, or a user's console and script) each get only what changed since
    their own read, as patches; a fifth chain of one caller starts over the longest unseen of theirs, not another
    caller's."""
    changes = NodeChanges()
    views = [node("a"), node("b")]
    one = changes.changed(None, views, None, patches=True)["cursor"]
    two = changes.changed(None, views, None, patches=True)["cursor"]
    for probe in range(2, 6):
        views = [node("a", 10.0 * probe, last_probe=100.0 + probe), node("b")]
        first = changes.changed(None, views, one, patches=True)
        second = changes.changed(None, views, two, patches=True)
        for reply in (first, second):
            assert reply["nodes"] == [] and [p["name"] for p in reply["patches"]] == ["a"]
        one, two = first["cursor"], second["cursor"]
    assert changes.changed(None, views, one, patches=True)["patches"] == []

    other = changes.changed(7, views, None)["cursor"]
    for _ in range(4):  # four more chains of the admins: theirs go, the longest unseen first
        changes.changed(None, views, None)
    assert names(changes.changed(None, views, one)) == ["a", "b"]  # forgotten: everything again
    assert changes.changed(7, views, other)["nodes"] == []  # caller 7's chain is still there


def test_a_change_of_the_nodes_order_sends_the_names() -> None:
    changes = NodeChanges()
    cursor = changes.changed(None, [node("a"), node("b"), node("c")], None)["cursor"]
    reordered = changes.changed(None, [node("b"), node("c"), node("a")], cursor)  # a reload, or a node re-added
    assert reordered["names"] == ["b", "c", "a"] and reordered["nodes"] == []


def test_what_a_caller_may_see_is_masked_in_the_brief_as_in_the_whole_view() -> None:
    """`shown` masks the brief view (what the API does for a caller with hidden jobs, `seen_by`): the same as
    masking the whole view first, which walked its checks and facts too."""
    from ftconsole.scheduler.redaction import HIDDEN_JOB, redact_json
    from ftconsole.scheduler.serve.nodelist import mask_held, seen_by

    hidden = frozenset({7})
    view = node("a", 50.0, state="isolated", reasons=["isolated: job 7 attempt 1: hardware fault"],
                held=[{"gpu": 0, "job": 7}], held_for_debug=[{"gpu": 1, "job": 8, "until": 5.0}])  # fmt: skip

    def shown(v: dict[str, Any]) -> dict[str, Any]:
        return seen_by(v, hidden)

    (brief,) = NodeChanges().changed(1, [view], None, shown=shown)["nodes"]
    assert brief == brief_node(redact_json(mask_held(view, hidden), hidden))
    assert seen_by(view, hidden) == redact_json(mask_held(view, hidden), hidden)
    assert brief["reasons"] == [f"isolated: {HIDDEN_JOB}"] and brief["held"] == [
        {"gpu": 0, "job": None, "private": True}
    ]
    assert brief["held_for_debug"] == [{"gpu": 1, "job": 8, "until": 5.0}]
