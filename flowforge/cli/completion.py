"""`flowforge completion`: bash and zsh completion, generated from the parser itself, so
it completes exactly the commands, options and choices the parser has."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

from flowforge.cli.parser import build_parser

COMPLETION_BASH = """\
# flowforge completion for bash (generated from its argument parser).
# Load it: eval "$(flowforge completion bash)", or save it in
# ~/.local/share/bash-completion/completions/flowforge
_flowforge() {{
    # zsh (through bashcompinit): arrays counted from 0, as in bash, for this function.
    [[ -n "${{ZSH_VERSION-}}" ]] && setopt localoptions ksharrays
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local path="" next i
    for ((i = 1; i < COMP_CWORD; i++)); do
        next="${{path:+$path }}${{COMP_WORDS[i]}}"
        case "$next" in
{paths}
        esac
    done
    local words="" opts=""
    case "$path|$prev" in
{values}
    *)
        case "$path" in
{words}
        esac
        [[ "$cur" == -* ]] && words="$opts"
        ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _flowforge flowforge
"""
COMPLETION_ZSH = """\
# flowforge completion for zsh: the bash completion through bashcompinit.
# Load it: eval "$(flowforge completion zsh)" in ~/.zshrc (after compinit).
autoload -U +X bashcompinit && bashcompinit
"""


def _tree(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command path of the parser (`""`, `workflow`, `workflow publish`, ...)."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its actions here, documented or not
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _tree(child, f"{path} {name}".strip())


def completion_script(shell: str) -> str:
    """The completion script for `shell`, generated from build_parser(), so it completes
    exactly the commands, options and choices the parser has."""
    paths, values, words = [], [], []
    for path, parser in _tree(build_parser()):
        if path:
            paths.append(f"        {shlex.quote(path)}) path={shlex.quote(path)} ;;")
        offered, options = [], []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                offered += list(action.choices)
            options += [o for o in action.option_strings if o.startswith("--")]
            if (
                action.choices
                and action.option_strings
                and not isinstance(action, argparse._SubParsersAction)
            ):
                for option in action.option_strings:
                    values.append(
                        f"    {shlex.quote(f'{path}|{option}')}) "
                        f"words={shlex.quote(' '.join(map(str, action.choices)))} ;;"
                    )
            elif (
                action.choices
                and not action.option_strings
                and not isinstance(action, argparse._SubParsersAction)
            ):
                offered += [str(c) for c in action.choices]
        words.append(
            f"        {shlex.quote(path)}) words={shlex.quote(' '.join(offered))} "
            f"opts={shlex.quote(' '.join(options))} ;;"
        )
    script = COMPLETION_BASH.format(
        paths="\n".join(paths), values="\n".join(values), words="\n".join(words)
    )
    return script if shell == "bash" else COMPLETION_ZSH + script


def print_script(_ops: object, args: argparse.Namespace) -> None:
    print(completion_script(args.shell), end="")
