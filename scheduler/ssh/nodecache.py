"""A node-side program kept on the node by its hash, so that the calls after the first send only a loader (2 kB).

The run supervisor (about 60 kB) runs for every status read, start and stop: sent whole each time, it was 97 % of
the bytes the scheduler sent its nodes (docs/benchmarks.md); the probe agent (40 kB) runs at every probe. `run`
is how both are sent. `script(source, params, cached=False)` sends it
whole, compressed, with a loader that also stores it as ``~/.ftconsole/lib/<name>-<sha256>.py`` (0600 in a 0700
folder of the account the program runs as) and prints STORED once it is there; `script(..., cached=True)` sends
only the loader, which runs the stored copy when its hash is the one asked for, and otherwise prints MISSING and
exits (the caller then sends it whole). What runs is always the bytes whose hash was checked, so a copy changed
on the node is never run, only replaced. Copies of other versions older than STALE_S are removed when one is
stored. The loader is Python 3.8, standard library only.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import zlib
from collections.abc import Sequence
from typing import Any

from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh.transport import CommandResult, Transport

STORED = '{"ftconsole_cache":"stored"}'
MISSING = '{"ftconsole_cache":"missing"}'
STALE_S = 7 * 86400.0

# (node, host, argv, program) that keep this version of the program: sent only the loader
_STORED: set[tuple[str, str, tuple[str, ...], str]] = set()

_LOADER = '''
import base64 as _ft_b85, hashlib as _ft_hash, os as _ft_os, sys as _ft_sys, time as _ft_time, zlib as _ft_zlib


def _ft_folder():
    home = _ft_os.path.expanduser("~")
    folder = _ft_os.path.join(home, ".ftconsole", "lib")
    for path in (_ft_os.path.join(home, ".ftconsole"), folder):
        try:
            _ft_os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    return folder


def _ft_store(name, digest, source):
    """Keep `source` for the next calls; True once it is there (a home that cannot be written: False)."""
    try:
        folder = _ft_folder()
        path = _ft_os.path.join(folder, "%s-%s.py" % (name, digest))
        tmp = "%s.%s.%d.tmp" % (path, _ft_os.uname()[1], _ft_os.getpid())  # nodes may share the home
        fd = _ft_os.open(tmp, _ft_os.O_WRONLY | _ft_os.O_CREAT | _ft_os.O_TRUNC, 0o600)
        with _ft_os.fdopen(fd, "wb") as fh:
            fh.write(source)
            fh.flush()
            _ft_os.fsync(fh.fileno())
        _ft_os.replace(tmp, path)
        cutoff = _ft_time.time() - STALE_SECONDS
        for other in _ft_os.listdir(folder):
            full = _ft_os.path.join(folder, other)
            if other.startswith(name + "-") and full != path and _ft_os.lstat(full).st_mtime < cutoff:
                _ft_os.unlink(full)
        return True
    except OSError:
        return False


def _ft_stored(name, digest):
    try:
        with open(_ft_os.path.join(_ft_os.path.expanduser("~"), ".ftconsole", "lib", "%s-%s.py" % (name, digest)),
                  "rb") as fh:
            source = fh.read()
    except OSError:
        return None
    return source if _ft_hash.sha256(source).hexdigest() == digest else None
'''


@functools.cache
def digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


@functools.cache
def _packed(source: str) -> str:
    return base64.b85encode(zlib.compress(source.encode("utf-8"), 9)).decode("ascii")


@functools.cache
def _loader() -> str:
    return _LOADER.replace("STALE_SECONDS", repr(STALE_S))


def script(name: str, source: str, params: dict[str, Any], *, cached: bool) -> str:
    """What `python3 -` reads: the params, the loader, then the program itself (compressed) unless `cached`."""
    head = f"import json\nPARAMS = json.loads({json.dumps(params)!r})\n" + _LOADER.replace(
        "STALE_SECONDS", repr(STALE_S)
    )
    sha = digest(source)
    if cached:
        body = (
            f"_ft_source = _ft_stored({name!r}, {sha!r})\n"
            "if _ft_source is None:\n"
            f"    _ft_sys.stdout.write({MISSING!r} + '\\n')\n"
            "    _ft_sys.stdout.flush()\n"
            "    _ft_sys.exit(0)\n"
        )
    else:
        body = (
            f"_ft_source = _ft_zlib.decompress(_ft_b85.b85decode({_packed(source)!r}))\n"
            f"if _ft_store({name!r}, {sha!r}, _ft_source):\n"
            f"    _ft_sys.stdout.write({STORED!r} + '\\n')\n"
            "    _ft_sys.stdout.flush()\n"  # before the program forks (a start): printed once
        )
    return head + body + f"exec(compile(_ft_source, {name!r}, 'exec'))\n"


async def run(
    transport: Transport,
    node: Node,
    argv: Sequence[str],
    *,
    name: str,
    source: str,
    params: dict[str, Any],
    timeout: float,
) -> CommandResult:
    """Run the program on the node with `python3 -` as `argv` says: the loader alone where the node keeps this
    version of it (as far as this process knows), else the whole program, stored for the next calls. A copy
    found missing is sent whole at once. The STORED line is taken out of the result's stdout."""
    key = (node.name, node.host, tuple(argv), name)
    cached = key in _STORED
    result = await transport.run(node, list(argv), input=script(name, source, params, cached=cached), timeout=timeout)
    lines = result.stdout.splitlines()
    if cached and MISSING in lines:  # removed on the node, or replaced by another version there
        _STORED.discard(key)
        return await run(transport, node, argv, name=name, source=source, params=params, timeout=timeout)
    if STORED not in lines:
        return result
    if not cached:
        _STORED.add(key)
    return dataclasses.replace(result, stdout="".join(ln + "\n" for ln in lines if ln != STORED))
