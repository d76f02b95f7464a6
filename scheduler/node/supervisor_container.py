"""A rank's container (issue 17): node side, standard library only, Python 3.8.

A step of a job with `image` carries "container" (see `scheduler/spec/containers.py`, which builds it):

    {"runtime": "podman"|"docker"|"apptainer", "path", "image", "name", "gpus": [host index...],
     "gpu_via": "cdi"|"gpus"|"nvidia-runtime"|"hook"|"nv"|None, "mounts": [{"from", "to", "readonly"}],
     "shares": [path...], "ulimits": {name: "soft:hard"}, "pid_host"?: true}

`container_argv` turns the step's argv into the runtime's (``podman run ... IMAGE ARGV``, ``apptainer exec ...``):
an init process (the program as PID 1 would ignore a stop's SIGTERM, which the client passes on), the host
network and IPC, the rank's GPUs only, the job's env by name (``-e NAME``: the value is read from
the client's environment, so no value shows in ``ps``), the mounts, and `shares` (the workdir, output,
checkpoint and run folders, the data sets) at the same paths unless a mount already covers them. A "pull" step
(`image_pull_argv`) brings the image unless `image_present` finds it. `container_remove` is what the
supervisor runs once a container step is over, or on a SIGKILL after the grace period: the container is removed
whatever state it is in, at once.

Bundled into the supervisor script (`scheduler/node/bundle.py`).
"""

import hashlib
import os
import subprocess

from ftconsole.scheduler.node.supervisor_files import _expand  # bundled

IB_DEVICES = "/dev/infiniband"
RUNTIME_CALL_S = 60.0  # at most, for one call of the runtime's own (inspect, rm): never hangs the supervisor
SIF_SCHEMES = ("docker://", "oras://", "library://", "shub://", "docker-daemon:", "oci-archive:")
GPU_ISOLATING = ("cdi", "gpus", "nvidia-runtime", "hook")  # the container sees its GPUs only, numbered from 0


def container_expanded(container):
    """The document with ~ expanded in its mounts' `from` and its shares, with the HOME of the user it runs as."""
    mounts = [dict(m, **{"from": _expand(m["from"])}) for m in container.get("mounts") or []]
    return dict(container, mounts=mounts, shares=[_expand(p) for p in container.get("shares") or []])


def container_gpu_env(container):
    """CUDA_VISIBLE_DEVICES inside: 0..n-1 where the runtime shows the rank its GPUs only, else the host's."""
    gpus = container.get("gpus") or []
    if container.get("gpu_via") in GPU_ISOLATING:
        return ",".join(str(i) for i in range(len(gpus)))
    return ",".join(str(g) for g in gpus)


def _path_inside(path, folder):
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def container_mount_problem(container, run_dir):
    """Why the mounts cannot be used here (a mount over the run folder would hide the hostfile), or None."""
    for i, mount in enumerate(container.get("mounts") or []):
        if _path_inside(run_dir, mount["to"]):
            return "mounts[%d].to %s would hide this rank's run folder %s: choose another target" % (
                i,
                mount["to"],
                run_dir,
            )
    return None


def container_binds(container):
    """(source, target, readonly) in mount order: the job's mounts, then the shared folders not under one."""
    out = [(m["from"], m["to"], bool(m.get("readonly"))) for m in container.get("mounts") or []]
    targets = [m["to"] for m in container.get("mounts") or []]
    seen = set()
    for path in container.get("shares") or []:
        path = os.path.normpath(path)
        if path in seen or any(_path_inside(path, t) for t in targets) or not os.path.isdir(path):
            continue
        seen.add(path)
        out.append((path, path, False))
    return sorted(out, key=lambda b: b[1].rstrip("/").count("/"))  # a folder before what is mounted inside it


def apptainer_image(container):
    """The image apptainer runs: a local path as it is, a registry reference as its SIF under ~/.ftconsole."""
    ref = container["image"]
    if not ref.startswith(SIF_SCHEMES):
        return os.path.expanduser(ref)
    digest = hashlib.sha256(ref.encode()).hexdigest()[:24]
    return os.path.expanduser("~/.ftconsole/images/%s.sif" % digest)


def container_argv(container, argv, env_names, workdir, uid, gid):
    """The runtime's command that runs `argv` in the container (see the module docstring)."""
    if container["runtime"] == "apptainer":
        return _apptainer_argv(container, argv, workdir)
    return _oci_argv(container, argv, env_names, workdir, uid, gid)


def _oci_argv(container, argv, env_names, workdir, uid, gid):
    rt = container["runtime"]
    out = [container["path"], "run", "--rm", "--pull", "never", "--name", container["name"]]
    if container.get("pid_host"):  # an MPI process of the hybrid model (container_exec): the host's pids
        out += ["--pid", "host"]
    else:  # --init: the program is not PID 1, which would ignore the SIGTERM of a stop (catatonit, docker-init)
        out.insert(3, "--init")
    out += ["--network", "host", "--ipc", "host", "--workdir", workdir]
    if container.get("cidfile"):
        out += ["--cidfile", container["cidfile"]]  # its id: how the hang detector finds its processes
    if rt == "podman":
        if uid != 0:
            out += ["--userns", "keep-id"]  # rootless: the job's user inside is the user outside
    else:
        out += ["--user", "%d:%d" % (uid, gid)]
    gpus = [str(g) for g in container.get("gpus") or []]
    via = container.get("gpu_via")
    if via == "cdi":
        for g in gpus:
            out += ["--device", "nvidia.com/gpu=" + g]
    elif via == "gpus" and gpus:
        out += ["--gpus", '"device=%s"' % ",".join(gpus)]
    elif via in ("nvidia-runtime", "hook"):
        if via == "nvidia-runtime":
            out += ["--runtime", "nvidia"]
        out += ["--env", "NVIDIA_VISIBLE_DEVICES=" + (",".join(gpus) or "void")]
    for name, value in sorted((container.get("ulimits") or {}).items()):
        out += ["--ulimit", "%s=%s" % (name, value)]
    if os.path.isdir(IB_DEVICES):
        out += ["--device", IB_DEVICES, "--cap-add", "IPC_LOCK"]
    for source, target, readonly in container_binds(container):
        out += ["--volume", "%s:%s%s" % (source, target, ":ro" if readonly else "")]
    for name in sorted(set(env_names) | {"CUDA_VISIBLE_DEVICES"}):
        out += ["--env", name]
    return [*out, container["image"], *argv]


def _apptainer_argv(container, argv, workdir):
    out = [container["path"], "exec", "--pwd", workdir]
    if container.get("gpu_via") == "nv" and container.get("gpus"):
        out.append("--nv")
    for source, target, readonly in container_binds(container):
        out += ["--bind", "%s:%s%s" % (source, target, ":ro" if readonly else "")]
    return [*out, apptainer_image(container), *argv]


def image_present(container):
    """Whether the image is on this node already (then the pull step pulls nothing)."""
    if container["runtime"] == "apptainer":
        return os.path.exists(apptainer_image(container))
    return _runtime_call([container["path"], "image", "inspect", container["image"]]) == 0


def image_pull_argv(container):
    """The pull step's command, or None where there is nothing to pull (an apptainer image that is a path)."""
    if container["runtime"] != "apptainer":
        return [container["path"], "pull", container["image"]]
    if not container["image"].startswith(SIF_SCHEMES):
        return None
    return [container["path"], "pull", partial_sif(container), container["image"]]


def partial_sif(container):
    """Where apptainer pulls to (renamed into place once whole: two ranks never read half a SIF; the host name
    in it, as nodes that share a home may pull at once with the same pid)."""
    return "%s.%s.%d.partial" % (apptainer_image(container), os.uname()[1], os.getpid())


def image_pulled(container):
    """After a pull step that succeeded: an apptainer SIF renamed into place."""
    if container["runtime"] == "apptainer" and container["image"].startswith(SIF_SCHEMES):
        os.replace(partial_sif(container), apptainer_image(container))


def container_remove(container):
    """Remove the container, running or not (podman, docker); apptainer keeps none."""
    if container.get("runtime") in ("podman", "docker") and container.get("name"):
        now = ["--time", "0"] if container["runtime"] == "podman" else []  # docker's --force kills at once
        _runtime_call([container["path"], "rm", "--force", *now, container["name"]])


def container_running(container):
    """Whether the container still runs (for a run whose supervisor is gone)."""
    if container.get("runtime") not in ("podman", "docker") or not container.get("name"):
        return False
    argv = [container["path"], "container", "inspect", "--format", "{{.State.Running}}", container["name"]]
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=RUNTIME_CALL_S
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == b"true"


def _runtime_call(argv):
    try:
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=RUNTIME_CALL_S
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return None


def container_pids(cidfile, cgroups):
    """The processes of the container whose id the runtime wrote to `cidfile` (its cgroup names the id), for
    the hang detector's I/O counters: they are not in the step's process group, which holds the client.
    `cgroups`: a dict for one read of the node, filled by the first call ({pid: its /proc cgroup text}), so
    that a read of many runs in containers looks at /proc once."""
    try:
        with open(cidfile) as fh:
            cid = fh.read().strip()
    except OSError:
        return []
    if len(cid) < 12 or not all(c in "0123456789abcdef" for c in cid):
        return []
    if not cgroups:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/cgroup" % entry) as fh:
                        cgroups[int(entry)] = fh.read()
                except OSError:
                    continue
    return [pid for pid, text in cgroups.items() if cid in text]
