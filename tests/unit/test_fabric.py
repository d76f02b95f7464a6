"""The fabric check: which node a set of measured streams blames (scheduler/fabric.py), the learnt baseline, the
job spec's `preflight.bandwidth`, and the node side (scheduler/node/fabric.py) run as real processes on loopback
addresses, with a stranger on the port."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftconsole.scheduler.errors import JobSpecError
from ftconsole.scheduler.fabric import (
    Baselines,
    FabricReport,
    Stream,
    Way,
    for_node_in_service,
    judge,
    shifts,
    streams_of,
)
from ftconsole.scheduler.node import fabric as node_fabric
from ftconsole.scheduler.recovery import _fabric_item
from ftconsole.scheduler.spec.jobspec import JobSpec, parse_jobspec

NAMES = ["a", "b", "c"]


def streams(rates: dict[tuple[str, str], float]) -> list[Stream]:
    return [Stream(src, dst, gbps) for (src, dst), gbps in rates.items()]


def ring(slow: dict[tuple[str, str], float]) -> list[Stream]:
    """Every stream of three nodes (each sends to both others) at 10 Gbit/s, but those given."""
    return streams({(s, d): slow.get((s, d), 10.0) for s in NAMES for d in NAMES if s != d})


def verdicts(results: dict[str, Any]) -> dict[str, str]:
    return {n: r.result for n, r in results.items()}


def test_a_node_whose_every_stream_out_is_slow_fails_and_its_receivers_pass() -> None:
    results = judge(NAMES, ring({("a", "b"): 0.05, ("a", "c"): 0.05}), {}, 5.0, "baseline 10 Gbit/s", 1.0)
    assert verdicts(results) == {"a": "fail", "b": "pass", "c": "pass"}
    assert results["a"].summary.startswith("slow on its way out: sends b 0.05 Gbit/s, c 0.05 Gbit/s")
    assert results["a"].tool == "tcp" and results["a"].test == "fabric"


def test_a_node_whose_every_stream_in_is_slow_from_fast_senders_fails_on_its_way_in() -> None:
    results = judge(NAMES, ring({("a", "c"): 0.1, ("b", "c"): 0.1}), {}, 5.0, "", 1.0)
    assert verdicts(results) == {"a": "pass", "b": "pass", "c": "fail"}
    assert results["c"].summary.startswith("slow on its way in")


def test_one_slow_stream_among_fast_ones_blames_nobody() -> None:
    assert set(verdicts(judge(NAMES, ring({("a", "b"): 0.1}), {}, 5.0, "", 1.0)).values()) == {"pass"}


def test_with_two_nodes_and_one_slow_direction_the_sender_is_blamed() -> None:
    results = judge(["a", "b"], streams({("a", "b"): 0.05, ("b", "a"): 9.0}), {}, 4.5, "", 1.0)
    assert verdicts(results) == {"a": "fail", "b": "pass"}


def test_with_two_nodes_both_ways_slow_the_slower_sender_is_blamed_where_it_stands_out() -> None:
    results = judge(["a", "b"], streams({("a", "b"): 0.05, ("b", "a"): 0.16}), {}, 0.5, "", 1.0)
    assert verdicts(results) == {"a": "fail", "b": "pass"}
    results = judge(["a", "b"], streams({("a", "b"): 0.1, ("b", "a"): 0.12}), {}, 0.5, "", 1.0)
    assert verdicts(results) == {"a": "fail", "b": "fail"}  # no telling which link is bad: both


def test_a_node_that_could_not_take_part_is_an_error_never_a_failure() -> None:
    docs: dict[str, Any] = {
        "a": {"fabric": 1, "index": 0, "received": [], "sent": [], "error": "cannot listen on port 29510: in use"},
        "b": {"fabric": 1, "index": 1, "received": [], "sent": [{"shift": 1, "error": "refused"}], "error": None},
    }
    found, broken = streams_of(["a", "b"], docs)
    assert broken == {"a": "cannot listen on port 29510: in use"}
    assert [(s.src, s.dst, s.gbps) for s in found] == [("a", "b", None), ("b", "a", None)]
    results = judge(["a", "b"], found, broken, 4.5, "", 1.0)
    assert verdicts(results) == {"a": "error", "b": "error"}
    assert "could not take part: cannot listen" in results["a"].summary
    assert "no stream measured" in results["b"].summary


def test_streams_of_reads_only_streams_between_the_set_s_nodes() -> None:
    got = [{"from": 1, "bytes": 125_000_000, "seconds": 1.0}, {"from": 7, "bytes": 10, "seconds": 1.0}]
    doc = {"fabric": 1, "received": [*got, {"from": 0, "bytes": 5, "seconds": 1}]}
    found, _ = streams_of(["a", "b"], {"a": doc, "b": "cannot run on b: refused"})
    assert [(s.src, s.dst, s.gbps) for s in found] == [("a", "b", None), ("b", "a", 1.0)]
    assert found[0].why == "cannot run on b: refused"


def test_shifts_send_to_two_others_from_three_nodes() -> None:
    assert shifts(2) == [1] and shifts(3) == [1, 2] and shifts(8) == [1, 2]


def test_a_fail_names_its_way_and_the_partners_that_saw_it_slow() -> None:
    out = judge(NAMES, ring({("a", "b"): 0.05, ("a", "c"): 0.05}), {}, 5.0, "", 1.0)
    assert (out["a"].way, out["a"].slow_with) == (Way.OUT, ("b", "c"))
    assert (out["b"].way, out["b"].slow_with) == (None, ())
    into = judge(NAMES, ring({("a", "c"): 0.1, ("b", "c"): 0.1}), {}, 5.0, "", 1.0)
    assert (into["c"].way, into["c"].slow_with) == (Way.IN, ("a", "b"))
    # one partner could not take part: a's only measured stream out is slow, with b alone
    lone = [Stream("a", "b", 0.05), Stream("a", "c", None, "refused"), Stream("b", "a", 9.0),
            Stream("b", "c", None, "refused"), Stream("c", "a", None, "refused"), Stream("c", "b", None)]  # fmt: skip
    alone = judge(NAMES, lone, {"c": "cannot run on c: refused"}, 5.0, "", 1.0)
    assert (alone["a"].result, alone["a"].way, alone["a"].slow_with) == ("fail", Way.OUT, ("b",))


@pytest.mark.parametrize(
    ("names", "found", "result"),
    [
        (["a", "b"], streams({("a", "b"): 0.05, ("b", "a"): 9.0}), "skip"),  # one partner: its link may be why
        (NAMES, ring({("a", "b"): 0.05, ("a", "c"): 0.05}), "fail"),  # two partners each saw it slow
        (NAMES, ring({}), "pass"),
    ],
)
def test_a_node_in_service_fails_only_on_two_partners_word(names: list[str], found: list[Stream], result: str) -> None:
    judged = judge(names, found, {}, 5.0, "baseline 10 Gbit/s (min_gbps)", 1.0)["a"]
    kept = for_node_in_service(judged)
    assert kept.result == result
    if result == "skip":
        assert kept.summary == (
            "only b saw it slow: one partner is not enough to take a node in service out (slow on its way out: "
            "sends b 0.05 Gbit/s; receives b 9 Gbit/s; baseline 10 Gbit/s (min_gbps))"
        )
        assert kept.way is Way.OUT and kept.passed
    else:
        assert kept == judged


def test_the_fabric_item_takes_the_way_from_the_result_not_its_words() -> None:
    found = ring({("b", "c"): 0.1, ("a", "c"): 0.2})
    judged = judge(NAMES, found, {}, 5.0, "", 1.0)
    assert judged["c"].way is Way.IN
    # the words reworded: the item still shows c's fastest stream in (0.2), not out (10)
    reworded = {**judged, "c": dataclasses.replace(judged["c"], summary="slow coming in")}
    shown = FabricReport(tuple(NAMES), tuple(found), 5.0, "", reworded)
    assert _fabric_item(shown, "c") == "0.2 Gbit/s 5 Gbit/s"
    assert _fabric_item(shown, "a") == "10 Gbit/s 5 Gbit/s"


def report(found: list[Stream], threshold: float) -> FabricReport:
    return FabricReport(tuple(NAMES), tuple(found), threshold, "", judge(NAMES, found, {}, threshold, "", 0))


async def test_the_learnt_baseline_is_the_median_of_passing_checks_and_survives_a_restart() -> None:
    kept: dict[str, str] = {}

    async def read(key: str) -> str | None:
        return kept.get(key)

    async def write(key: str, value: str) -> None:
        kept[key] = value

    baselines = Baselines(read, write)
    assert await baselines.learnt("h100") is None
    for rate in (10.0, 12.0, 30.0):
        found = [Stream(s.src, s.dst, rate) for s in ring({})]
        await baselines.learn("h100", report(found, 1.0))
    await baselines.learn("h100", report(ring({("a", "b"): 0.01, ("a", "c"): 0.01}), 5.0))
    assert json.loads(kept["fabric.h100"]) == [10.0, 12.0, 30.0, 10.0]  # the slow node's streams are not learnt
    assert await Baselines(read, write).learnt("h100") == 11.0
    assert await baselines.learnt("a100") is None


def parse_job_spec(data: dict[str, Any]) -> JobSpec:
    return parse_jobspec(yaml.safe_dump(data))


def test_the_job_spec_s_bandwidth_check_needs_several_nodes_and_a_resubmit() -> None:
    base = {"name": "x", "command": "true", "mode": "pytorch", "nodes": 2}
    asked = {"preflight": {"bandwidth": True}, "fault_tolerance": {"retries": 1}}
    assert parse_job_spec({**base, **asked}).preflight.bandwidth
    with pytest.raises(JobSpecError, match=r"set fault_tolerance\.retries"):
        parse_job_spec({**base, "preflight": {"bandwidth": True}})
    with pytest.raises(JobSpecError, match="it needs nodes: 2 or more"):
        parse_job_spec({"name": "x", "command": "true", **asked})
    with pytest.raises(JobSpecError, match="preflight"):
        parse_job_spec({**base, "preflight": {"bandwith": True}})


# -- the node side, as real processes -----------------------------------------------------------------------

SCRIPT = Path(node_fabric.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.11", 0))
        return int(s.getsockname()[1])


def _start(index: int, hosts: list[str], port: int, over: dict[str, Any] | None = None) -> subprocess.Popen[bytes]:
    params = {"index": index, "hosts": hosts, "port": port, "shifts": [1], "seconds": 0.3, "timeout": 10,
              "token": "secret", **(over or {})}  # fmt: skip
    return subprocess.Popen([sys.executable, str(SCRIPT), json.dumps(params)], stdout=subprocess.PIPE)


def _doc(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=30)
    return dict(json.loads(out))


def test_two_nodes_measure_each_other_and_a_stranger_on_the_port_is_not_counted() -> None:
    hosts, port = ["127.0.0.11", "127.0.0.12"], _free_port()
    first = _start(0, hosts, port)
    stranger_done = threading.Event()

    def stranger() -> None:  # a user's process of node 0: connects first, claims to be node 1, trickles bytes
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not stranger_done.is_set():
            try:
                s = socket.create_connection(("127.0.0.11", port), timeout=1)
            except OSError:
                time.sleep(0.02)
                continue
            with s, contextlib.suppress(OSError):  # the node hangs up on it: what it sends next fails
                s.sendall(json.dumps({"token": "guess", "from": 1, "shift": 1}).encode() + b"\n")
                stranger_done.set()
                for _ in range(5):
                    s.sendall(b"x")
                    time.sleep(0.05)
            stranger_done.set()

    thread = threading.Thread(target=stranger)
    thread.start()
    try:
        assert stranger_done.wait(10)
        second = _start(1, hosts, port, {"after": True})  # sends once it has read the first's stream
        docs = [_doc(first), _doc(second)]
    finally:
        first.kill()
        first.communicate(timeout=10)
        thread.join(10)
    for index, doc in enumerate(docs):
        assert doc["error"] is None
        (got,) = doc["received"]
        assert got["from"] == 1 - index and got["bytes"] > 1_000_000 and got["seconds"] > 0
        (sent,) = doc["sent"]
        assert sent["to"] == 1 - index and sent["error"] is None


def test_a_node_whose_port_is_taken_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.11", 0))
        taken.listen(1)
        doc = _doc(_start(0, ["127.0.0.11", "127.0.0.12"], int(taken.getsockname()[1]), {"timeout": 2}))
    assert doc["error"].startswith("cannot listen on port")


@pytest.mark.parametrize("bad", [{"hosts": ["127.0.0.11"]}, {"shifts": [2]}, {"token": ""}, {"index": 5}])
def test_bad_parameters_are_an_error_not_a_measurement(bad: dict[str, Any]) -> None:
    doc = _doc(_start(0, ["127.0.0.11", "127.0.0.12"], _free_port(), bad))
    assert doc["error"].startswith("bad parameters") and doc["received"] == [] and doc["sent"] == []


def test_run_fabric_in_this_process_reports_a_peer_that_never_came() -> None:
    doc = asyncio.run(asyncio.to_thread(node_fabric.run_fabric, {
        "index": 0, "hosts": ["127.0.0.11", "127.0.0.12"], "port": _free_port(), "shifts": [1], "seconds": 0.2,
        "timeout": 1.0, "token": "t"}))  # fmt: skip
    assert doc["received"] == [] and doc["sent"][0]["error"] and doc["sent"][0]["bytes"] == 0
