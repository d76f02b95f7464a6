"""No user value reaches a shell unquoted: remote commands and agent parameters survive hostile text."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from ftconsole.scheduler.spec.config import ClusterConfig, Node
from ftconsole.scheduler.ssh.probing import agent_params, agent_script
from ftconsole.scheduler.ssh.transport import remote_command

HOSTILE = [
    "plain",
    "with space",
    "it's",
    'say "hi"',
    "a;rm -rf /tmp/never",
    "$(touch /tmp/ftconsole-pwned)",
    "`id`",
    "x | y > z",
    "new\nline",
    "*",
    "",
    "--flag=$HOME",
    "ünïcødé",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_remote_command_round_trips_through_sh(value: str, tmp_path) -> None:
    # The command line is what the node's login shell receives; sh must hand the exact argv to the program.
    argv = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", value, "tail"]
    line = remote_command(argv)
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == __import__("json").dumps([value, "tail"])
    assert not (tmp_path / "ftconsole-pwned").exists()


def test_remote_command_refuses_empty_argv() -> None:
    with pytest.raises(ValueError):
        remote_command([])


@pytest.mark.parametrize("value", HOSTILE)
def test_agent_params_are_a_python_literal_not_code(value: str) -> None:
    config = ClusterConfig.model_validate({"probes": {"cache_dir": value, "dns_names": [value]}})
    node = Node(name="n1", host="h", port=None, user=None, pool="default")
    script = agent_script(agent_params(config, node))
    header = "\n".join(script.splitlines()[:2])
    tree = ast.parse(header)
    # line 2 is exactly: PARAMS = json.loads(<one string constant>)
    call = tree.body[1].value  # type: ignore[attr-defined]
    assert isinstance(call, ast.Call) and len(call.args) == 1 and isinstance(call.args[0], ast.Constant)
    namespace: dict[str, object] = {}
    exec(compile(header, "<header>", "exec"), namespace)
    params = namespace["PARAMS"]
    assert params["cache_dir"] == value and params["dns_names"] == [value]  # type: ignore[index]
