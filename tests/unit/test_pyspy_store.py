"""The node's side of sending py-spy (ssh/pyspy.py `_STORE`), run for real as a node runs it: the copy kept by its
hash, other versions removed, and, where nodes share a home, the file another node is writing left alone."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from ftconsole.scheduler.ssh.pyspy import _STORE


def test_the_copy_is_kept_by_its_hash_and_only_other_versions_and_stale_leftovers_go(tmp_path: Path) -> None:
    data = b"#!/bin/sh\necho a py-spy\n"
    digest = hashlib.sha256(data).hexdigest()
    lib = tmp_path / ".ftconsole" / "lib"
    lib.mkdir(parents=True)
    older = lib / f"py-spy-{'0' * 64}"  # another version
    writing = lib / f"py-spy-{digest}.gpu02.4242.tmp"  # another node sharing this home, writing now
    stale = lib / f"py-spy-{digest}.gpu03.77.tmp"  # one that died while writing, two hours ago
    for path in (older, writing, stale):
        path.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    done = subprocess.run(
        [sys.executable, "-c", _STORE, digest], input=base64.b64encode(data), capture_output=True, timeout=30,
        env={**os.environ, "HOME": str(tmp_path)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == b"stored\n", done.stderr
    assert (lib / f"py-spy-{digest}").read_bytes() == data
    assert sorted(p.name for p in lib.iterdir()) == sorted([f"py-spy-{digest}", writing.name])
    wrong = subprocess.run(
        [sys.executable, "-c", _STORE, "0" * 64], input=base64.b64encode(data), capture_output=True, timeout=30,
        env={**os.environ, "HOME": str(tmp_path)}, check=False,
    )  # fmt: skip
    assert wrong.returncode != 0 and b"do not hash to" in wrong.stderr
