"""Notifications, the pure parts: the rate limit and its coalescing, the payloads, the `notify:` config keys and
the spec's `notify`, and the webhook's verdict on each answer (through httpx's MockTransport, no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.serve.notify import Batch, DeliveryFailed, Throttle, WebhookTarget, url_origin
from ftconsole.scheduler.serve.payloads import (
    AlertInfo,
    alert_payload,
    coalesced_payload,
    id_ranges,
    notification_key,
    one_line,
    worst_severity,
)
from ftconsole.scheduler.spec.config import NotifySettings, load_config
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.records import StoredAlert


def alert(id: int, kind: str = "node_unreachable", severity: str = "error", **fields: Any) -> StoredAlert:
    base: dict[str, Any] = {
        "id": id,
        "time": 1000.0 + id,
        "kind": kind,
        "severity": severity,
        "job": None,
        "node": "gpu01",
        "message": f"gpu01 is unreachable: refused ({id})",
        "state": "open",
        "acked_by": None,
        "acked_at": None,
        "resolved_at": None,
        "resolved_by": None,
        "data": {},
    }
    return StoredAlert(**{**base, **fields})


# -- the rate limit ------------------------------------------------------------------------------------------

# (limit, steps): each step is (now, items offered), and what goes out then: "a" alone, or "(a b c)" coalesced
THROTTLE_CASES = [
    pytest.param(3, [(0, "a b"), (1, "c")], ["a", "b", "c"], id="under the limit: each alone"),
    pytest.param(2, [(0, "a b c d e")], ["a", "b"], id="over the limit: the rest held"),
    pytest.param(2, [(0, "a b c d e"), (59, ""), (60, "")], ["a", "b", "(c d e)"], id="held ones go as one"),
    pytest.param(2, [(0, "a b c"), (60, "")], ["a", "b", "c"], id="a lone held one goes as itself"),
    pytest.param(
        2, [(0, "a b c d"), (30, "e"), (60, "f")], ["a", "b", "(c d e)", "f"], id="newer ones join the held ones"
    ),
    pytest.param(1, [(0, "a b c"), (60, "d"), (120, "e")], ["a", "(b c)", "d"], id="the summary before newer ones"),
    pytest.param(2, [(0, "a"), (50, "b c"), (60, "d"), (110, "")], ["a", "b", "c", "d"], id="a sliding window"),
    pytest.param(2, [(0, "a b c d"), (59.9, ""), (60, "")], ["a", "b", "(c d)"], id="a full minute"),
    pytest.param(1, [(0, "a b c d e f g h")], ["a"], id="nothing dropped while held"),
]


def render(batch: Batch[str]) -> str:
    return f"({' '.join(batch.items)})" if batch.coalesced else " ".join(batch.items)


@pytest.mark.parametrize(("limit", "steps", "sent"), THROTTLE_CASES)
def test_throttle(limit: int, steps: list[tuple[float, str]], sent: list[str]) -> None:
    throttle: Throttle[str] = Throttle(limit, window=60.0)
    out: list[str] = []
    offered: list[str] = []
    for now, items in steps:
        offered += items.split()
        out += [render(b) for b in throttle.admit(items.split(), now)]
    assert out == sent
    delivered = [x for rendered in out for x in rendered.strip("()").split()]
    assert delivered + throttle.held == offered  # every item once, in order: sent or still held


def test_throttle_refuses_a_zero_limit() -> None:
    with pytest.raises(ValueError):
        Throttle(0)


# -- payloads ------------------------------------------------------------------------------------------------


def test_alert_payload_has_a_text_line_and_the_alert_fields() -> None:
    a = alert(12, kind="job_failed", job=7, node=None, message="job 7 (llama, ann) failed:\nrank 1 exit 1")
    payload = alert_payload(AlertInfo(a, "llama", "ann"), "c0ffee")
    assert payload["text"] == "[ftconsole] ERROR job_failed #12: job 7 (llama, ann) failed: rank 1 exit 1"
    assert {k: payload[k] for k in a.to_json()} == a.to_json()
    assert (payload["job_name"], payload["owner"], payload["cluster_id"]) == ("llama", "ann", "c0ffee")
    json.dumps(payload)  # JSON as it is


def test_text_is_one_bounded_line() -> None:
    text = one_line("a\n" * 1000)
    assert "\n" not in text and len(text) == 400 and text.endswith("…")


def test_coalesced_payload_counts_and_lists_every_alert() -> None:
    infos = [AlertInfo(alert(i)) for i in (3, 4, 5)] + [
        AlertInfo(alert(9, kind="host_key", severity="critical")),
        AlertInfo(alert(10, kind="job_failed", job=2, node=None), "train", "bob"),
    ]
    payload = coalesced_payload(infos, "c0ffee", rate_limit=30)
    assert payload["kind"] == "coalesced"
    assert payload["count"] == 5
    assert payload["ids"] == [3, 4, 5, 9, 10]
    assert payload["kinds"] == {"node_unreachable": 3, "host_key": 1, "job_failed": 1}
    assert payload["severity"] == "critical"
    assert payload["text"] == (
        "[ftconsole] CRITICAL 5 more alerts (over the limit of 30 a minute): 3 node_unreachable, 1 host_key, "
        "1 job_failed; ids 3-5, 9-10; see `ftconsole alerts`"
    )
    assert [a["id"] for a in payload["alerts"]] == [3, 4, 5, 9, 10]
    assert payload["alerts"][-1]["owner"] == "bob"


def test_coalesced_payload_lists_at_most_100_but_counts_all() -> None:
    payload = coalesced_payload([AlertInfo(alert(i)) for i in range(1, 251)], "c", rate_limit=30)
    assert payload["count"] == 250 and len(payload["ids"]) == 250 and len(payload["alerts"]) == 100
    assert "250 more alerts" in payload["text"] and "ids 1-250" in payload["text"]


@pytest.mark.parametrize(
    ("ids", "text"), [([1], "1"), ([1, 2, 3], "1-3"), ([5, 1, 2, 9, 10, 12], "1-2, 5, 9-10, 12"), ([], "")]
)
def test_id_ranges(ids: list[int], text: str) -> None:
    assert id_ranges(ids) == text


@pytest.mark.parametrize(
    ("severities", "worst"), [(["warning", "error"], "error"), (["critical", "warning"], "critical"), ([], "error")]
)
def test_worst_severity(severities: list[str], worst: str) -> None:
    assert worst_severity(severities) == worst


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com"),
        ("http://user:pw@10.0.0.5:8065/hooks/xyz?token=1", "http://10.0.0.5:8065"),
    ],
)
def test_url_origin_hides_the_secret_parts(url: str, origin: str) -> None:
    assert url_origin(url) == origin


# -- the webhook's verdict on an answer ----------------------------------------------------------------------


# (HTTP status, None: delivered, else whether it is tried again)
ANSWERS = [(200, None), (204, None), (500, True), (503, True), (429, True), (408, True), (404, False), (401, False)]
ANSWERS.append((302, False))  # a redirect is not followed: a hook that moved is a config to fix


@pytest.mark.parametrize(("status", "retry"), ANSWERS)
async def test_webhook_answers(status: int, retry: bool | None) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, text="nope" if status >= 300 else "", headers={"Location": "http://x/"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        target = WebhookTarget(client, "https://hooks.example.com/T/SECRET", {"Authorization": "Bearer t"})
        assert target.name == "webhook https://hooks.example.com"
        if retry is None:
            await target.send(b'{"text": "hi"}', "ftconsole-c1-7")
        else:
            with pytest.raises(DeliveryFailed, match=f"HTTP {status}") as caught:
                await target.send(b'{"text": "hi"}', "ftconsole-c1-7")
            assert caught.value.retry is retry
    assert len(seen) == 1  # redirects not followed
    assert seen[0].headers["Authorization"] == "Bearer t"
    assert seen[0].headers["Content-Type"] == "application/json"
    assert seen[0].headers["Idempotency-Key"] == "ftconsole-c1-7"  # a receiver may drop a resend by it
    assert json.loads(seen[0].content) == {"text": "hi"}


@pytest.mark.parametrize(
    ("status", "reason", "body", "said", "logged"),
    [
        (500, "Internal Server Error", b'{"error": "token xoxb-T0K3N expired", "alerts": ["job 7 (secret)"]}',
         "HTTP 500 Internal Server Error", '{"error": "token xoxb-T0K3N expired", "alerts": ["job 7 (secret)"]}'),
        (403, "Forbidden, ask ops for xoxb-T0K3N", b"forbidden:\n invalid_token xoxb-T0K3N", "HTTP 403 Forbidden",
         "forbidden: invalid_token xoxb-T0K3N"),
        (599, "Custom xoxb-T0K3N", b"", "HTTP 599", ""),  # no standard reason: the status alone
        (404, "Not Found", b"no hook at https://hooks.example.com/T/SECRET " + b"x" * 10_000, "HTTP 404 Not Found",
         "no hook at https://hooks.example.com xxx"),  # cut to 200 characters, the hook's URL made its origin
    ],
    ids=["500", "403", "599", "404"],
)  # fmt: skip
async def test_a_webhook_failure_says_its_status_and_keeps_its_answer_for_the_log(
    status: int, reason: str, body: bytes, said: str, logged: str
) -> None:
    """What a failure says (the notify-failed event says it, and every user reads that) is the status and its
    standard reason, never the server's own phrase nor its body; the body, on one line, cut short and without the
    hook's URL, is the failure's `detail`, for the scheduler's log."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, extensions={"reason_phrase": reason.encode()})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(DeliveryFailed) as caught:
            await WebhookTarget(client, "https://hooks.example.com/T/SECRET", {}).send(b"{}", "ftconsole-c1-7")
    assert caught.value.message == said
    assert caught.value.detail.startswith(logged) and len(caught.value.detail) <= 200
    assert "SECRET" not in caught.value.detail and (len(body) < 200 or caught.value.detail.endswith("…"))


async def test_webhook_network_errors_are_ours_and_retried() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(DeliveryFailed, match="ConnectError") as caught:
            await WebhookTarget(client, "http://127.0.0.1:9/", {}).send(b"{}", "ftconsole-c1-7")
    assert caught.value.retry is True


# -- config and spec -----------------------------------------------------------------------------------------


def config(tmp_path: Path, notify: str) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text("nodes:\n  - {name: a}\nnotify:\n" + notify)
    return p


def test_notify_defaults_send_nowhere() -> None:
    s = NotifySettings()
    assert (s.webhook, s.command, s.retries, s.rate_limit, s.timeout, s.jobs) == (None, None, 3, 30, 10.0, "opted-in")


def test_notify_config_loads(tmp_path: Path) -> None:
    text = (
        "  webhook: https://hooks.slack.com/services/T/B/X\n"
        "  headers: {Authorization: Bearer abc}\n"
        "  command: [/usr/local/bin/page, --team, gpu]\n"
        "  retries: 5\n  rate_limit: 10\n  timeout: 5s\n  jobs: all\n"
    )
    s = load_config(config(tmp_path, text)).cluster.notify
    assert s.webhook == "https://hooks.slack.com/services/T/B/X"
    assert s.headers == {"Authorization": "Bearer abc"}
    assert s.command == ["/usr/local/bin/page", "--team", "gpu"]
    assert (s.retries, s.rate_limit, s.timeout, s.jobs) == (5, 10, 5.0, "all")


NOTIFY_PROBLEMS = [
    ("  webhook: ftp://example.com/x\n", 4, "notify.webhook", "must be an http:// or https:// URL, got a 'ftp' URL"),
    ("  webhook: hooks.example.com/x\n", 4, "notify.webhook", "http:// or https:// URL, got no URL scheme"),
    ("  webhook: https:///x\n", 4, "notify.webhook", "names no host"),
    ("  webhok: https://example.com/\n", 4, "notify.webhok", "unknown key"),
    ("  headers: {X-Token: a}\n", 3, "notify", "no webhook is set"),
    ("  webhook: https://e.com/\n  headers: {'Bad Name': a}\n", 5, "notify.headers", "not an HTTP header name"),
    ("  command: []\n", 4, "notify.command", "must have at least 1 entry"),
    ("  command: echo hi\n", 4, "notify.command", "must be a list, as [a, b], not text ('echo hi')"),
    ("  command: ['']\n", 4, "notify.command", "give the command as a list"),
    ("  jobs: everyone\n", 4, "notify.jobs", "must be one of: opted-in, all; not 'everyone'"),
    ("  rate_limit: 0\n", 4, "notify.rate_limit", "must be at least 1, not 0"),
    ("  retries: -1\n", 4, "notify.retries", "must be at least 0, not -1"),
    ("  timeout: 0s\n", 4, "notify.timeout", "greater than 0"),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), NOTIFY_PROBLEMS)
def test_notify_problems_name_line_and_key(tmp_path: Path, text: str, line: int, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config(tmp_path, text))
    problems = info.value.problems
    assert any(p.line == line and p.path == path and message in p.message for p in problems), problems


def test_spec_notify_opt_in() -> None:
    base = {"name": "train", "command": "python3 train.py"}
    assert JobSpec.from_json(base).notify is False
    spec = JobSpec.from_json({**base, "notify": True})
    assert spec.notify is True
    assert JobSpec.from_stored(spec.to_json()).notify is True


@pytest.mark.parametrize(
    ("ids", "key"),
    [([12], "ftconsole-c1-12"), ([12, 13, 14, 15, 17], "ftconsole-c1-12-15.17"), ([3, 9], "ftconsole-c1-3.9")],
)
def test_a_notification_key_names_the_cluster_and_its_alerts(ids: list[int], key: str) -> None:
    assert notification_key("c1", ids) == key
