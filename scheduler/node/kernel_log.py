"""The NVIDIA driver's Xid lines in a node's kernel log, for the hang evidence: node side, standard library only,
Python 3.8 (bundled into the supervisor with supervisor_evidence.py).

The driver logs every GPU error it sees as ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the
bus.``: the GPU's PCI address and the error's number (NVIDIA's Xid catalog says which point to the hardware).
`xids(since, ...)` reads them from ``/dev/kmsg`` (readable by root, or by anyone where kernel.dmesg_restrict is
0), else from ``journalctl -k`` (members of the adm or systemd-journal groups), and gives each with its wall time
and the index of its GPU on this node: GPUs are numbered in the order of their PCI addresses, as NVML and
nvidia-smi number them, from the driver's ``/proc/driver/nvidia/gpus/<address>`` folders, or from the
simulated-GPU file's ``pci_bus_id`` where the node's GPUs are simulated (the lab).
"""

import errno
import json
import os
import re
import subprocess
import time

KMSG = "/dev/kmsg"
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
MAX_XIDS = 32  # the newest kept
MAX_KMSG_RECORDS = 100000  # a ring buffer holds far fewer; this bounds a read that never ends
# The driver's line, from its start: "NVRM: Xid (PCI:...): N, ..." (after dmesg's "[ 12.345] " where a tool added it).
# Anchored, so that a line of another author that holds the words (a segfault "in NVRM: Xid ..." names a user's
# file) is never read as the driver's: a node leaves service only on the driver's own evidence.
XID = re.compile(
    r"(?:\[\s*\d+\.\d+\]\s*)?NVRM: Xid "
    r"\(PCI:([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.\d)?\): (\d+)(.*)"
)


def pci_address(text):
    """A PCI address as "DDDD:BB:DD", lower case, from an Xid line's or NVML's form ("00000000:3B:00.0")."""
    found = re.match(r"\s*([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})", text or "")
    if not found:
        return None
    domain, bus, device = (int(part, 16) for part in found.groups())
    return "%04x:%02x:%02x" % (domain, bus, device)


def parse_xid(message):
    """(pci address, Xid number, the rest of the line) of a driver's Xid line, else None."""
    found = XID.match(message)
    if not found:
        return None
    domain, bus, device, code, rest = found.groups()
    return pci_address("%s:%s:%s" % (domain, bus, device)), int(code), rest.lstrip(", ").strip()


def gpu_addresses(sim_path):
    """{pci address: GPU index} of this node's GPUs (None: not known: no driver folder, no simulated address)."""
    if sim_path:
        try:
            with open(sim_path, encoding="utf-8") as fh:
                gpus = json.load(fh).get("gpus") or []
        except (OSError, ValueError, AttributeError):
            return None
        found = {}
        for position, gpu in enumerate(gpus):
            address = pci_address(gpu.get("pci_bus_id")) if isinstance(gpu, dict) else None
            if address is None:
                return None
            index = gpu.get("index")
            found[address] = index if isinstance(index, int) else position
        return found or None
    try:
        names = os.listdir(NVIDIA_GPUS)
    except OSError:
        return None
    addresses = sorted(a for a in (pci_address(n) for n in names) if a is not None)
    return {address: index for index, address in enumerate(addresses)} or None


def _kmsg(since):
    """[(wall time, message)] of the kernel log's records since `since`; raises OSError where it cannot be read."""
    boot_wall = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
    out = []
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break  # the end of the buffer
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten while reading: go on with the oldest left
                raise
            if not record:
                break
            head, _, message = record.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            if len(fields) < 3 or "NVRM: Xid" not in message:
                continue
            try:
                at = boot_wall + int(fields[2]) / 1e6
            except ValueError:
                continue
            if at >= since:
                out.append((at, message.split("\n", 1)[0]))
    finally:
        os.close(fd)
    return out


def _journal(since):
    """The same from journalctl (the kernel's messages in the journal), or raises OSError with why not."""
    try:
        done = subprocess.run(
            ["journalctl", "-k", "-q", "--no-pager", "-o", "json", "--since", "@%d" % int(since), "-g", "NVRM: Xid"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=5, universal_newlines=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise OSError("journalctl: %s" % exc) from exc
    if done.returncode not in (0, 1):  # 1: nothing matched
        raise OSError("journalctl -k: %s" % (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1])
    out = []
    for line in done.stdout.splitlines():
        try:
            entry = json.loads(line)
            out.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6, str(entry["MESSAGE"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def xids(since, sim_path=None):
    """{"xids": [{time, pci, code, text, gpu}], "foreign": n} of the driver's Xid lines since `since` (wall time),
    the newest MAX_XIDS; gpu is the GPU's index here, None where this node's addresses are not known. A line naming
    an address that none of this node's GPUs has, where all of them are known, is another machine's (the lab's
    nodes share one kernel): counted in "foreign", not listed. {"error": why} where no log could be read."""
    try:
        lines = _kmsg(since)
    except OSError as first:
        try:
            lines = _journal(since)
        except OSError as second:
            return {"error": "cannot read the kernel log: %s: %s; %s" % (KMSG, first.strerror or first, second)}
    addresses = gpu_addresses(sim_path)
    found, foreign = [], 0
    for at, message in lines:
        parsed = parse_xid(message)
        if parsed is None:
            continue
        pci, code, rest = parsed
        gpu = None if addresses is None else addresses.get(pci)
        if addresses is not None and gpu is None:
            foreign += 1
            continue
        found.append({"time": round(at, 3), "pci": pci, "code": code, "text": rest[:200], "gpu": gpu})
    return {"xids": found[-MAX_XIDS:], "foreign": foreign}
