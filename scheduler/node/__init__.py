"""What a node receives: the programs the scheduler ships over SSH and runs there with ``python3``.

The run supervisor (`supervisor.py` and its `supervisor_*.py`), the probe agent (`agent.py` and its
`agent_*.py`), the MPI hybrid model's container entry (`container_exec.py`), the pre-launch SSH check
(`sshcheck.py`) and the data copy (`datacopy.py`). Nothing is installed on a node: each program is joined into
one script (`bundle.py`, the one file here that runs only in the scheduler) and sent whole.

Rules (tests/unit/test_layers.py): the standard library only (and ``pynvml`` where it imports), Python 3.8
syntax, no import from outside this folder; a sibling import is marked ``# bundled``.
"""
