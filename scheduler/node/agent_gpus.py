"""The probe agent's GPU readers (node side, bundled into the agent's script: see agent.py and bundle.py).

GPUs: three readers, one shape. A simulated file (DESIGN.md, "Simulated GPUs"), NVML through ``pynvml`` when it
imports and initializes, else ``nvidia-smi``'s CSV output; each returns a GpuReading whose gpus are normalized
dicts, so the checks have one code path for every source. Python 3.8, standard library only (plus pynvml).
"""

import collections
import csv
import json
import math
import os
import shutil
import subprocess
import time

from ftconsole.scheduler.node.agent_common import (  # bundled
    MIB,
    NOT_AVAILABLE,
    as_bool,
    as_int,
    as_number,
    as_pids,
    as_str,
    keep_json,
    run_command,
)

GPU_FIELDS = (
    ("name", as_str),
    ("uuid", as_str),
    ("memory_total_mib", as_int),
    ("memory_used_mib", as_int),
    ("utilization", as_number),
    ("temperature", as_number),
    ("ecc_uncorrectable", as_int),
    ("retired_pages_pending", as_bool),
    ("remapped_rows_pending", as_bool),
    ("nvlink_down", as_int),
    ("healthy", as_bool),
    ("processes", as_pids),
    ("pcie_width", as_int),
    ("pcie_width_max", as_int),
    ("pcie_gen", as_int),
    ("pcie_gen_max", as_int),
    ("slowdown", None),  # the hardware slowdowns in force (SLOWDOWNS' names)
    ("retired_pages", as_int),
    ("nvlink_errors", as_int),
)

# NVML's clock event (throttle) reasons that say the hardware slows the GPU down, by bit: not the idle clocks, an
# application's clock setting or the software power cap, which are normal
SLOWDOWNS = (
    (0x8, "hw_slowdown"),  # nvmlClocksThrottleReasonHwSlowdown: thermal or power brake, the board's own
    (0x20, "sw_thermal"),  # nvmlClocksThrottleReasonSwThermalSlowdown
    (0x40, "hw_thermal"),  # nvmlClocksThrottleReasonHwThermalSlowdown
    (0x80, "hw_power_brake"),  # nvmlClocksThrottleReasonHwPowerBrakeSlowdown
)
SLOWDOWN_NAMES = tuple(name for _, name in SLOWDOWNS)


def as_slowdowns(value):
    """The known slowdown names of a list (a simulated file's, or NVML's read), in their order; None: unread."""
    if not isinstance(value, (list, tuple)):
        return None
    return [name for name in SLOWDOWN_NAMES if name in value]


def normalize_gpu(raw, position):
    """One GPU as the document's dict: every key present, wrong types and unknown values as null."""
    if not isinstance(raw, dict):
        raw = {}
    index = as_int(raw.get("index"))
    gpu = {"index": position if index is None else index}
    for key, convert in GPU_FIELDS:
        gpu[key] = (convert or as_slowdowns)(raw.get(key))
    return gpu


class GpuReading(object):
    def __init__(self, source, gpus=(), driver_version=None, error=None, boot_id=None):
        self.source = source
        self.gpus = [normalize_gpu(raw, i) for i, raw in enumerate(gpus)]
        self.driver_version = as_str(driver_version)
        self.error = error
        self.boot_id = as_str(boot_id)  # a simulated node's own boot id (its "reboot" changes it), else None


def read_gpus(params, deadline):
    """Simulated file if its env var is set, else NVML, else nvidia-smi, else no GPUs."""
    sim_path = os.environ.get(str(params["sim_gpus_env"]))
    if sim_path:
        return read_sim_gpus(sim_path, str(params["sim_gpus_env"]))
    try:
        return read_nvml_gpus() or read_smi_gpus(deadline) or GpuReading("none")
    except Exception as exc:
        return GpuReading("none", error="reading GPUs failed: %s: %s" % (type(exc).__name__, exc))


def read_sim_gpus(path, variable="FTCONSOLE_SIM_GPUS"):
    """The simulated-GPU file (DESIGN.md, "Simulated GPUs"), read afresh at every run."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        return GpuReading("sim", error="cannot read simulated GPU file %s: %s" % (path, exc))
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        return GpuReading("sim", error='simulated GPU file %s has no "gpus" list' % path)
    gpus = doc["gpus"]
    if doc.get("load") == "jobs":
        gpus = _sim_load((variable + "=" + path).encode(), gpus, time.time())
    return GpuReading("sim", gpus, doc.get("driver_version"), boot_id=doc.get("boot_id"))


_SIM_IDLE_SHELLS = (b"bash", b"sh", b"dash", b"zsh", b"ksh", b"fish")


def _sim_idle(pid):
    """Whether a process holds its GPUs without loading them, in the lab: an allocation's holder (``sleep
    infinity``), or a shell on a terminal (an allocation's shell at its prompt); a program run from that shell
    loads them as any."""
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            if f.read() == b"sleep\0infinity\0":
                return True
        with open("/proc/%s/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return False
    comm = stat[stat.find(b"(") + 1 : stat.rfind(b")")]
    fields = stat[stat.rfind(b")") + 2 :].split()
    return len(fields) > 4 and fields[4] != b"0" and comm in _SIM_IDLE_SHELLS  # fields[4]: tty_nr


def _sim_load(mark, gpus, now):
    """The lab's GPUs under its jobs (a simulated file with ``"load": "jobs"``): a GPU that a process of this
    simulated node holds (started under its SSH server, which sets the file's variable; its CUDA_VISIBLE_DEVICES
    names the GPU) reads a utilisation that moves with the time and 60 % of its memory in use, unless the process
    only holds it (`_sim_idle`: an allocation idles as on a real node); the others as the file says. `mark`: the
    variable's item (``FTCONSOLE_SIM_GPUS=<file>``). Only the processes the agent may read count (its own user's,
    or all as root)."""
    held = set()  # type: set
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mark not in env or _sim_idle(pid):
            continue
        for item in env:
            if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                held.update(int(p) for p in item.split(b"=", 1)[1].split(b",") if p.strip().isdigit())
    out = []
    for g in gpus:
        if isinstance(g, dict) and g.get("index") in held:
            total = g["memory_total_mib"] if isinstance(g.get("memory_total_mib"), int) else 0
            wave = math.sin(now / 90.0 + 1.7 * g["index"])  # a minute and a half a swing, each GPU its own
            g = dict(g, utilization=round(72 + 24 * wave), memory_used_mib=int(total * 0.6))
        out.append(g)
    return out


def nvml_value(nv, function, *args):
    """Call one NVML function by name; any error (NotSupported, missing in an old pynvml, ...) reads as None."""
    try:
        return getattr(nv, function)(*args)
    except Exception:
        return None


def read_nvml_gpus():
    """GPUs through pynvml, or None when pynvml is missing or NVML does not initialize."""
    try:
        import pynvml as nv
    except Exception:
        return None
    try:
        nv.nvmlInit()
    except Exception:
        return None
    try:
        count = nv.nvmlDeviceGetCount()
        gpus = [read_nvml_gpu(nv, index) for index in range(count)]
        return GpuReading("nvml", gpus, nvml_value(nv, "nvmlSystemGetDriverVersion"))
    except Exception as exc:
        return GpuReading("nvml", error="NVML: %s" % exc)
    finally:
        nvml_value(nv, "nvmlShutdown")


def read_nvml_gpu(nv, index):
    handle = nvml_value(nv, "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return {"index": index, "healthy": False}
    memory = nvml_value(nv, "nvmlDeviceGetMemoryInfo", handle)
    rates = nvml_value(nv, "nvmlDeviceGetUtilizationRates", handle)
    remapped = nvml_value(nv, "nvmlDeviceGetRemappedRows", handle)  # (corrected, uncorrected, pending, failed)
    ecc = nvml_value(
        nv,
        "nvmlDeviceGetTotalEccErrors",
        handle,
        getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        getattr(nv, "NVML_VOLATILE_ECC", 0),
    )
    retired = nvml_value(nv, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    return {
        "index": index,
        "name": nvml_value(nv, "nvmlDeviceGetName", handle),
        "uuid": nvml_value(nv, "nvmlDeviceGetUUID", handle),
        "memory_total_mib": mib_attr(memory, "total"),
        "memory_used_mib": mib_attr(memory, "used"),
        "utilization": getattr(rates, "gpu", None),
        "temperature": nvml_value(nv, "nvmlDeviceGetTemperature", handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0)),
        "ecc_uncorrectable": ecc,
        "retired_pages_pending": None if as_int(retired) is None else bool(retired),
        "remapped_rows_pending": tuple_flag(remapped, 2),
        "nvlink_down": nvml_nvlink_down(nv, handle),
        "healthy": False if tuple_flag(remapped, 3) else None,
        "processes": nvml_pids(nv, handle),
        "pcie_width": nvml_value(nv, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": nvml_value(nv, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        "pcie_gen": nvml_value(nv, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": nvml_value(nv, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "slowdown": nvml_slowdowns(nv, handle),
        "retired_pages": nvml_retired_pages(nv, handle),
        "nvlink_errors": nvml_nvlink_errors(nv, handle),
    }


def nvml_slowdowns(nv, handle):
    """The hardware slowdowns in force (SLOWDOWNS), from the clock event reasons (their older name too)."""
    reasons = as_int(nvml_value(nv, "nvmlDeviceGetCurrentClocksEventReasons", handle))
    if reasons is None:
        reasons = as_int(nvml_value(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", handle))
    if reasons is None:
        return None
    return [name for bit, name in SLOWDOWNS if reasons & bit]


def nvml_retired_pages(nv, handle):
    """Pages of memory retired for ECC errors (single-bit many times, or double-bit); None where the GPU remaps
    rows instead (A100 and later) or does not say."""
    counts = []
    for cause in (0, 1):  # NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, ..._DOUBLE_BIT_ECC_ERROR
        pages = nvml_value(nv, "nvmlDeviceGetRetiredPages", handle, cause)
        if isinstance(pages, (list, tuple)):
            counts.append(len(pages))
    return sum(counts) if counts else None


def nvml_nvlink_errors(nv, handle):
    """The NVLink errors counted since the driver loaded (replays, recoveries, CRC errors of flits and data), over
    the links that answer; None where none does."""
    total, answered = 0, False
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        for counter in range(4):  # NVML_NVLINK_ERROR_DL_REPLAY, _DL_RECOVERY, _DL_CRC_FLIT, _DL_CRC_DATA
            value = as_int(nvml_value(nv, "nvmlDeviceGetNvLinkErrorCounter", handle, link, counter))
            if value is not None:
                total, answered = total + value, True
    return total if answered else None


def mib_attr(memory, name):
    value = as_int(getattr(memory, name, None))
    return None if value is None else value // MIB


def tuple_flag(values, position):
    if not isinstance(values, (list, tuple)) or len(values) <= position:
        return None
    return bool(values[position])


def nvml_nvlink_down(nv, handle):
    """Links that are supported but not active; None when the GPU reports no NVLink at all."""
    supported = down = 0
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = as_int(nvml_value(nv, "nvmlDeviceGetNvLinkState", handle, link))
        if state is None:
            continue
        supported += 1
        if not state:
            down += 1
    return down if supported else None


def nvml_pids(nv, handle):
    processes = nvml_value(nv, "nvmlDeviceGetComputeRunningProcesses", handle) or []
    return [getattr(p, "pid", None) for p in processes]


SMI_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "temperature.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "driver_version",
)


def read_smi_gpus(deadline):
    """GPUs through nvidia-smi's CSV output, or None when nvidia-smi is not on PATH."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = ["--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits"]
    try:
        output = run_command([smi, *query], deadline)
    except (OSError, subprocess.SubprocessError) as exc:
        return GpuReading("nvidia-smi", error="nvidia-smi failed: %s" % exc)
    rows = [smi_row(cells) for cells in csv.reader(output.splitlines(), skipinitialspace=True) if cells]
    pids = smi_pids_by_uuid(smi, deadline)
    gpus = [smi_gpu(row, pids) for row in rows]
    deeper = smi_deeper(smi, deadline)
    for gpu in gpus:
        gpu.update(deeper.get(gpu["index"], {}))
    driver = smi_text(rows[0].get("driver_version")) if rows else None
    return GpuReading("nvidia-smi", gpus, driver)


# The deeper readings (as NVML's, in read_nvml_gpu), asked apart: a driver that lacks a field refuses the whole
# query ("is not a valid field to query"), so the basic one above never depends on them. clocks_throttle_reasons
# is the older name of clocks_event_reasons, which drivers of today take too (580 lists both).
SMI_DEEPER = (
    "index",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown",
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "remapped_rows.pending",
)
SMI_PCIE = SMI_DEEPER[:5]  # asked alone where a driver refuses the rest (the PCIe link is the oldest of them)


def smi_deeper(smi, deadline):
    """{GPU index: the deeper readings} through nvidia-smi; {} where the driver answers neither query."""
    for fields in (SMI_DEEPER, SMI_PCIE):
        query = ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]
        try:
            output = run_command([smi, *query], deadline)
        except (OSError, subprocess.SubprocessError):
            continue
        out = {}
        for cells in csv.reader(output.splitlines(), skipinitialspace=True):
            row = smi_row(cells, fields)
            index = smi_number(row.get("index"))
            if isinstance(index, int):
                out[index] = smi_deeper_gpu(row)
        return out
    return {}


def smi_deeper_gpu(row):
    slowdown = [smi_active(row.get("clocks_throttle_reasons." + name)) for name in SMI_SLOWDOWNS]
    retired = [smi_number(row.get("retired_pages.%s.count" % kind)) for kind in ("single_bit_ecc", "double_bit")]
    counted = [n for n in retired if isinstance(n, int)]
    gpu = {
        "pcie_width": smi_number(row.get("pcie.link.width.current")),
        "pcie_width_max": smi_number(row.get("pcie.link.width.max")),
        "pcie_gen": smi_number(row.get("pcie.link.gen.current")),
        "pcie_gen_max": smi_number(row.get("pcie.link.gen.max")),
        "slowdown": None if None in slowdown else [SLOWDOWN_NAMES[i] for i, on in enumerate(slowdown) if on],
        "retired_pages": sum(counted) if counted else None,
    }
    if "remapped_rows.pending" in row:
        gpu["remapped_rows_pending"] = smi_yes_no(row.get("remapped_rows.pending"))
    return gpu


# nvidia-smi's names of SLOWDOWNS, in their order
SMI_SLOWDOWNS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def smi_active(cell):
    """A clock event reason's cell: True (Active), False (Not Active), None (not read)."""
    text = (smi_text(cell) or "").lower()
    return {"active": True, "not active": False}.get(text)


def smi_row(cells, fields=SMI_FIELDS):
    """{field: cell} of one CSV row; fields missing at the end of a short row are left out."""
    return dict((field, cells[i]) for i, field in enumerate(fields) if i < len(cells))


def smi_text(cell):
    cell = (cell or "").strip()
    return None if cell in NOT_AVAILABLE else cell


def smi_number(cell):
    text = smi_text(cell)
    if text is None:
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return None


def smi_yes_no(cell):
    text = (smi_text(cell) or "").lower()
    return {"yes": True, "no": False}.get(text)


def smi_gpu(row, pids_by_uuid):
    uuid = smi_text(row.get("uuid"))
    return {
        "index": smi_number(row.get("index")),
        "name": smi_text(row.get("name")),
        "uuid": uuid,
        "memory_total_mib": smi_number(row.get("memory.total")),
        "memory_used_mib": smi_number(row.get("memory.used")),
        "utilization": smi_number(row.get("utilization.gpu")),
        "temperature": smi_number(row.get("temperature.gpu")),
        "ecc_uncorrectable": smi_number(row.get("ecc.errors.uncorrected.volatile.total")),
        "retired_pages_pending": smi_yes_no(row.get("retired_pages.pending")),
        "processes": pids_by_uuid.get(uuid, []),
    }


def smi_pids_by_uuid(smi, deadline):
    """{gpu uuid: [pid]} of compute processes; {} when nvidia-smi cannot say."""
    query = ["--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"]
    try:
        output = run_command([smi, *query], deadline)
    except (OSError, subprocess.SubprocessError):
        return {}
    pids = collections.defaultdict(list)
    for cells in csv.reader(output.splitlines(), skipinitialspace=True):
        if len(cells) >= 2 and smi_number(cells[1]) is not None:
            pids[cells[0].strip()].append(smi_number(cells[1]))
    return dict(pids)


# -- NVLink errors as a rate ---------------------------------------------------------------------------------

NVLINK_KEPT = "~/.ftconsole/probe/nvlink.json"  # the last probe's NVLink error totals (nvlink-NODE.json, per node)
NVLINK_MIN_GAP_S = 1.0  # a reading closer than this to the kept one gives no rate and does not replace it


def nvlink_rates(gpus, path, boot, now):
    """Each GPU's NVLink errors per second since the last probe of this node (by GPU uuid), as
    ``nvlink_error_rate`` in its dict (None: no earlier reading of this boot, or too close to it); the totals
    are kept at `path` for the next probe. The counters count from the driver's load, so a new boot, or a total
    lower than the kept one, starts again."""
    totals = dict((g["uuid"], g["nvlink_errors"]) for g in gpus if g.get("uuid") and g.get("nvlink_errors") is not None)
    for gpu in gpus:
        gpu["nvlink_error_rate"] = None
    if not path or not totals:
        return
    mine = None
    try:
        with open(path) as fh:
            mine = json.load(fh)
    except (OSError, ValueError):
        pass
    if isinstance(mine, dict) and mine.get("boot") == boot and isinstance(mine.get("at"), (int, float)):
        gap = now - mine["at"]
        if 0 <= gap < NVLINK_MIN_GAP_S:
            return
        before = mine["totals"] if isinstance(mine.get("totals"), dict) else {}
        for gpu in gpus:
            was, now_total = before.get(gpu.get("uuid")), gpu.get("nvlink_errors")
            if gap > 0 and isinstance(was, int) and now_total is not None and now_total >= was:
                gpu["nvlink_error_rate"] = round((now_total - was) / gap, 3)
    keep_json(path, {"boot": boot, "at": now, "totals": totals})
