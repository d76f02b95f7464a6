"""A job user's words, kept and shown without terminal escapes, and sent to chat without mentions (issue 40, part
7): the cleaning helper and Slack's escaping from tables, then each place that applies them (a run's status, the
evidence of a hang, the CLI's text, a notification's payload)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from ftconsole.debug_cli import evidence_text
from ftconsole.format import format_table, printable
from ftconsole.scheduler import evidence
from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.decide.runstatus import RunStatus
from ftconsole.scheduler.decide.usertext import clean, clean_json
from ftconsole.scheduler.serve.payloads import AlertInfo, alert_payload, chat_escape, coalesced_payload, one_line
from ftconsole.scheduler.store.records import StoredAlert

HOSTILE = "\x1b]0;pwned\x07\x1b[2J"  # set the window's title, clear the screen
EVERY_CONTROL = "".join(chr(c) for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)])


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("plain text", "plain text"),
        ("", ""),
        ("two\nlines\tand a tab", "two\nlines\tand a tab"),  # newline and tab stay
        (HOSTILE + "boom", "]0;pwned[2Jboom"),  # OSC and CSI: their introducer (ESC) and BEL go
        ("\x1b[31mred\x1b[0m", "[31mred[0m"),
        ("\x1bP+q\x1b\\", "P+q\\"),  # DCS ... ST
        ("\x1b]52;c;cm0gLXJmIH4=\x07", "]52;c;cm0gLXJmIH4="),  # OSC 52: write the clipboard
        ("\x9b2J\x9d0;title\x9c", "2J0;title"),  # C1 CSI, OSC and ST in one byte each
        ("crlf\r\nline", "crlf\nline"),
        ("back\bspace, bell\a, form\x0cfeed, vt\x0b, nul\x00, del\x7f", "backspace, bell, formfeed, vt, nul, del"),
        (EVERY_CONTROL, "\t\n"),
        ("non-ASCII stays: é ü 你好 — … ✓ \xa0", "non-ASCII stays: é ü 你好 — … ✓ \xa0"),  # 0xa0 is past C1
        ("<!channel> & <@U123>", "<!channel> & <@U123>"),  # not a terminal's business: chat escapes it
    ],
)
def test_clean_drops_every_control_character_but_newline_and_tab(text: str, kept: str) -> None:
    assert clean(text) == kept
    assert clean(kept) == kept  # and cleaning again changes nothing


def test_clean_json_cleans_every_string_keys_too_and_leaves_the_rest() -> None:
    doc = {"a\x1b": ["x\x07", 1, 2.5, None, True, {"k": "\x9bv"}], "n": 3}
    assert clean_json(doc) == {"a": ["x", 1, 2.5, None, True, {"k": "v"}], "n": 3}


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain", "plain"),
        ("<!channel> look", "&lt;!channel&gt; look"),
        ("<!here>", "&lt;!here&gt;"),
        ("<!everyone>", "&lt;!everyone&gt;"),
        ("<@U123ABC>", "&lt;@U123ABC&gt;"),
        ("<#C024BE7LR>", "&lt;#C024BE7LR&gt;"),
        ("<https://evil.example|click me>", "&lt;https://evil.example|click me&gt;"),
        ("<!subteam^SAZ94GDB8>", "&lt;!subteam^SAZ94GDB8&gt;"),
        ("a & b", "a &amp; b"),
        ("&lt; already", "&amp;lt; already"),  # & first: an entity written by a user reads as written
        ("x > y < z", "x &gt; y &lt; z"),
    ],
)
def test_chat_escape_makes_slack_markup_inert(text: str, escaped: str) -> None:
    assert chat_escape(text) == escaped


def alert(message: str, *, id: int = 12) -> StoredAlert:
    return StoredAlert(id, 1.0, "job_failed", "error", 7, None, message, "open", None, None, None, None, {})


def test_a_notification_carries_no_control_character_and_its_chat_text_no_mention() -> None:
    message = f"job 7 (llama, ann) failed: rank 0 on node01 exited with code 1 ({HOSTILE}<!channel> wake up)"
    payload = alert_payload(AlertInfo(alert(message), "llama", "ann\x1b[8m"), "c1")
    body = json.dumps(payload, ensure_ascii=False)
    assert "\x1b" not in body and "\x07" not in body and "\\u001b" not in json.dumps(payload)
    assert payload["text"] == (
        "[ftconsole] ERROR job_failed #12: job 7 (llama, ann) failed: rank 0 on node01 exited with code 1 "
        "(]0;pwned[2J&lt;!channel&gt; wake up)"
    )
    assert "<!channel>" not in payload["text"]
    # the other fields carry the plain text, control-free: a receiver of the JSON reads what was written
    assert payload["message"] == message.replace(HOSTILE, "]0;pwned[2J")
    assert payload["owner"] == "ann[8m"


def test_a_coalesced_notification_is_cleaned_and_escaped_too() -> None:
    infos = [AlertInfo(alert(f"{HOSTILE}<!here> {i}", id=i)) for i in (1, 2)]
    payload = coalesced_payload(infos, "c1", rate_limit=1)
    assert "\x1b" not in json.dumps(payload, ensure_ascii=False)
    assert [a["message"] for a in payload["alerts"]] == ["]0;pwned[2J<!here> 1", "]0;pwned[2J<!here> 2"]
    assert "<" not in payload["text"] and ">" not in payload["text"]


def test_one_line_has_no_control_character_and_stays_bounded() -> None:
    assert one_line(f"a\r\nb\x0bc{HOSTILE}d") == "a b c]0;pwned[2Jd"
    assert len(one_line("\x1b" * 1000 + "x" * 1000)) == 400


def test_a_run_status_keeps_its_users_texts_without_control_characters() -> None:
    status = RunStatus.from_json(
        {
            "state": "exited",
            "exit_code": 1,
            "error": f"boom {HOSTILE}",
            "step": "command\x1b[1A",
            "signal": "SIG\x07TERM",
            "token": "t1",
            "scan": {"to": 10, "matches": {"errors": [{"line": f"CUDA error{HOSTILE}"}]}, "error": "x\x1b"},
        }
    )
    assert (status.error, status.step, status.signal) == ("boom ]0;pwned[2J", "command[1A", "SIGTERM")
    assert status.scan == {"to": 10, "matches": {"errors": [{"line": "CUDA error]0;pwned[2J"}]}, "error": "x"}
    assert status.token == "t1"
    # however it is made: a refusal that quotes the run folder's claim file (which its user may write)
    refused = RunStatus(state="refused", error=f"claimed by another attempt (token {HOSTILE})")
    assert refused.error == "claimed by another attempt (token ]0;pwned[2J)"


def hostile_run_doc() -> dict[str, Any]:
    """One run as a node describes it (scheduler/node/supervisor_evidence.py), its user's words full of escapes."""
    return {
        "rank": 0,
        "node": "node01",
        "run_dir": "/runs/1/1/0",
        "gpus": [0],
        "state": "running",
        "output_tail": f"loss 1\r\n\x1b[2Kloss 2{HOSTILE}\n",
        "sample": 0.5,
        "processes": [
            {
                "pid": 10,
                "ppid": 1,
                "python": True,
                "state": "S",
                "wchan": "futex_wait\x1b[2J",
                "cpu_moved": 0.0,
                "cmdline": ["python", f"train{HOSTILE}.py"],
                "env": {"RANK": "0", "X\x1b": "\x9b1m"},
                "stack": [{"tid": 10, "frames": [{"name": f"load{HOSTILE}", "file": "/w/t\x1b[8m.py", "line": 3}]}],
                "collectives": {"groups": {"pg\x1b[2J": {"seq": 4, "op": "all_reduce\x07", "done": False}}},
            }
        ],
    }


async def test_evidence_keeps_no_control_character_of_what_the_nodes_said(monkeypatch: pytest.MonkeyPatch) -> None:
    async def node(*_: Any) -> list[dict[str, Any]]:
        return [hostile_run_doc()]

    monkeypatch.setattr(evidence, "_node", node)
    job = SimpleNamespace(id=1, attempt=1)
    run = Run(job=1, attempt=1, rank=0, node="node01", gpus=(0,), run_dir="/runs/1/1/0", launch=True)
    found = await evidence.gather(None, job, [run])  # type: ignore[arg-type]
    doc = found.to_json()
    assert "\x1b" not in json.dumps(doc, ensure_ascii=False)
    (rank,) = found.ranks
    assert rank.frames[0].name == "load]0;pwned[2J" and rank.wchan == "futex_wait[2J"
    assert rank.trace == (("pg[2J", 4, "all_reduce", False),)
    assert doc["runs"][0]["processes"][0]["cmdline"] == ["python", "train]0;pwned[2J.py"]
    assert doc["runs"][0]["output_tail"] == "loss 1\n[2Kloss 2]0;pwned[2J\n"


def test_the_debug_text_of_evidence_kept_by_an_older_ftconsole_writes_no_control_character() -> None:
    doc = {
        "job": 1,
        "attempt": 1,
        "time": 0.0,
        "seconds": 0.5,
        "verdict": {"reason": f"rank 0 {HOSTILE}", "rank": 0},
        "ranks": [
            {"rank": 0, "node": "node01", "pid": 10, "state": "S", "wchan": "w\x1b", "cpu": 0.0, "collective": None,
             "where": f"load{HOSTILE}", "gone": None, "collectives": [{"op": "ar\x07", "seq": 1, "done": False}],
             "stack": [{"name": f"load{HOSTILE}", "file": "/t.py\x9b", "line": 3}]},
        ],
    }  # fmt: skip
    text = evidence_text(doc)
    assert clean(text) == text
    assert "load]0;pwned[2J (/t.py:3)" in text


def test_the_cli_writes_no_control_character_of_a_stored_text() -> None:
    assert printable(f"job 7 failed: {HOSTILE}") == "job 7 failed: ]0;pwned[2J"
    table = format_table(["ID", "MESSAGE"], [[7, f"exited ({HOSTILE})"], [8, None]])
    assert "\x1b" not in table and "\x07" not in table and "exited (]0;pwned[2J)" in table
