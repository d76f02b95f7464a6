"""ftconsole: a fault-tolerant job scheduler and on-call console for SSH-only GPU clusters."""

from importlib import metadata

# The version is made from git when ftconsole is built (setuptools-scm, pyproject.toml): the release's tag vX.Y.Z,
# or X.Y.(Z+1).devN+gHASH for a commit after it. Read here from the installed distribution; the fallback (the same
# as pyproject.toml's) where none is installed, e.g. sources put on sys.path by hand.
FALLBACK_VERSION = "0.0"

try:
    __version__ = metadata.version("ftconsole")
except metadata.PackageNotFoundError:
    __version__ = FALLBACK_VERSION
