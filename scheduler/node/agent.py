"""ftconsole probe agent: the node side of the probes, printed as one JSON document.

Protocol
--------
The console ships this file (bundled with its modules, see below) over SSH and runs it as ``python3 -``. It
prepends exactly one statement::

    source = "import json\\nPARAMS = json.loads(%r)\\n" % json.dumps(params) + AGENT_SOURCE

Run as a plain script (``python3 scheduler/node/agent.py ['{"checks": ["dns"]}']``) PARAMS comes from argv[1], or the
defaults below are used. PARAMS keys, all optional:

    checks        list of check names to run (default: all, in CHECK_NAMES order; others are left out)
    dns_names     host names the ``dns`` check resolves
    cache_dir     folder of the ``disk-size cache`` check (default /cache; ``~`` is expanded)
    thresholds    pass conditions; keys and defaults as ``scheduler.config.Thresholds``
    sim_gpus_env  name of the env var naming a simulated-GPU JSON file (default FTCONSOLE_SIM_GPUS)
    sysroot       prefix for /, /dev/shm, /proc, /sys/class/infiniband, /etc/os-release and the container
                  runtimes' files (CDI specs, hooks; tests: a fake tree)
    timeout       seconds for all slow sub-steps together (DNS, nvidia-smi, container runtimes); default 10
    runtimes_max_age  seconds the last reading of the container runtimes is reused (kept in RUNTIMES_CACHE
                  under the account's home, while nothing it depends on changed: see agent_runtimes); default
                  0, read every time; never with a sysroot other than /
    node          the name of the node the scheduler asks about: the kept reading is that node's alone
                  (RUNTIMES_CACHE with the name in it), as nodes may share a home

The agent prints exactly ONE line on stdout, compact JSON that ``probes.results.parse_document`` reads::

    {"agent": 1, "duration_s": 0.12, "facts": {...}, "gpus": [{...}], "checks": [{...}]}

A value that cannot be read is null, never a crash. A check that raises is reported as that check's "fail"
with the error as its message. The exit status is 0 whenever the document was printed, whatever the checks say.

Layers: readers (node facts here; GPUs from a simulated file, NVML, or nvidia-smi, all normalized to the same
dicts, in agent_gpus.py; container runtimes in agent_runtimes.py) -> checks (one code path for every GPU
source) -> the document. Python 3.8, standard library only; ``pynvml`` is used when it imports and
initializes.

The node runs one script: this file after the modules it imports with lines marked ``# bundled``
(agent_common.py, agent_gpus.py, agent_runtimes.py, proc.py), joined by ``bundle.script("agent")``
(bundle.py). Run here as a plain script, those imports find the modules in the
installed ftconsole package.
"""

import collections
import os
import platform
import resource
import socket
import sys
import threading
import time

from ftconsole.scheduler.node.agent_common import (  # bundled
    Deadline,
    as_int,
    as_list,
    as_number,
    host_path,
    merged_params,
    print_one_line,
    read_text,
    safe,
)
from ftconsole.scheduler.node.agent_gpus import NVLINK_KEPT, nvlink_rates, read_gpus  # bundled
from ftconsole.scheduler.node.agent_runtimes import RUNTIMES_CACHE, read_runtimes  # bundled
from ftconsole.scheduler.node.proc import BOOT_ID, boot_id  # bundled

AGENT_PROTOCOL = 1

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"

CHECK_NAMES = (
    "dns",
    "disk-size root",
    "disk-size shm",
    "disk-size cache",
    "ulimit",
    "gpu-check",
    "gpu-health",
    "gpu-temperature",
    "nvlink",
    "infiniband",
    "memory",
    "load",
)

# Same keys and defaults as scheduler.config.Thresholds (seed 000's pass conditions).
DEFAULT_THRESHOLDS = {
    "disk_root_gb": 32.0,
    "disk_shm_gb": 1.0,
    "disk_cache_gb": 32.0,
    "ulimit_memlock_kb": 16000,
    "ulimit_nofile": 1000000,
    "ulimit_stack_kb": 8000,
    "ulimit_nproc": 1000000,
    "gpus_expected": None,
    "gpu_temp_warn_c": 85.0,
    "gpu_temp_fail_c": 95.0,
    "mem_available_warn_pct": 5.0,
    "load_warn_per_cpu": 2.0,
    "nvlink_error_rate_warn": 100.0,
}

DEFAULT_PARAMS: dict = {
    "checks": None,
    "dns_names": [],
    "cache_dir": "/cache",
    "sim_gpus_env": "FTCONSOLE_SIM_GPUS",
    "sysroot": "/",
    "runtimes_max_age": 0,
    "timeout": 10.0,
    "node": None,
}

GB = 1e9


def fmt(number):
    """A number for a message: 1000000 not 1e+06, 32 not 32.0."""
    if isinstance(number, float) and number.is_integer():
        return str(int(number))
    return str(number)


# ---------------------------------------------------------------------------------------------------------
# Parameters


def load_params(argv):
    """PARAMS (prepended by the console) or argv[1] (a JSON string), merged over the defaults."""
    params, given = merged_params(argv, globals().get("PARAMS"), DEFAULT_PARAMS, apart=("thresholds",))
    thresholds = dict(DEFAULT_THRESHOLDS)
    if isinstance(given.get("thresholds"), dict):
        thresholds.update((k, v) for k, v in given["thresholds"].items() if v is not None)
    params["thresholds"] = thresholds
    if as_number(params["timeout"]) is None:
        params["timeout"] = DEFAULT_PARAMS["timeout"]
    return params


def selected_checks(checks):
    """The check names to run, in the fixed order of CHECK_NAMES."""
    if checks is None:
        return list(CHECK_NAMES)
    if isinstance(checks, str):
        checks = [checks]
    wanted = set(c for c in as_list(checks) if isinstance(c, str))
    return [name for name in CHECK_NAMES if name in wanted]


# ---------------------------------------------------------------------------------------------------------
# Node facts


def read_meminfo(sysroot):
    """/proc/meminfo as {key: kB}."""
    values = {}
    for line in (read_text(host_path(sysroot, "/proc/meminfo")) or "").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key.strip()] = int(fields[0])
    return values


def kib_to_mib(kib):
    return None if kib is None else kib // 1024


def read_load1(sysroot):
    fields = (read_text(host_path(sysroot, "/proc/loadavg")) or "").split()
    return safe(float, fields[0]) if fields else None


def read_os_name(sysroot):
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        for line in (read_text(host_path(sysroot, path)) or "").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "PRETTY_NAME":
                return value.strip().strip("\"'")
    return None


def ib_devices(sysroot):
    try:
        return sorted(os.listdir(host_path(sysroot, "/sys/class/infiniband")))
    except OSError:
        return []


def ib_ports(sysroot):
    """[(device, port, state)] with state like "ACTIVE" read from ports/<n>/state ("4: ACTIVE")."""
    ports = []
    for device in ib_devices(sysroot):
        ports_dir = host_path(sysroot, "/sys/class/infiniband/%s/ports" % device)
        try:
            numbers = sorted(os.listdir(ports_dir), key=lambda n: (len(n), n))
        except OSError:
            continue
        for number in numbers:
            text = read_text(os.path.join(ports_dir, number, "state"))
            state = text.split(":", 1)[-1].strip() if text else "UNKNOWN"
            ports.append((device, number, state))
    return ports


def read_facts(sysroot):
    meminfo = safe(read_meminfo, sysroot) or {}
    return {
        "hostname": safe(socket.gethostname),
        "boot_id": safe(boot_id, host_path(sysroot, BOOT_ID)),
        "os": safe(read_os_name, sysroot),
        "kernel": safe(platform.release) or None,
        "cpus": safe(os.cpu_count),
        "mem_total_mib": kib_to_mib(meminfo.get("MemTotal")),
        "mem_available_mib": kib_to_mib(meminfo.get("MemAvailable")),
        "load1": safe(read_load1, sysroot),
        "python": platform.python_version(),
        "driver_version": None,
        "gpu_source": None,
        "infiniband": bool(safe(ib_devices, sysroot)),
        "runtimes": [],
    }


# ---------------------------------------------------------------------------------------------------------
# DNS: started before the other reads so lookups overlap them; each name in its own daemon thread.


class DnsLookup(object):
    def __init__(self, names):
        self.names: list = []
        for name in as_list(names):
            if isinstance(name, str) and name and name not in self.names:
                self.names.append(name)
        self.errors = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.resolve, args=(n,), daemon=True) for n in self.names]
        for thread in self.threads:
            thread.start()

    def resolve(self, name):
        try:
            socket.getaddrinfo(name, None)
            error = None
        except Exception as exc:
            error = str(exc) or type(exc).__name__
        with self.lock:
            self.errors[name] = error

    def wait(self, deadline):
        """{name: None if it resolved, else why not}; names still pending at the deadline time out."""
        for thread in self.threads:
            thread.join(deadline.remaining(floor=0.0))
        with self.lock:
            return dict((name, self.errors.get(name, "timed out")) for name in self.names)


# ---------------------------------------------------------------------------------------------------------
# Checks. Each takes (context, name) and returns one result dict; all GPU sources look the same here.


class Context(object):
    def __init__(self, params, facts, reading, dns, deadline):
        self.params = params
        self.thresholds = params["thresholds"]
        self.sysroot = str(params["sysroot"])
        self.facts = facts
        self.gpus = reading.gpus
        self.gpu_error = reading.error
        self.gpu_source = reading.source
        self.dns = dns
        self.deadline = deadline


def result(name, status, message, value=None, threshold=None, unit=""):
    return {
        "name": name,
        "status": status,
        "value": value,
        "threshold": threshold,
        "unit": unit,
        "message": message,
    }


def check_dns(ctx, name):
    names = ctx.dns.names
    if not names:
        return result(name, SKIP, "no host names to resolve")
    outcome = ctx.dns.wait(ctx.deadline)
    failed = ["%s (%s)" % (host, why) for host, why in outcome.items() if why is not None]
    resolved = len(names) - len(failed)
    if failed:
        message = "did not resolve: " + ", ".join(failed)
        return result(name, FAIL, message, resolved, len(names), "names")
    return result(name, PASS, "all %d names resolve" % len(names), resolved, len(names), "names")


def disk_check(name, shown_path, real_path, need_gb):
    try:
        stat = os.statvfs(real_path)
    except OSError as exc:
        return result(name, FAIL, "cannot read free space on %s: %s" % (shown_path, exc), None, need_gb, "GB")
    free_gb = stat.f_bavail * stat.f_frsize / GB
    status = PASS if free_gb > need_gb else FAIL
    message = "%.1f GB free on %s, need > %s GB" % (free_gb, shown_path, fmt(need_gb))
    return result(name, status, message, round(free_gb, 1), need_gb, "GB")


def check_disk_root(ctx, name):
    return disk_check(name, "/", host_path(ctx.sysroot, "/"), ctx.thresholds["disk_root_gb"])


def check_disk_shm(ctx, name):
    return disk_check(name, "/dev/shm", host_path(ctx.sysroot, "/dev/shm"), ctx.thresholds["disk_shm_gb"])


def check_disk_cache(ctx, name):
    path = os.path.expanduser(ctx.params["cache_dir"])
    if not os.path.isdir(path):
        return result(name, SKIP, "%s does not exist" % path, None, ctx.thresholds["disk_cache_gb"], "GB")
    return disk_check(name, path, path, ctx.thresholds["disk_cache_gb"])


Ulimit = collections.namedtuple("Ulimit", "key label rlimit divisor threshold unit")

ULIMITS = (
    Ulimit("memlock", "max locked memory", "RLIMIT_MEMLOCK", 1024, "ulimit_memlock_kb", " KB"),
    Ulimit("nofile", "open files", "RLIMIT_NOFILE", 1, "ulimit_nofile", ""),
    Ulimit("stack", "stack size", "RLIMIT_STACK", 1024, "ulimit_stack_kb", " KB"),
    Ulimit("nproc", "max user processes", "RLIMIT_NPROC", 1, "ulimit_nproc", ""),
)


def soft_limit(limit):
    """The soft limit in the threshold's unit, or None when unlimited."""
    soft = resource.getrlimit(getattr(resource, limit.rlimit))[0]
    return None if soft == resource.RLIM_INFINITY else soft // limit.divisor


def check_ulimit(ctx, name):
    if not ctx.facts["infiniband"]:
        return result(name, SKIP, "no InfiniBand device; not required")
    values, needs, failures = [], [], []
    for limit in ULIMITS:
        need = ctx.thresholds[limit.threshold]
        current = soft_limit(limit)
        shown = "unlimited" if current is None else fmt(current)
        values.append("%s=%s" % (limit.key, shown))
        needs.append("%s>%s" % (limit.key, fmt(need)))
        if current is not None and not current > need:
            failures.append("%s %s%s (need > %s%s)" % (limit.label, shown, limit.unit, fmt(need), limit.unit))
    value, threshold = " ".join(values), " ".join(needs)
    if failures:
        return result(name, FAIL, "too low: " + "; ".join(failures), value, threshold)
    return result(name, PASS, "all limits above their thresholds", value, threshold)


def gpu_names(gpus):
    return ", ".join("GPU %s" % g["index"] for g in gpus)


def check_gpu_count(ctx, name):
    found, expected = len(ctx.gpus), as_int(ctx.thresholds["gpus_expected"])
    problem = " (%s)" % ctx.gpu_error if ctx.gpu_error else ""
    if expected and found < expected:
        return result(name, FAIL, "found %d GPUs, expected %d%s" % (found, expected, problem), found, expected)
    if found:
        return result(name, PASS, "found %d GPUs via %s" % (found, ctx.gpu_source), found, expected)
    if ctx.gpu_error:
        return result(name, WARN, "no GPUs: %s" % ctx.gpu_error, found, expected)
    return result(name, SKIP, "no GPU expected", found, expected)


def gpu_faults(gpu):
    faults = []
    if (gpu["ecc_uncorrectable"] or 0) > 0:
        faults.append("%d uncorrectable ECC errors" % gpu["ecc_uncorrectable"])
    if gpu["healthy"] is False:
        faults.append("reported unhealthy")
    return faults


def gpu_pending(gpu):
    """What makes a GPU suspect, short of failed: memory retirement waiting for a reset, a PCIe link narrower than
    the GPU's (a bad riser or slot: the link's generation drops at idle by design, its width does not), the
    hardware slowing the GPU down (thermal or power brake: every rank of a job waits for the slowest)."""
    pending = []
    if gpu["retired_pages_pending"]:
        pending.append("retired pages pending")
    if gpu["remapped_rows_pending"]:
        pending.append("remapped rows pending")
    width, widest = gpu["pcie_width"], gpu["pcie_width_max"]
    if width is not None and widest is not None and 0 < width < widest:
        pending.append("PCIe link x%d of x%d" % (width, widest))
    if gpu["slowdown"]:
        pending.append("slowed down by the hardware (%s)" % ", ".join(gpu["slowdown"]))
    return pending


def check_gpu_health(ctx, name):
    if not ctx.gpus:
        return result(name, SKIP, "no GPUs")
    faulty = ["GPU %s: %s" % (g["index"], ", ".join(gpu_faults(g))) for g in ctx.gpus if gpu_faults(g)]
    pending = ["GPU %s: %s" % (g["index"], ", ".join(gpu_pending(g))) for g in ctx.gpus if gpu_pending(g)]
    if faulty:
        return result(name, FAIL, "; ".join(faulty + pending), len(faulty), 0, "GPUs")
    if pending:
        return result(name, WARN, "; ".join(pending), len(pending), 0, "GPUs")
    return result(name, PASS, "%d GPUs healthy" % len(ctx.gpus), 0, 0, "GPUs")


def check_gpu_temperature(ctx, name):
    readable = [g for g in ctx.gpus if g["temperature"] is not None]
    if not readable:
        return result(name, SKIP, "no GPU temperature readable")
    hottest = max(readable, key=lambda g: g["temperature"])
    temp = hottest["temperature"]
    warn_at, fail_at = ctx.thresholds["gpu_temp_warn_c"], ctx.thresholds["gpu_temp_fail_c"]
    where = "GPU %s at %s C" % (hottest["index"], fmt(temp))
    if temp >= fail_at:
        return result(name, FAIL, "%s, fail at >= %s C" % (where, fmt(fail_at)), temp, fail_at, "C")
    if temp >= warn_at:
        return result(name, WARN, "%s, warn at >= %s C" % (where, fmt(warn_at)), temp, warn_at, "C")
    return result(name, PASS, "hottest %s, warn at >= %s C" % (where, fmt(warn_at)), temp, warn_at, "C")


def check_nvlink(ctx, name):
    reporting = [g for g in ctx.gpus if g["nvlink_down"] is not None]
    if not reporting:
        return result(name, SKIP, "no GPU reports NVLink state")
    down = [g for g in reporting if g["nvlink_down"] > 0]
    links = sum(g["nvlink_down"] for g in down)
    if down:
        detail = ", ".join("GPU %s (%d down)" % (g["index"], g["nvlink_down"]) for g in down)
        return result(name, WARN, "NVLink links down: " + detail, links, 0, "links")
    warn_at = ctx.thresholds["nvlink_error_rate_warn"]
    rated = [g for g in reporting if g.get("nvlink_error_rate") is not None]
    worst = max(rated, key=lambda g: g["nvlink_error_rate"]) if rated else None
    if worst is not None and worst["nvlink_error_rate"] >= warn_at:
        rate = worst["nvlink_error_rate"]
        text = "GPU %s: %s NVLink errors/s since the last probe, warn at >= %s/s" % (
            worst["index"],
            fmt(rate),
            fmt(warn_at),
        )
        return result(name, WARN, text, rate, warn_at, "errors/s")
    return result(name, PASS, "all NVLink links up on %s" % gpu_names(reporting), 0, 0, "links")


def check_infiniband(ctx, name):
    if not ctx.facts["infiniband"]:
        return result(name, SKIP, "no InfiniBand device")
    ports = ib_ports(ctx.sysroot)
    if not ports:
        return result(name, SKIP, "InfiniBand devices have no ports")
    down = ["%s/%s %s" % port for port in ports if port[2] != "ACTIVE"]
    active = len(ports) - len(down)
    if down:
        return result(name, FAIL, "ports not ACTIVE: " + ", ".join(down), active, len(ports), "ports")
    return result(name, PASS, "%d ports ACTIVE" % len(ports), active, len(ports), "ports")


def check_memory(ctx, name):
    total, available = ctx.facts["mem_total_mib"], ctx.facts["mem_available_mib"]
    if not total or available is None:
        return result(name, SKIP, "MemTotal/MemAvailable not readable")
    percent = available * 100.0 / total
    need = ctx.thresholds["mem_available_warn_pct"]
    message = "%.1f%% of memory available (%d of %d MiB), warn below %s%%" % (
        percent,
        available,
        total,
        fmt(need),
    )
    status = WARN if percent < need else PASS
    return result(name, status, message, round(percent, 1), need, "%")


def check_load(ctx, name):
    load1, cpus = ctx.facts["load1"], ctx.facts["cpus"]
    if load1 is None or not cpus:
        return result(name, SKIP, "load average or CPU count not readable")
    per_cpu = load1 / cpus
    limit = ctx.thresholds["load_warn_per_cpu"]
    message = "load %.2f on %d CPUs (%.2f per CPU), warn above %s" % (load1, cpus, per_cpu, fmt(limit))
    status = WARN if per_cpu > limit else PASS
    return result(name, status, message, round(per_cpu, 2), limit, "per CPU")


CHECKS = (
    ("dns", check_dns),
    ("disk-size root", check_disk_root),
    ("disk-size shm", check_disk_shm),
    ("disk-size cache", check_disk_cache),
    ("ulimit", check_ulimit),
    ("gpu-check", check_gpu_count),
    ("gpu-health", check_gpu_health),
    ("gpu-temperature", check_gpu_temperature),
    ("nvlink", check_nvlink),
    ("infiniband", check_infiniband),
    ("memory", check_memory),
    ("load", check_load),
)


def run_check(ctx, name, check):
    try:
        return check(ctx, name)
    except Exception as exc:
        return result(name, FAIL, "check crashed: %s: %s" % (type(exc).__name__, exc))


def run_checks(ctx, names):
    return [run_check(ctx, name, check) for name, check in CHECKS if name in names]


# ---------------------------------------------------------------------------------------------------------


def runtimes_cache(node, kept=RUNTIMES_CACHE):
    """Where the kept reading of the container runtimes of `node` lies (or another file kept per node, `kept`):
    one file per node, as nodes that share a home (NFS) each have runtimes of their own; a name that is not plain
    keeps none."""
    if node is None:
        return os.path.expanduser(kept)
    if not isinstance(node, str) or not node or node.startswith(".") or any(c in node for c in "/\\\0"):
        return None
    base, ext = os.path.splitext(os.path.expanduser(kept))
    return "%s-%s%s" % (base, node, ext)


def probe(params):
    """Read the node, run the selected checks, and return the document."""
    started = time.monotonic()
    deadline = Deadline(params["timeout"])
    names = selected_checks(params["checks"])
    dns = DnsLookup(params["dns_names"] if "dns" in names else [])
    facts = read_facts(str(params["sysroot"]))
    reading = read_gpus(params, deadline)
    facts["driver_version"] = reading.driver_version
    facts["gpu_source"] = reading.source
    if reading.boot_id:  # a simulated node (the lab) that shares the kernel of its neighbours has its own
        facts["boot_id"] = reading.boot_id
    kept = runtimes_cache(params.get("node"), NVLINK_KEPT) if params["sysroot"] == "/" else None
    nvlink_rates(reading.gpus, kept, facts.get("boot_id"), time.time())
    cache = runtimes_cache(params.get("node")) if params["sysroot"] == "/" else None  # not for a test's tree
    max_age = as_number(params.get("runtimes_max_age")) or 0.0
    facts["runtimes"] = safe(read_runtimes, str(params["sysroot"]), deadline, max_age, cache) or []
    checks = run_checks(Context(params, facts, reading, dns, deadline), names)
    return {
        "agent": AGENT_PROTOCOL,
        "duration_s": round(time.monotonic() - started, 3),
        "facts": facts,
        "gpus": reading.gpus,
        "checks": checks,
    }


def main(argv):
    return print_one_line("agent", load_params, probe, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
