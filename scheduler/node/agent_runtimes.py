"""The probe agent's container runtimes (node side, bundled into the agent's script: see agent.py and bundle.py).

For each of podman, docker, apptainer (and singularity, its older name), enroot found on PATH: its path, its
version (``--version``), whether it is usable (docker: ``docker info`` reaches the daemon; podman: ``podman
info`` works; the others: ``--version`` runs), and whether it can give GPUs to a container, and how.

Observing (``observe_host``, ``observe_runtime``: PATH, files under the sysroot, bounded commands within the
probe's deadline) is kept apart from deciding (``runtime_entry``, ``gpus_via``: data in, the report's dict
out), so the decisions are tested from tables. Python 3.8, standard library only.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import time

from ftconsole.scheduler.node.agent_common import (  # bundled
    Deadline,
    as_list,
    first_line,
    host_path,
    keep_json,
    read_text,
    run_bounded,
)

RUNTIME_NAMES = ("podman", "docker", "apptainer", "singularity", "enroot")
RUNTIME_COMMAND_S = 5.0  # at most, for one command
RUNTIME_SHARE = 0.5  # of the probe's time left: a runtime that hangs leaves the checks (DNS) their time
CDI_GLOBS = ("/etc/cdi/*.yaml", "/etc/cdi/*.yml", "/etc/cdi/*.json", "/var/run/cdi/*")
CDI_GPU_KIND = "nvidia.com/gpu"
TOOLKIT_TOOLS = ("nvidia-ctk", "nvidia-container-cli")
OCI_HOOK_GLOBS = ("/usr/share/containers/oci/hooks.d/*nvidia*", "/etc/containers/oci/hooks.d/*nvidia*")
ENROOT_SYSCONF = "/etc/enroot"
ENROOT_GPU_HOOK = "hooks.d/98-nvidia.sh"
DRIVER_LIB_GLOBS = tuple(
    d + "/libnvidia-ml.so*"
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
)
RUNTIMES_CACHE = "~/.ftconsole/probe/runtimes.json"  # the last reading, reused while nothing it depends on changed
# what a reading depends on besides the runtimes' files and the host's GPU plumbing (observe_host)
CACHE_ENV = ("PATH", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINER_HOST", "DOCKER_HOST", "DOCKER_CONTEXT",
             "DOCKER_CONFIG", "XDG_RUNTIME_DIR", "ENROOT_SYSCONF_PATH")  # fmt: skip
VERSION_PATTERN = re.compile(r"\d+(?:\.\d+)+(?:[-+~][0-9A-Za-z][0-9A-Za-z.+~-]*)?")


# ---------------------------------------------------------------------------------------------------------
# Deciding: data in, the report's dict out.


def parse_version(output):
    """The version in a ``--version`` output ("Docker version 28.2.2, build e6534b4" -> "28.2.2"); its first
    line as it is when no version number is in it; None when there is no output."""
    line = first_line(output) if (output or "").strip() else None
    if line is None:
        return None
    found = VERSION_PATTERN.search(line)
    return found.group(0).rstrip(".-+~") if found else line


def gpus_via(name, host, info):
    """How `name` can give GPUs to a container on this host, as short labels (empty: it cannot).

    host: observe_host()'s dict; info: the runtime's parsed ``info`` document ({} when it has none)."""
    via = []
    if name == "podman":
        if host["cdi_specs"]:
            via.append("CDI")
        if host["oci_hooks"]:
            via.append("OCI hook")
    elif name == "docker":
        runtimes = info.get("Runtimes")
        if isinstance(runtimes, dict) and "nvidia" in runtimes:
            via.append("nvidia runtime")
        if host["toolkit"]:
            via.append("--gpus (toolkit)")
        if host["cdi_specs"] and info.get("CDISpecDirs"):
            via.append("CDI")
    elif name in ("apptainer", "singularity"):
        if "nvidia-container-cli" in host["toolkit"] or host["driver"]:
            via.append("--nv")
    elif name == "enroot" and host["enroot_hook"] and "nvidia-container-cli" in host["toolkit"]:
        via.append("nvidia hook")
    return via


def runtime_entry(name, path, seen, host):
    """One runtime's dict in the report, from what observe_runtime() saw of it."""
    usable = seen["problem"] is None
    via = gpus_via(name, host, seen.get("info") or {})
    return {
        "name": name,
        "path": path,
        "version": parse_version(seen.get("version")),
        "usable": usable,
        "problem": seen["problem"],
        "gpus": usable and bool(via),
        "gpus_via": via,
    }


# ---------------------------------------------------------------------------------------------------------
# Observing: PATH, files under the sysroot, and bounded commands.


def found_files(sysroot, patterns, containing=None):
    """Node paths (without the sysroot) of the files matching `patterns`, holding `containing` if given."""
    found = []
    for pattern in patterns:
        for real in sorted(glob.glob(host_path(glob.escape(sysroot), pattern))):
            if not os.path.isfile(real):
                continue
            if containing is not None and containing not in (read_text(real) or ""):
                continue
            shown = "/" + os.path.relpath(real, host_path(sysroot, "/"))
            if shown not in found:
                found.append(shown)
    return found


def observe_host(sysroot):
    """What the host offers any runtime for GPUs: CDI specs, the NVIDIA container toolkit, OCI hooks, the
    driver, enroot's nvidia hook."""
    sysconf = os.environ.get("ENROOT_SYSCONF_PATH") or ENROOT_SYSCONF
    hooks = [ENROOT_SYSCONF + "/" + ENROOT_GPU_HOOK, sysconf.rstrip("/") + "/" + ENROOT_GPU_HOOK]
    return {
        "cdi_specs": found_files(sysroot, CDI_GLOBS, CDI_GPU_KIND),
        "toolkit": [tool for tool in TOOLKIT_TOOLS if shutil.which(tool)],
        "oci_hooks": found_files(sysroot, OCI_HOOK_GLOBS),
        "driver": bool(shutil.which("nvidia-smi") or found_files(sysroot, DRIVER_LIB_GLOBS)),
        "enroot_hook": bool(found_files(sysroot, hooks)),
    }


def run_step(argv, label, deadline):
    """(exit status, stdout, stderr) of one command, or (None, None, why it did not run or finish)."""
    left = deadline.remaining(floor=0.0)
    if left <= 0:
        return None, None, "%s not run: the probe ran out of time" % label
    seconds = min(RUNTIME_COMMAND_S, left)
    try:
        return run_bounded(argv, seconds)
    except subprocess.TimeoutExpired:
        return None, None, "%s timed out after %.1fs" % (label, seconds)
    except OSError as exc:
        return None, None, "%s failed: %s" % (label, exc)


def parse_info(output):
    try:
        doc = json.loads(output or "")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def observe_runtime(name, path, deadline):
    """{"version": --version's output or None, "info": the info document or None, "problem": None or why the
    runtime is not usable}."""
    status, out, err = run_step([path, "--version"], name + " --version", deadline)
    if status is None:
        return {"version": None, "info": None, "problem": err}
    if status != 0:
        return {"version": None, "info": None, "problem": "%s --version failed: %s" % (name, first_line(err, out))}
    seen = {"version": out, "info": None, "problem": None}
    if name == "docker":
        status, info, err = run_step([path, "info", "--format", "{{json .}}"], "docker info", deadline)
        doc = parse_info(info)
        errors = [e for e in as_list(doc.get("ServerErrors")) if isinstance(e, str)]
        if status is None:
            seen["problem"] = "daemon not reachable: %s" % err
        elif status != 0 or errors:
            seen["problem"] = "daemon not reachable: %s" % first_line(err, *errors)
        seen["info"] = doc
    elif name == "podman":
        status, info, err = run_step([path, "info", "--format", "json"], "podman info", deadline)
        if status is None:
            seen["problem"] = err
        elif status != 0:
            seen["problem"] = "podman info failed: %s" % first_line(err, info)
        seen["info"] = parse_info(info)
    return seen


def reading_key(found, host):
    """What a reading of the runtimes depends on, as JSON data: the account, each runtime's file (path, mtime,
    size: an upgrade changes it), the host's GPU plumbing (CDI specs, toolkit, hooks) and CACHE_ENV."""
    files = []
    for name, path in found:
        try:
            st = os.stat(path)
            files.append([name, path, st.st_mtime, st.st_size])
        except OSError:
            files.append([name, path, None, None])
    key = {"uid": os.getuid(), "found": files, "host": host, "env": [os.environ.get(k) for k in CACHE_ENV]}
    return json.loads(json.dumps(key))


def kept_reading(path, key, max_age, now):
    """The entries of the reading kept at `path` when it was made for `key` less than `max_age` seconds ago."""
    if not path or max_age <= 0:
        return None
    try:
        with open(path) as fh:
            kept = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key or not isinstance(kept.get("entries"), list):
        return None
    at = kept.get("at")
    return kept["entries"] if isinstance(at, (int, float)) and 0 <= now - at < max_age else None


def keep_reading(path, key, entries, now):
    """Keep a reading for the next probes (0600, written whole); a home that cannot be written keeps none."""
    if path:
        keep_json(path, {"key": key, "at": now, "entries": entries})


def read_runtimes(sysroot, deadline, max_age=0.0, cache=None):
    """The container runtimes on PATH, each as runtime_entry()'s dict; [] when there is none. Their commands
    share RUNTIME_SHARE of the time left to the probe. With `cache` (a file) and `max_age`, the last reading
    is reused while it is younger than `max_age` seconds and nothing it depends on changed (`reading_key`):
    `podman info` and `docker info` cost a node about 0.4 s of CPU."""
    found: list = []
    for name in RUNTIME_NAMES:
        path = shutil.which(name)
        if path is None:
            continue
        real = os.path.realpath(path)
        if any(os.path.realpath(p) == real for _, p in found):
            continue  # singularity installed by apptainer as a link to it: one runtime
        found.append((name, path))
    if not found:
        return []
    host = observe_host(sysroot)
    key, now = reading_key(found, host), time.time()
    kept = kept_reading(cache, key, max_age, now)
    if kept is not None:
        return kept
    budget = Deadline(deadline.remaining(floor=0.0) * RUNTIME_SHARE)
    entries = [runtime_entry(name, path, observe_runtime(name, path, budget), host) for name, path in found]
    keep_reading(cache, key, entries, now)
    return entries
