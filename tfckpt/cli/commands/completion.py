"""``tfckpt completion SHELL``: the tab-completion script of a shell, made from the parser
itself (bash, zsh and tcsh by shtab; fish, which shtab does not write, from the same
parser here: one ``complete`` line per command and option)."""

from __future__ import annotations

import argparse

from tfckpt.cli.display import print_script


def cmd_completion(args) -> int:
    """Print the completion script for ``args.shell``."""
    from tfckpt.cli import build_parser

    parser = build_parser()
    if args.shell == "fish":
        script = fish_script(parser)
    else:
        import shtab

        script = shtab.complete(parser, shell=args.shell)
    print_script(script)
    return 0


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish_script(parser: argparse.ArgumentParser) -> str:
    """fish's ``complete`` commands for ``parser``: its commands (with their summaries)
    where no command is given yet, then each command's options and their choices."""
    prog = parser.prog
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = list(sub.choices)
    summaries = {a.dest: a.help or "" for a in sub._choices_actions}
    lines: list[str] = []
    for name in names:
        lines.append(
            f"complete -c {prog} -n '__fish_use_subcommand' -a {name} "
            f"-d {_quote(summaries.get(name, ''))}"
        )
    for name, p in sub.choices.items():
        cond = f"-n '__fish_seen_subcommand_from {name}'"
        for a in p._actions:
            longs = [o[2:] for o in a.option_strings if o.startswith("--")]
            shorts = [o[1:] for o in a.option_strings if len(o) == 2]
            if not longs and not shorts:
                if a.choices:
                    choices = " ".join(map(str, a.choices))
                    lines.append(f"complete -c {prog} {cond} -a {_quote(choices)}")
                continue
            flags = " ".join([*(f"-l {x}" for x in longs), *(f"-s {x}" for x in shorts)])
            takes = a.nargs != 0
            extra = f" -x -a {_quote(' '.join(map(str, a.choices)))}" if a.choices else ""
            if takes and not a.choices:
                extra = " -r -F"
            help_text = (a.help or "").split(";")[0].split(":")[0][:60]
            lines.append(f"complete -c {prog} {cond} {flags}{extra} -d {_quote(help_text)}")
    return "\n".join(lines) + "\n"
