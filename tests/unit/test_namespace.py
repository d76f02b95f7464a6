"""ftconsole's core lives in its own namespace (ftconsole.scheduler, ftconsole.probes): a top-level `scheduler` or
`probes` package from elsewhere (both names are taken on the package index) changes nothing for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ftconsole_runs_beside_other_top_level_scheduler_and_probes_packages(tmp_path: Path, sock_dir: Path) -> None:
    for name in ("scheduler", "probes"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'the other {name} package'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # first on sys.path, ahead of ftconsole's install
    code = (
        "import scheduler, probes\n"
        "import ftconsole.cli, ftconsole.scheduler.jobops, ftconsole.probes.health\n"
        "from ftconsole.scheduler.ssh.runs import supervisor_source\n"
        "from ftconsole.scheduler.ssh.probing import agent_source\n"
        "print(scheduler.WHO, '|', probes.WHO, '|', ftconsole.scheduler.jobops.__name__)\n"
        "assert 'def main(params)' in supervisor_source() and 'PARAMS' in agent_source()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the other scheduler package | the other probes package | ftconsole.scheduler.jobops"
    example = ROOT / "config" / "cluster.example.yaml"
    cli = [sys.executable, "-m", "ftconsole.cli", "--config", str(example), "config", "check", "--json"]
    (sock_dir / ".ssh").mkdir()
    (sock_dir / ".ssh" / "known_hosts").touch()  # the example's, with host_key_policy strict: config check wants it
    env["HOME"] = str(sock_dir)  # short: the default API socket is under it
    done = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"ok": true' in done.stdout
