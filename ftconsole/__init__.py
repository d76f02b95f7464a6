"""ftconsole: a fault-tolerant job scheduler and on-call console for SSH-only GPU clusters."""

from __future__ import annotations

# The version is made from git when ftconsole is built (setuptools-scm, pyproject.toml): the release's tag vX.Y.Z,
# or X.Y.(Z+1).devN+gHASH for a commit after it. Read from the installed distribution when first asked for (reading
# it costs a command a twentieth of a second); the fallback (the same as pyproject.toml's) where none is installed,
# e.g. sources put on sys.path by hand.
FALLBACK_VERSION = "0.0"


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata

    try:
        return metadata.version("ftconsole")
    except metadata.PackageNotFoundError:
        return FALLBACK_VERSION
