"""A job's user writes terminal escapes and a chat mention into what the scheduler keeps of its run (issue 40,
part 7), on a real sshd node: its command rewrites its own status.json (the run folder is its user's) with an
`error` that would set the operator's window title and clear the screen, and `<!channel>`, then fails. Nothing
of it reaches a terminal or a chat as a command: `ftconsole show`, `events` and `alerts` write no control
character (nor `--json` an escaped one: the store keeps none), and the webhook's notification, received by a
real HTTP server on loopback, has none and escapes the mention."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli_runner import Cli
from tests.integration.test_notify import Hook
from tests.integration.test_scheduler_sshd import finished, job, poll, running, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

HOSTILE = "\x1b]0;pwned\x07\x1b[2J"  # set the window's title (OSC 0, ended by BEL), clear the screen (CSI 2J)
SHOWN = "]0;pwned[2J"  # what is left of it once its control characters are gone
CONTROLS = [chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]]

# the job's command: its run folder is where FT_HOSTFILE is; it writes its end into status.json itself, with its
# own error, then kills its supervisor (its own process, the same user) so that nothing writes the real end
ERROR = f"{HOSTILE}<!channel> wake up"
FORGE = f"ERROR = {ERROR!r}\n" + textwrap.dedent("""
    import json, os, signal, sys, time
    path = os.path.join(os.path.dirname(os.environ["FT_HOSTFILE"]), "status.json")
    with open(path) as f:
        status = json.load(f)
    status.update(state="exited", exit_code=3, signal=None, ended=time.time(), error=ERROR)
    with open(path + ".tmp", "w") as f:
        json.dump(status, f)
    os.rename(path + ".tmp", path)
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    sys.exit(3)
""")


def controls_in(text: str) -> list[str]:
    return sorted({repr(c) for c in text if c in CONTROLS})


async def test_a_runs_error_full_of_escapes_reaches_no_terminal_and_no_chat_as_a_command(
    sshd_cluster, tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)  # serve's webhook client reads the environment: stay on loopback
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    hook = Hook([200])
    hook.thread.start()
    try:
        loaded = write_config(cluster, tmp_path, sock_dir, notify={"webhook": hook.url, "retries": 0, "jobs": "all"})
        script = tmp_path / "forge.py"
        script.write_text(FORGE)
        command = f"{sys.executable} {script}"
        cli = Cli(tmp_path / "cluster.yaml")
        async with running(loaded) as (_, client):
            submitted = await client.call("submit", spec=job("escapes", command))
            shown = await finished(client, submitted["id"])
            assert shown["status"] == "error", shown["message"]
            ref = str(submitted["id"])
            # the CLI runs beside this process's scheduler (it answers on this event loop): in a thread
            human = {what: await asyncio.to_thread(cli, what, *args) for what, args in (
                ("show", [ref]), ("events", [ref]), ("alerts", []))}  # fmt: skip
            as_json = await asyncio.to_thread(cli, "show", ref, "--json")
            posts = await poll(
                lambda: asyncio.sleep(0, hook.received()),
                lambda p: any(b["json"].get("kind") == "job_failed" for b in p),
                "the job_failed notification",
            )
    finally:
        hook.server.shutdown()
        hook.server.server_close()
        hook.thread.join(5)
    # what people read: the CLI's text and the chat's, each also cleaned where it is written (for text that an
    # older ftconsole stored)
    for what, proc in human.items():
        assert controls_in(proc.stdout + proc.stderr) == [], f"ftconsole {what}:\n{proc.stdout!r}"
    assert f"{SHOWN}<!channel> wake up" in human["show"].stdout
    assert SHOWN in human["events"].stdout and SHOWN in human["alerts"].stdout
    (body,) = [p["json"] for p in posts if p["json"].get("kind") == "job_failed"]
    assert controls_in(json.dumps(body, ensure_ascii=False)) == []
    assert f"{SHOWN}&lt;!channel&gt; wake up" in body["text"] and "<!channel>" not in body["text"]
    assert f"{SHOWN}<!channel> wake up" in body["message"]  # the plain text, for a receiver that is not a chat
    # what the store keeps: the user's words without their control characters; --json would escape one
    # (\u001b), and has none to escape
    assert f"exited with code 3 ({SHOWN}<!channel> wake up)" in shown["message"]
    assert "\x1b" not in as_json.stdout and "\\u001b" not in as_json.stdout and "\\u0007" not in as_json.stdout
    assert f"{SHOWN}<!channel> wake up" in json.loads(as_json.stdout)["message"]
