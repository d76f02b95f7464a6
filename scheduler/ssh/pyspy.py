"""py-spy for nodes that lack it: the scheduler's own copy (a static binary in its environment, from the py-spy
wheel), sent once to each node of the same machine type and kept there by its hash, like the supervisor
(`nodecache`): ``~/.ftconsole/lib/py-spy-<sha256>`` of the SSH account, 0700 in a 0700 folder. The node runs a
copy only when its bytes hash to what the scheduler names (`supervisor_evidence._py_spy`), so a copy changed
there is never run, only replaced. Copies of other versions are removed when one is stored (not the temporary
file another node sharing the home is writing: only one left for an hour).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh.transport import Transport

FOLDER = "~/.ftconsole/lib"
SEND_TIMEOUT_S = 120.0  # about 11 MB of base64 on the wire

# Python 3.8, standard library: stdin (base64) -> the kept copy, checked against the digest in argv[1]
_STORE = r"""
import base64, hashlib, os, socket, sys, time
digest = sys.argv[1]
home = os.path.expanduser("~")
folder = os.path.join(home, ".ftconsole", "lib")
for path in (os.path.join(home, ".ftconsole"), folder):
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
data = base64.b64decode(sys.stdin.buffer.read())
if hashlib.sha256(data).hexdigest() != digest:
    sys.exit("py-spy: the bytes received do not hash to " + digest)
final = os.path.join(folder, "py-spy-" + digest)
tmp = "%s.%s.%d.tmp" % (final, socket.gethostname(), os.getpid())  # nodes sharing a home: one each
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
with os.fdopen(fd, "wb") as fh:
    fh.write(data)
    fh.flush()
    os.fsync(fh.fileno())
os.replace(tmp, final)
for name in os.listdir(folder):  # other versions; not another node's copy being written (a shared home)
    path = os.path.join(folder, name)
    try:
        other = len(name) == 71 and name.startswith("py-spy-") and name != "py-spy-" + digest
        stale = name.startswith("py-spy-") and name.endswith(".tmp") and os.stat(path).st_mtime < time.time() - 3600
        if other or stale:
            os.unlink(path)
    except OSError:
        pass
print("stored")
"""


@dataclass(frozen=True)
class LocalPySpy:
    path: Path
    sha256: str
    machine: str  # `uname -m` of the machines it runs on (this one's)

    def params(self) -> dict[str, str]:
        """What the node is told: where a kept copy would be, and the hash it must have."""
        return {"path": f"{FOLDER}/py-spy-{self.sha256}", "sha256": self.sha256}


@functools.cache
def local_py_spy() -> LocalPySpy | None:
    """py-spy of the scheduler's environment (beside its Python, else on PATH), or None."""
    beside = Path(sys.executable).with_name("py-spy")
    found = beside if beside.is_file() else shutil.which("py-spy")
    if found is None:
        return None
    path = Path(found)
    return LocalPySpy(path, hashlib.sha256(path.read_bytes()).hexdigest(), platform.machine())


@functools.cache
def _encoded(path: Path) -> str:
    """The binary as base64, made once (a job's first evidence sends it to each of its nodes at once)."""
    return base64.b64encode(path.read_bytes()).decode("ascii")


async def send_py_spy(transport: Transport, node: Node, local: LocalPySpy, *, python: str) -> None:
    """Store the scheduler's py-spy on `node` (its SSH account's ~/.ftconsole/lib); FtError saying why not."""
    data = await asyncio.to_thread(_encoded, local.path)  # 8 MB to base64 the first time: off the event loop
    result = await transport.run(node, [python, "-c", _STORE, local.sha256], input=data, timeout=SEND_TIMEOUT_S)
    if result.exit_status != 0 or "stored" not in result.stdout:
        said = (result.stderr.strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
        raise FtError(f"{node.name}: cannot store py-spy: {said[:300]}")


def can_run_on(local: LocalPySpy | None, machine: object) -> str | None:
    """Why the scheduler's py-spy cannot be sent to a node of `machine` (None: it can)."""
    if local is None:
        return "the scheduler's environment has no py-spy to send"
    if machine != local.machine:
        return f"the node is {machine}, the scheduler's py-spy is for {local.machine}"
    if not os.access(local.path, os.R_OK):
        return f"cannot read {local.path}"
    return None
