"""ftconsole: a fault-tolerant job scheduler and on-call console for SSH-only GPU clusters."""

# The one place the version is written: pyproject.toml reads it from here ([tool.setuptools.dynamic]).
__version__ = "0.1.0"
