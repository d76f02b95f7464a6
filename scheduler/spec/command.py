"""What a job's command may be: an argument vector run directly, not a shell line (pure).

`check_command` rejects what only a shell would understand (`KEY=VALUE cmd`, `a && b`, pipes, redirections,
command substitution, shell keywords and builtins as the first word) and says how to write it instead
(`env:`, `bash -c "..."`, `workdir:`).
"""

from __future__ import annotations

import posixpath
import re
import shlex

# Longest first: the scanner takes the first operator that matches at a position.
_OPERATORS = (
    "&>>",
    "<<<",
    "&&",
    "||",
    ";;",
    "|&",
    "&>",
    ">>",
    ">&",
    ">|",
    "<<",
    "<&",
    "<>",
    "<(",
    ">(",
    "$(",
    "|",
    "&",
    ";",
    ">",
    "<",
    "(",
    ")",
    "`",
    "\n",
)
_SEPARATORS = {"&&", "||", ";", ";;", "\n"}
_PIPES = {"|", "|&"}
_SUBSTITUTIONS = {"$(", "`", "<(", ">("}
_SUBSHELL = {"(", ")"}
_BLANKS = " \t\r"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_SHELL_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until", "do", "done"}
    | {"function", "{", "}", "[[", "]]", "!"}
)
_SHELL_BUILTINS = frozenset(
    {"source", ".", "alias", "unset", "set", "eval", "exec", "ulimit", "umask", "pushd", "popd", "declare"}
    | {"local", "readonly", "trap", "shopt", "typeset"}
)


def _wrapped(command: str) -> str:
    """`bash -c "..."` around `command`, quoted so that it splits back to exactly `command`."""
    if '"' not in command and "\\" not in command:
        return f'bash -c "{command}"'
    return f"bash -c {shlex.quote(command)}"


_OPERATOR_STARTS = frozenset(op[0] for op in _OPERATORS)


def _operator_at(text: str, i: int) -> str | None:
    if text[i] not in _OPERATOR_STARTS:  # most characters: no operator to try
        return None
    return next((op for op in _OPERATORS if text.startswith(op, i)), None)


def _operator_problem(op: str, prefix: str, command: str) -> str:
    """The message for a shell operator `op` found outside quotes (`prefix`: the digits of `2>`)."""
    wrap = f"wrap it: {_wrapped(command)}"
    if op == "\n":
        return "one statement only: found a line break outside quotes; write one line, or run a script"
    if op in _SEPARATORS:
        return f"one statement only: found '{op}' outside quotes; {wrap}"
    if op in _PIPES:
        return f"one statement only: found a pipe '{op}' outside quotes; {wrap}"
    if op == "&":
        return f"one statement only: found '&' outside quotes (it runs a command in the background); {wrap}"
    if op in _SUBSTITUTIONS:
        return f"found the substitution '{op}' outside quotes, but the command is not run by a shell; {wrap}"
    if op in _SUBSHELL:
        return f"found '{op}' outside quotes (a shell subshell), but the command is not run by a shell; {wrap}"
    return (
        f"found the redirection '{prefix}{op}' outside quotes: the command is not run by a shell and its output "
        f"is captured already (see output:); {wrap}"
    )


def _scan(command: str) -> str | None:
    """Walk `command` as a shell would, quote-aware; the first shell-only construct outside quotes, if any."""
    quote: str | None = None
    opened = 0
    word = ""  # the unquoted characters of the current word so far
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = None
        elif c == "\\":
            if i + 1 == len(command):
                return "the command ends with a backslash: remove it or quote it"
            if command[i + 1] == "\n":
                return "line continuation ('\\' at the end of a line): write the command on one line"
            word += command[i : i + 2]
            i += 1
        elif c in "'\"":
            quote, opened = c, i
            word += "\0"  # a quoted part: the word is no longer a plain file-descriptor number
        elif c in _BLANKS:
            word = ""
        elif c == "#" and not word:
            return "found '#' outside quotes, which a shell reads as a comment; quote it, or remove the comment"
        elif (op := _operator_at(command, i)) is not None:
            prefix = word if word.isdigit() and op[0] in "<>" else ""
            return _operator_problem(op, prefix, command)
        else:
            word += c
        i += 1
    if quote is not None:
        kind = "single" if quote == "'" else "double"
        return f"unclosed quote: the {kind} quote ({quote}) at column {opened + 1} is never closed"
    return None


def _first_word_problem(command: str) -> str | None:
    """The command must start with an executable, not a variable assignment or a shell keyword or builtin."""
    if _ASSIGNMENT.match(command):
        return (
            f"the command must start with an executable, but {command.split()[0]!r} sets a shell variable: "
            "set variables in env: instead"
        )
    try:
        first = shlex.split(command)[0]
    except ValueError as exc:  # the scanner and shlex disagree on some escape inside double quotes
        return f"cannot split the command into words: {exc}"
    if first == "":
        return "the command must start with an executable, not an empty word"
    if first == "cd":
        return "'cd' is a shell builtin, not an executable: set workdir: instead"
    if first == "export":
        return "'export' is a shell builtin, not an executable: set variables in env: instead"
    if first in _SHELL_KEYWORDS or first in _SHELL_BUILTINS:
        kind = "keyword" if first in _SHELL_KEYWORDS else "builtin"
        return f"'{first}' is a shell {kind}, not an executable; wrap it: {_wrapped(command)}"
    return None


def check_command(command: str) -> str | None:
    """Why `command` cannot be run as a job's command, or None if it can.

    It must start with an executable and be exactly one statement: shell operators (`&&`, `||`, `;`, `|`,
    `&`, redirections, `$(...)`, backticks) are allowed only inside quotes, e.g. in `bash -c "a && b"`.
    """
    text = command.strip()
    if not text:
        return "the command is empty"
    return _scan(text) or _first_word_problem(text)


# the programs of MPI launchers: a command that starts with one starts every rank itself (docs/jobs.md)
MPI_LAUNCHERS = frozenset(
    {
        "mpirun",
        "mpiexec",
        "orterun",
        "mpirun.openmpi",
        "mpiexec.openmpi",
        "mpirun.mpich",
        "mpiexec.mpich",
        "mpiexec.hydra",
        "horovodrun",
    }
)


def is_mpi_launcher(argv: tuple[str, ...]) -> bool:
    """The command starts with an MPI launcher's program (any folder)."""
    return bool(argv) and posixpath.basename(argv[0]) in MPI_LAUNCHERS
