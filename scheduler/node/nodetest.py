"""ftconsole node tests: a GPU test under load on one node (NVIDIA DCGM's diagnostics), printed as one JSON line.

Protocol
--------
The scheduler ships this file (bundled with agent_common.py, see below) over SSH and runs it as ``python3 -``. It
prepends exactly one statement, as for the probe agent (``bundle.python_stdin_script``)::

    source = "import json\\nPARAMS = json.loads(%r)\\n" % json.dumps(params) + NODETEST_SOURCE

Run as a plain script (``python3 scheduler/node/nodetest.py ['{"tests": {"gpu": {"level": 2}}}']``) PARAMS comes
from argv[1], or the defaults below are used. PARAMS keys, all optional:

    tests         the tests to run: an object of test name -> its options (default {"gpu": {}}), or a list of
                  names (each with its defaults). The one test is "gpu"; its options:
                      level    DCGM's run level (``dcgmi diag -r``), 1 (quick) to 4 (longest); default 1
                      timeout  seconds the test may take; default 600
    sim_gpus_env  name of the env var naming a simulated-GPU JSON file (default FTCONSOLE_SIM_GPUS)

The script prints exactly ONE line on stdout, compact JSON, one result per test in the order asked::

    {"nodetest": 1, "results": [{"test": "gpu", "level": 1, "result": "pass", "summary": "...",
                                 "failures": ["GPU 1: memory: ..."], "warnings": [], "tool": "dcgmi",
                                 "took_s": 1.23}]}

result is "pass", "fail", "warn", "skip" (the test could not run here) or "error" (it did not give a verdict: it
ran past its time, the tool failed, the options are wrong). summary is one line of at most 300 characters;
failures and warnings hold at most 32 lines each, of at most 300 characters, control characters removed. tool is
"dcgmi", "simulated" or null. An unknown test name gives an "error" result naming it. The exit status is 0
whenever the line was printed.

The gpu test takes the first of these that applies:

1. Simulated GPUs: the env var named by sim_gpus_env names a file (DESIGN.md, "Simulated GPUs"; agent_gpus.py
   reads the same file). A GPU with ``"diag_fault": "text"`` passes at rest but fails under load (failure
   ``GPU <index>: <text>``); a top-level ``"diag_seconds": N`` makes the test take N seconds (slept), and when N
   exceeds the timeout it stops at the timeout with an "error".
2. ``dcgmi`` on PATH: ``dcgmi diag -r LEVEL -j``, in a session of its own. Its JSON is read whatever its exit
   status (it exits non-zero when a test fails); text around the JSON object is ignored. Past the timeout it
   gets SIGTERM, on which dcgmi stops the diagnostic it started in nv-hostengine, and STOP_GRACE_S later the
   whole session gets SIGKILL; the result is an "error". Both JSON shapes are read: DCGM 2.x/3.x ("DCGM GPU
   Diagnostic": results with "gpu_id" or "gpu_ids") and DCGM 4.x ("DCGM Diagnostic": results with
   "entity_group" and "entity_id", a "test_summary" per test, "entity_groups" at the top) - see
   parse_dcgmi_diag and tests/unit/golden/dcgm/.
3. Neither: "skip".

Python 3.8, standard library only; no ``from __future__`` (the prepended PARAMS line would break it). The node
runs one script: this file after agent_common.py, joined by ``bundle.script("nodetest")`` (bundle.py); the
modules share one namespace, so this file's private names start with ``_nt_``.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unicodedata

from ftconsole.scheduler.node.agent_common import as_number, first_line, merged_params, print_one_line  # bundled

NODETEST_PROTOCOL = 1
NODETEST_NAMES = ("gpu",)
DEFAULT_NODETEST_PARAMS = {"tests": {"gpu": {}}, "sim_gpus_env": "FTCONSOLE_SIM_GPUS"}
GPU_TEST_LEVELS = (1, 2, 3, 4)
GPU_TEST_TIMEOUT_S = 600.0
STOP_GRACE_S = 10.0  # after SIGTERM, how long dcgmi has to stop the diagnostic before its session gets SIGKILL
MAX_LINES = 32  # entries of failures and of warnings
MAX_TEXT = 300  # characters of the summary and of each entry

_NT_WHITESPACE = "\t\n\r\v\f"
_NT_STATUS_WORDS = {
    "pass": "pass",
    "passed": "pass",
    "fail": "fail",
    "failed": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
}
_NT_HOSTENGINE_HINT = "DCGM's nv-hostengine must run on the node (nv-hostengine, or systemctl start nvidia-dcgm)"


# ---------------------------------------------------------------------------------------------------------
# Text from the node


def _nt_clean(value, limit=MAX_TEXT):
    """`value` as one line of at most `limit` characters: control and format characters removed, whitespace
    runs made one space, a cut marked with "..."."""
    text = value if isinstance(value, str) else str(value)
    text = text[: limit * 4]
    kept = []
    for ch in text:
        if ch in _NT_WHITESPACE:
            kept.append(" ")
        elif unicodedata.category(ch) not in ("Cc", "Cf", "Cs"):
            kept.append(ch)
    text = " ".join("".join(kept).split())
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return text


def _nt_lines(lines, noun):
    """At most MAX_LINES clean lines; when there are more, the last one says how many were left out."""
    lines = [_nt_clean(line) for line in lines]
    if len(lines) <= MAX_LINES:
        return lines
    left_out = len(lines) - (MAX_LINES - 1)
    return [*lines[: MAX_LINES - 1], "... and %d more %s" % (left_out, noun)]


def _nt_seconds(number):
    """Seconds for a message: 2 not 2.0, 1.5 as 1.5."""
    return str(int(number)) if float(number).is_integer() else str(number)


def _nt_plural(count, noun):
    return "%d %s%s" % (count, noun, "" if count == 1 else "s")


def _nt_verdict(result, summary, failures=(), warnings=(), tool=None):
    return {
        "result": result,
        "summary": _nt_clean(summary),
        "failures": _nt_lines(failures, "failures"),
        "warnings": _nt_lines(warnings, "warnings"),
        "tool": tool,
    }


# ---------------------------------------------------------------------------------------------------------
# Reading `dcgmi diag -j`


def _nt_status(value):
    """pass, fail, warn or skip for a status word of dcgmi's ("Pass", "PASS", "Not Run", ...); None if unknown."""
    if not isinstance(value, str):
        return None
    return _NT_STATUS_WORDS.get(" ".join(value.lower().split()))


def _nt_message(result):
    """The first text of a result's warnings (a string, a list of strings, or of objects with "warning",
    "message" or, in DCGM 3.x's deployment tests, "warnings"), else of its info; None if it has none."""
    for key in ("warnings", "info"):
        items = result.get(key)
        if not isinstance(items, list):
            items = [items]
        for item in items:
            if isinstance(item, dict):
                item = item.get("warning") or item.get("message") or item.get("warnings")
            if isinstance(item, str) and item.strip():
                return item
    return None


def _nt_gpu_id(value):
    """A GPU id (0, "3") as an int; None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _nt_entity(result):
    """(label, GPU ids) of one result: "GPU 3", "GPUs 0,1", "CPU 0", or "all GPUs" when it names none."""
    group = result.get("entity_group")
    if group is not None and "entity_id" in result:  # DCGM 4.x
        entity = result.get("entity_id")
        if str(group).upper() == "GPU":
            gpu = _nt_gpu_id(entity)
            return "GPU %s" % entity, ([] if gpu is None else [gpu])
        return "%s %s" % (group, entity), []
    if "cpu_id" in result:  # DCGM 3.x's CPU test
        return "CPU %s" % result.get("cpu_id"), []
    raw = result.get("gpu_id", result.get("gpu_ids"))  # 3.x: "gpu_id"; 2.x and nvvs: "gpu_ids"
    names = [part.strip() for part in str(raw).split(",") if part.strip()] if raw is not None else []
    gpus = [gpu for gpu in (_nt_gpu_id(name) for name in names) if gpu is not None]
    if not names:
        return "all GPUs", []
    if len(names) == 1:
        return "GPU %s" % names[0], gpus
    return "GPUs %s" % ",".join(names), gpus


def _nt_doc_gpus(doc):
    """The GPU ids a document lists outside its results: 4.x "entity_groups", 3.x "GPU Device Serials"."""
    gpus = []
    groups = doc.get("entity_groups")
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict) and str(group.get("entity_group", "")).upper() == "GPU":
            entities = group.get("entities")
            for entity in entities if isinstance(entities, list) else []:
                if isinstance(entity, dict):
                    gpus.append(_nt_gpu_id(entity.get("entity_id")))
    serials = doc.get("GPU Device Serials")
    if isinstance(serials, dict):
        gpus.extend(_nt_gpu_id(key) for key in serials)
    return [gpu for gpu in gpus if gpu is not None]


def parse_dcgmi_diag(doc):
    """What one ``dcgmi diag -j`` document says (DCGM 2.x to 4.x), as a dict:

    result    "fail" if any result failed, else "warn" if any warned (or has a status word not known here),
              else "skip" if every result was skipped, else "pass"; "error" for a runtime error or no results
    failures  "GPU <id>: <test>: <first warning text>" per failed result ("all GPUs: ..." where it names no GPU)
    warnings  the same for results that warned or had an unknown status
    skipped   the same for skipped results
    gpus      the GPU ids the document names, sorted
    tests     how many tests gave a result
    error     the runtime error, or why the document could not be read; None otherwise
    """
    out = {"result": "error", "failures": [], "warnings": [], "skipped": [], "gpus": [], "tests": 0, "error": None}
    if not isinstance(doc, dict):
        out["error"] = "dcgmi printed JSON that is not an object"
        return out
    top = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))  # DCGM 4.x, DCGM 2.x and 3.x
    if not isinstance(top, dict):
        out["error"] = 'dcgmi printed JSON without "DCGM Diagnostic" or "DCGM GPU Diagnostic"'
        return out
    gpus = set(_nt_doc_gpus(doc))
    failures: list = []
    warnings: list = []
    skipped: list = []
    counts = {"pass": 0, "fail": 0, "warn": 0, "skip": 0}
    tests = 0
    categories = top.get("test_categories")
    for category in categories if isinstance(categories, list) else []:
        if not isinstance(category, dict):
            continue
        entries = category.get("tests")
        for test in entries if isinstance(entries, list) else []:
            if not isinstance(test, dict):
                continue
            name = test.get("name") or category.get("category") or "unnamed test"
            results = [r for r in (test.get("results") or []) if isinstance(r, dict)]
            seen = set()
            for result in results:
                label, ids = _nt_entity(result)
                gpus.update(ids)
                seen.add(_nt_record(result, label, name, counts, failures, warnings, skipped))
            summary = test.get("test_summary")  # DCGM 4.x: the test's own verdict, with the errors of no entity
            if isinstance(summary, dict):
                status = _nt_status(summary.get("status"))
                if not results or (status not in seen and status != "pass"):
                    _nt_record(summary, "all GPUs", name, counts, failures, warnings, skipped)
                    results.append(summary)
            if results:
                tests += 1
    errors = top.get("errors", doc.get("errors"))  # no dcgmi up to DCGM 4.6 writes it; read if one does
    for error in errors if isinstance(errors, list) else []:
        failures.append("all GPUs: %s" % (_nt_message({"warnings": [error]}) or error))
        counts["fail"] += 1
    out.update(failures=failures, warnings=warnings, skipped=skipped, gpus=sorted(gpus), tests=tests)
    runtime_error = top.get("runtime_error")
    if isinstance(runtime_error, str) and runtime_error.strip():
        out["error"] = runtime_error
    elif failures:
        out["result"] = "fail"
    elif warnings:
        out["result"] = "warn"
    elif not tests:
        out["error"] = "dcgmi reported no test results"
    elif counts["skip"] and not counts["pass"]:
        out["result"] = "skip"
    else:
        out["result"] = "pass"
    return out


def _nt_record(result, label, name, counts, failures, warnings, skipped):
    """Counts one result and adds its line to the list its status belongs to; returns that status (None:
    unknown, counted as a warning)."""
    status = _nt_status(result.get("status"))
    message = _nt_message(result)
    if status == "fail":
        failures.append("%s: %s: %s" % (label, name, message or "failed, no reason given"))
    elif status == "warn":
        warnings.append("%s: %s: %s" % (label, name, message or "warning, no reason given"))
    elif status == "skip":
        skipped.append("%s: %s: %s" % (label, name, message or "skipped"))
    elif status is None:
        said = "unknown status %r" % (result.get("status"),)
        warnings.append("%s: %s: %s" % (label, name, said + (": " + message if message else "")))
    counts["warn" if status is None else status] += 1
    return status


def _nt_json_object(text):
    """The JSON object in `text` (what lies before its first "{" or after its last "}" ignored); None if none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        return json.loads(text[start : end + 1])
    except ValueError:
        return None


def dcgmi_verdict(doc, level, status):
    """The gpu test's verdict from a parsed ``dcgmi diag -j`` document and dcgmi's exit status."""
    parsed = parse_dcgmi_diag(doc)
    command = "dcgmi diag -r %d" % level
    failures, warnings = parsed["failures"], parsed["warnings"]
    if parsed["error"] is not None:
        return _nt_verdict("error", "%s: %s" % (command, parsed["error"]), failures, warnings, "dcgmi")
    result = parsed["result"]
    if result == "fail":
        summary = "%s: %s: %s" % (command, _nt_plural(len(failures), "failure"), "; ".join(failures))
    elif result == "warn":
        summary = "%s: %s: %s" % (command, _nt_plural(len(warnings), "warning"), "; ".join(warnings))
    elif result == "skip":
        summary = "%s: every test was skipped: %s" % (command, "; ".join(parsed["skipped"]))
    else:
        gpus = "%s, " % _nt_plural(len(parsed["gpus"]), "GPU") if parsed["gpus"] else ""
        summary = "%s: %s%s pass" % (command, gpus, _nt_plural(parsed["tests"], "test"))
        if status != 0:  # every test passed, yet dcgmi says something went wrong: never a silent pass
            warnings = ["dcgmi exited with status %d although every test passed" % status]
            result, summary = "warn", "%s; %s" % (summary, warnings[0])
    return _nt_verdict(result, summary, failures, warnings, "dcgmi")


# ---------------------------------------------------------------------------------------------------------
# Running dcgmi


def _nt_stop_session(child):
    """SIGTERM to `child`'s session (dcgmi then stops its diagnostic in nv-hostengine), STOP_GRACE_S to end,
    then SIGKILL to what is left of the session; reaps `child`."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 1.0)):
        with contextlib.suppress(OSError):  # OSError: the session has ended
            os.killpg(child.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process that left the session may hold a pipe
            child.communicate(timeout=wait)


def run_dcgmi_diag(dcgmi, level, timeout):
    """The gpu test's verdict from ``dcgmi diag -r LEVEL -j``, given at most `timeout` seconds."""
    command = "dcgmi diag -r %d" % level
    child = subprocess.Popen(
        [dcgmi, "diag", "-r", str(level), "-j"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _nt_stop_session(child)
        return _nt_verdict("error", "%s ran past %ss" % (command, _nt_seconds(timeout)), tool="dcgmi")
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    doc = _nt_json_object(stdout)
    if doc is not None:
        return dcgmi_verdict(doc, level, child.returncode)
    line = first_line(stdout, stderr)
    summary = "%s printed no result (exit status %d): %s" % (command, child.returncode, line)
    lowered = line.lower()
    if "connect" in lowered or "host engine" in lowered or "hostengine" in lowered:
        summary = "%s: %s. %s" % (command, line.rstrip("."), _NT_HOSTENGINE_HINT)
    return _nt_verdict("error", summary, tool="dcgmi")


# ---------------------------------------------------------------------------------------------------------
# Simulated GPUs


def run_simulated_diag(path, level, timeout):
    """The gpu test's verdict from a simulated-GPU file: "diag_fault" per GPU, "diag_seconds" at the top."""
    what = "simulated diagnostics level %d" % level
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        return _nt_verdict("error", "cannot read simulated GPU file %s: %s" % (path, exc), tool="simulated")
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        return _nt_verdict("error", 'simulated GPU file %s has no "gpus" list' % path, tool="simulated")
    seconds = doc.get("diag_seconds", 0)
    if as_number(seconds) is None or seconds < 0:
        message = 'simulated GPU file %s: "diag_seconds" is not a number of seconds' % path
        return _nt_verdict("error", message, tool="simulated")
    if seconds > timeout:
        time.sleep(timeout)
        return _nt_verdict("error", "%s ran past %ss" % (what, _nt_seconds(timeout)), tool="simulated")
    time.sleep(seconds)
    gpus = [gpu for gpu in doc["gpus"] if isinstance(gpu, dict)]
    failures = []
    for position, gpu in enumerate(gpus):
        fault = gpu.get("diag_fault")
        if fault is None or fault is False or (isinstance(fault, str) and not fault.strip()):
            continue
        index = gpu.get("index", position)
        failures.append("GPU %s: %s" % (index, fault))
    if failures:
        summary = "%s: %s: %s" % (what, _nt_plural(len(failures), "failure"), "; ".join(failures))
        return _nt_verdict("fail", summary, failures, tool="simulated")
    if not gpus:
        return _nt_verdict("skip", "%s: the simulated GPU file lists no GPUs" % what, tool="simulated")
    return _nt_verdict("pass", "%s: %s pass" % (what, _nt_plural(len(gpus), "GPU")), tool="simulated")


# ---------------------------------------------------------------------------------------------------------
# The tests


def run_gpu_test(options, sim_gpus_env, environ):
    """(level or None, verdict) of the gpu test with `options` (its object in PARAMS "tests")."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        return None, _nt_verdict("error", 'the options of test "gpu" must be an object, got %r' % (options,))
    level = options.get("level", 1)
    if not isinstance(level, int) or isinstance(level, bool) or level not in GPU_TEST_LEVELS:
        return None, _nt_verdict("error", 'test "gpu": level must be 1, 2, 3 or 4, got %r' % (level,))
    timeout = options.get("timeout", GPU_TEST_TIMEOUT_S)
    if as_number(timeout) is None or timeout <= 0:
        return level, _nt_verdict("error", 'test "gpu": timeout must be a positive number, got %r' % (timeout,))
    timeout = float(timeout)
    sim_path = environ.get(str(sim_gpus_env))
    if sim_path:
        return level, run_simulated_diag(sim_path, level, timeout)
    dcgmi = shutil.which("dcgmi", path=environ.get("PATH"))
    if dcgmi:
        return level, run_dcgmi_diag(dcgmi, level, timeout)
    summary = "no dcgmi on this node (DCGM is not installed): only NVML's readings at rest are checked"
    return level, _nt_verdict("skip", summary)


def _nt_requested(tests):
    """(name, options) of each test asked for; a name that is not text is kept as its repr."""
    if isinstance(tests, dict):
        return [(str(name), options) for name, options in tests.items()]
    if isinstance(tests, str):
        return [(tests, None)]
    if isinstance(tests, (list, tuple)):
        return [(name if isinstance(name, str) else repr(name), None) for name in tests]
    return [(repr(tests), None)]


def run_nodetests(params, environ=None):
    """One result per test asked for, in order; a test that raises gives an "error" result, never a crash."""
    environ = os.environ if environ is None else environ
    results = []
    for name, options in _nt_requested(params.get("tests")):
        started = time.monotonic()
        level = None
        try:
            if name == "gpu":
                level, verdict = run_gpu_test(options, params.get("sim_gpus_env"), environ)
            else:
                known = ", ".join(NODETEST_NAMES)
                verdict = _nt_verdict("error", "unknown test %r (the tests are: %s)" % (name, known))
        except Exception as exc:
            verdict = _nt_verdict("error", "test %r failed: %s: %s" % (name, type(exc).__name__, exc))
        result = {"test": name, "level": level}
        result.update(verdict)
        result["took_s"] = round(time.monotonic() - started, 2)
        results.append(result)
    return results


def load_nodetest_params(argv):
    """PARAMS (prepended by the scheduler) or argv[1] (a JSON string), merged over the defaults."""
    return merged_params(argv, globals().get("PARAMS"), DEFAULT_NODETEST_PARAMS)[0]


def main(argv):
    return print_one_line("nodetest", load_nodetest_params, nodetest_document, argv)


def nodetest_document(params):
    return {"nodetest": NODETEST_PROTOCOL, "results": run_nodetests(params)}


if __name__ == "__main__":
    sys.exit(main(sys.argv))
