"""ftconsole's hook in the Python processes of a PyTorch job (node side, standard library only, Python 3.8).

Written as ``sitecustomize.py`` into ``torch-hook/`` of the run folders of jobs in modes pytorch and
pytorch-deepspeed (spec key ``torch_trace``, on by default), which go first on the ranks' PYTHONPATH: Python
imports it at start, before the job's code, in every process of the rank (the launcher's workers included),
with no change to that code.

Once the process has initialised torch.distributed (looked for every second by a daemon thread that does nothing
else), it starts torch's own worker server (``torch._C._distributed_c10d._WorkerServer``) on a Unix socket in a
private folder of its own (``/tmp/ftconsole-torch-XXXX/torch.sock``, mode 0700): the flight recorder's trace of
the last collectives (kept by torch when TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE are set, as the
launch does) is then read from outside at a hang (``ftconsole debug``: the node's evidence finds the socket
through /proc, supervisor_evidence.py). The folder is removed when the process exits.

Then it hands over to the next ``sitecustomize`` on the path, if any (a distribution's, a virtualenv's), as if
this one had not been there (one that fails says so as it would). Anything that goes wrong in the hook itself
is kept silent: the job runs as it would without.
"""

import contextlib
import os
import sys
import threading

LOOK_S = 1.0  # how often torch.distributed is looked at until the job has initialised it
PREFIX = "ftconsole-torch-"
_kept = []  # type: list  # the worker server (it stops when collected)


def _initialised():
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def _serve():
    import time

    while not _initialised():
        time.sleep(LOOK_S)
    try:
        import atexit
        import shutil
        import tempfile

        from torch._C._distributed_c10d import _WorkerServer

        folder = tempfile.mkdtemp(prefix=PREFIX)
        server = _WorkerServer(os.path.join(folder, "torch.sock"))
        _kept.append(server)

        def _gone():
            with contextlib.suppress(Exception):
                server.shutdown()
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(_gone)
    except Exception:
        return


def _begin():
    if os.environ.get("FT_TORCH_TRACE") != "1":
        return
    threading.Thread(target=_serve, name="ftconsole-torch-trace", daemon=True).start()


def _chain():
    """Import the next sitecustomize on sys.path, the one this file hides."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in saved if os.path.abspath(p or ".") != here]
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as exc:  # none further on; one that fails goes on failing as it would without this one
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        if mine is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = mine  # what site's import of this file looks for when it returns


with contextlib.suppress(Exception):
    _begin()
_chain()
