"""`ftconsole completion bash|zsh`: a shell completion script, made from the command line's own parser.

The script is generated at run time by walking the argparse parser (its subcommands, options and positional
arguments), so a command or flag added to the parser completes without touching this file. What it completes is
static: commands, subcommands, options, the choices argparse knows (`priority JOB urgent`), and file or folder
names where an argument is one (an argument whose metavar is FILE or JOB.yaml, or DIR); job ids and node names
are not looked up.

Both scripts carry the same tables, keyed by the command path ("ftconsole", "ftconsole config", ...), and one
small function that walks the words typed so far to find the path, then offers what fits the word being
completed. The walk skips options and the value of each option that takes one.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

PROG = "ftconsole"
SHELLS = ("bash", "zsh")

# The kind of value an option or positional argument takes, as the scripts read it: a file name, a folder name,
# anything (nothing offered), or else a comma-separated list of choices.
FILE, DIR, FREE = "@file", "@dir", "_"
FILE_METAVARS = frozenset({"FILE", "JOB.yaml"})
DESCRIPTION_CHARS = 70  # zsh shows descriptions beside the candidates: the first clause, cut to this length


@dataclass(frozen=True)
class Command:
    """One command path of the parser and what may follow it."""

    words: tuple[str, ...]  # ("ftconsole", "config", "check")
    commands: tuple[tuple[str, str], ...] = ()  # its subcommands, with their help
    options: tuple[tuple[str, str], ...] = ()  # each option string, with its help
    values: tuple[tuple[str, str], ...] = ()  # each option string that takes a value, with the kind of its value
    positionals: tuple[str, ...] = ()  # the kind of each positional argument, in order
    repeat: bool = False  # the last positional takes any number of words

    @property
    def key(self) -> str:
        return " ".join(self.words)


def walk(parser: argparse.ArgumentParser, words: tuple[str, ...] = (PROG,)) -> Iterator[Command]:
    """Every command path of `parser`, the top level first. argparse has no public API for this: the actions
    and the subparsers' choices are read as argparse itself reads them for help."""
    commands: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    values: list[tuple[str, str]] = []
    positionals: list[str] = []
    repeat = False
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                commands.append((name, helps.get(name, "")))
                children.append((name, child))
            continue
        kind = _kind(action)
        if action.option_strings:
            for option in action.option_strings:
                if action.help != argparse.SUPPRESS:
                    options.append((option, action.help or ""))
                if action.nargs != 0:
                    values.append((option, kind))
        else:
            positionals.append(kind)
            repeat = action.nargs in (argparse.ZERO_OR_MORE, argparse.ONE_OR_MORE)
    yield Command(words, tuple(commands), tuple(options), tuple(values), tuple(positionals), repeat)
    for name, child in children:
        yield from walk(child, (*words, name))


def _kind(action: argparse.Action) -> str:
    if action.choices is not None:  # plain words (a level, a shell): no comma or blank in them
        return ",".join(str(choice) for choice in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if metavar in FILE_METAVARS:
        return FILE
    return DIR if metavar == "DIR" else FREE


def describe(text: str) -> str:
    """A help text as one short line: its first clause (up to `;` or ` (`), at most DESCRIPTION_CHARS."""
    line = " ".join(text.replace("%%", "%").split())
    for stop in ("; ", " ("):
        line = line.split(stop, 1)[0]
    return line if len(line) <= DESCRIPTION_CHARS else line[: DESCRIPTION_CHARS - 3].rstrip() + "..."


def _table(name: str, entries: dict[str, str], declare: str) -> str:
    """An associative array: bash's `[key]=value` entries, zsh's key value pairs (any zsh version reads them)."""
    zsh = declare.startswith("typeset")
    lines = [f"{declare} {name}", f"{name}=("]
    for key, value in entries.items():
        key, value = shlex.quote(key), shlex.quote(value)
        lines.append(f"    {key} {value}" if zsh else f"    [{key}]={value}")
    return "\n".join([*lines, ")"])


def _tables(parser: argparse.ArgumentParser, declare: str, *, described: bool) -> str:
    """The tables both scripts read, as shell assignments; with `described`, zsh's "name:description" lists."""
    commands, options, values, positionals, repeat = {}, {}, {}, {}, {}
    command_help, option_help = {}, {}
    for command in walk(parser):
        key = command.key
        if command.commands:
            commands[key] = " ".join(name for name, _ in command.commands)
            command_help[key] = "\n".join(f"{name}:{describe(text)}" for name, text in command.commands)
        options[key] = " ".join(option for option, _ in command.options)
        option_help[key] = "\n".join(f"{option}:{describe(text)}" for option, text in command.options)
        values.update({f"{key} {option}": kind for option, kind in command.values})
        if command.positionals:
            positionals[key] = " ".join(command.positionals)
        if command.repeat:
            repeat[key] = "1"
    tables = [
        _table("_ftconsole_commands", commands, declare),
        _table("_ftconsole_options", options, declare),
        _table("_ftconsole_values", values, declare),
        _table("_ftconsole_positionals", positionals, declare),
        _table("_ftconsole_repeat", repeat, declare),
    ]
    if described:
        tables += [
            _table("_ftconsole_command_help", command_help, declare),
            _table("_ftconsole_option_help", option_help, declare),
        ]
    return "\n".join(tables)


BASH = r"""
_ftconsole() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=ftconsole word kind
    local -i i n=0
    local -a items
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if [[ $word == -* ]]; then
            [[ -n ${_ftconsole_values["$cmd $word"]+set} ]] && ((i++))
        elif [[ " ${_ftconsole_commands[$cmd]} " == *" $word "* ]]; then
            cmd="$cmd $word"
            n=0
        else
            ((n++))
        fi
    done
    COMPREPLY=()
    if ((COMP_CWORD > 1)) && [[ $prev == -* && -n ${_ftconsole_values["$cmd $prev"]+set} ]]; then
        kind=${_ftconsole_values["$cmd $prev"]}
    elif [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "${_ftconsole_options[$cmd]}" -- "$cur")
        return 0
    elif [[ -n ${_ftconsole_commands[$cmd]} ]]; then
        mapfile -t COMPREPLY < <(compgen -W "${_ftconsole_commands[$cmd]}" -- "$cur")
        return 0
    else
        read -ra items <<< "${_ftconsole_positionals[$cmd]}"
        if ((n < ${#items[@]})); then
            kind=${items[n]}
        elif [[ -n ${_ftconsole_repeat[$cmd]} ]] && ((${#items[@]})); then
            kind=${items[${#items[@]}-1]}
        else
            return 0
        fi
    fi
    case $kind in
        @file) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
        @dir) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
        _) ;;
        *) mapfile -t COMPREPLY < <(compgen -W "${kind//,/ }" -- "$cur") ;;
    esac
    return 0
}
complete -F _ftconsole ftconsole
"""

ZSH = r"""
_ftconsole() {
    local cur=${words[CURRENT]} prev=${words[CURRENT-1]} cmd=ftconsole word kind
    local -i i n=0
    local -a items described
    for ((i = 2; i < CURRENT; i++)); do
        word=${words[i]}
        if [[ $word == -* ]]; then
            (( ${+_ftconsole_values[$cmd $word]} )) && ((i++))
        elif (( ${${(z)_ftconsole_commands[$cmd]}[(Ie)$word]} )); then
            cmd="$cmd $word"
            n=0
        else
            ((n++))
        fi
    done
    if ((CURRENT > 2)) && [[ $prev == -* ]] && (( ${+_ftconsole_values[$cmd $prev]} )); then
        kind=${_ftconsole_values[$cmd $prev]}
    elif [[ $cur == -* ]]; then
        described=(${(f)_ftconsole_option_help[$cmd]})
        _describe -t options option described
        return
    elif [[ -n ${_ftconsole_commands[$cmd]} ]]; then
        described=(${(f)_ftconsole_command_help[$cmd]})
        _describe -t commands command described
        return
    else
        items=(${(z)_ftconsole_positionals[$cmd]})
        if ((n < $#items)); then
            kind=${items[n+1]}
        elif (( ${+_ftconsole_repeat[$cmd]} && $#items )); then
            kind=${items[-1]}
        else
            return 1
        fi
    fi
    case $kind in
        @file) _files ;;
        @dir) _files -/ ;;
        _) return 1 ;;
        *) compadd -- ${(s:,:)kind} ;;
    esac
}

if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    _ftconsole "$@"
else
    compdef _ftconsole ftconsole
fi
"""


def bash_script(parser: argparse.ArgumentParser) -> str:
    head = (
        "# bash completion for ftconsole, made by `ftconsole completion bash` (bash 4.2 or newer).\n"
        "# Install: ftconsole completion bash > ~/.local/share/bash-completion/completions/ftconsole\n"
        "# or add to ~/.bashrc: source <(ftconsole completion bash)\n"
    )
    return head + _tables(parser, "declare -gA", described=False) + "\n" + BASH.lstrip("\n")


def zsh_script(parser: argparse.ArgumentParser) -> str:
    head = (
        "#compdef ftconsole\n"
        "# zsh completion for ftconsole, made by `ftconsole completion zsh`.\n"
        "# Install: ftconsole completion zsh > ~/.zfunc/_ftconsole, with fpath=(~/.zfunc $fpath) before compinit\n"
        "# in ~/.zshrc; or, after compinit there: source <(ftconsole completion zsh)\n"
    )
    return head + _tables(parser, "typeset -gA", described=True) + "\n" + ZSH.lstrip("\n")


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    return bash_script(parser) if shell == "bash" else zsh_script(parser)


def add_parser(sub: Any, root: argparse.ArgumentParser) -> None:
    """`ftconsole completion SHELL`, for the whole of `root` as it stands when the command runs."""
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh) for commands, subcommands and options",
        description="Prints a completion script for the shell. bash: `ftconsole completion bash > "
        "~/.local/share/bash-completion/completions/ftconsole`; zsh: `ftconsole completion zsh > ~/.zfunc/_ftconsole` "
        "with ~/.zfunc in fpath before compinit.",
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell the script is for")

    def run(args: argparse.Namespace) -> int:
        print(script(root, args.shell), end="")
        return 0

    completion.set_defaults(func=run)
