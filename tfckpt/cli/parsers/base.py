"""What every command's parser shares: its examples, :class:`Parser` (errors in one line,
with "did you mean"), :func:`command`, which makes a command's parser with its examples and
the options every command takes, and :func:`finish`, which puts the shared options last."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import TYPE_CHECKING, NoReturn

from tfckpt.cli import options as opt
from tfckpt.cli.display import emit
from tfckpt.cli.parsers import helptext

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

EXAMPLES = {
    "edit": """examples:
  tfckpt edit demo-out/model.ckpt-7 out/model.ckpt --set global_step=0
  tfckpt edit run/ --in-place --delete global_step --scale dense/kernel=0.5
  seq 10 > old.txt; seq 12 -1 1 > new.txt   # labels reordered, 2 added
  tfckpt edit demo-out/ labels/ --remap-rows 'logits/(weights|biases)$' \\
      --old-vocab old.txt --new-vocab new.txt --axis -1 --init normal:0.01:7
  tfckpt edit demo-out/ wide/ --resize 'logits/(weights|biases)$=20' --axis -1""",
    "dump": """examples:
  tfckpt dump demo-out/model.ckpt-7
  tfckpt dump demo-out/ --filter '^logits/' --json
  tfckpt dump demo-out/ --tensor global_step --tensor '^logits/biases$' --full
  tfckpt dump keras/ckpt-1 --object-graph
  tfckpt dump run/ --all
  tfckpt dump tf1/model.ckpt.meta   # a TF1 graph: variables, Saver, signatures""",
    "check": """examples:
  tfckpt check run/model.ckpt-300 --against tf1/model.ckpt.meta
  tfckpt check A/model.ckpt --against B/model.ckpt   # other names: would fail
  tfckpt graft tf2/template-1 tf1/model.ckpt -o tf2/model --map 'dense/=model/'
  tfckpt check tf2/model --against tf2/template-1 --assert-consumed
  tfckpt convert tf1/model.ckpt fp16/ --dtype float16
  tfckpt check fp16/model.ckpt --against tf1/model.ckpt.meta --cast --json

exit status: 0 a restore would succeed, 1 it would fail (the report says why), 2 error""",
    "diff": """examples:
  tfckpt diff demo-out/ demo-out/fp16/   # how much error did float16 add?
  tfckpt diff demo-out/ demo-out/fp16/ --names-only   # what does fp16/ lack?
  tfckpt convert demo-out/fp16/ fp32/ --dtype float32
  tfckpt diff demo-out/ fp32/ --filter 'weights$' --atol 1e-3 --json

exit status: 0 same, 1 different, 2 error""",
    "stats": """examples:
  tfckpt stats demo-out/model.ckpt-7        # is it safe to cast to float16?
  tfckpt stats demo-out/ --filter 'weights' --json
  tfckpt stats demo-out/ --html cast.html   # the same, in pictures""",
    "verify": """examples:
  tfckpt verify demo-out/model.ckpt-7
  tfckpt verify demo-out/fp16/ --tf --reference demo-out/model.ckpt-7
  tfckpt export models/124M/ gpt2/ --preset hf-gpt2 --dtype float16
  tfckpt verify models/124M/ --against gpt2/ --preset hf-gpt2 --dtype float16

exit status: 0 intact, 1 problems found (one line each on stderr), 2 error""",
    "convert": """examples:
  tfckpt convert demo-out/model.ckpt-7 fp16/ --dtype float16
  tfckpt convert demo-out/ bf16/ --dtype bfloat16 --from float32 --exclude /Adam
  tfckpt convert demo-out/ small/ --dtype float16 --overflow clip --dry-run
  tfckpt convert demo-out/ fp16-report/ --dtype float16 --report fp16.html
  tfckpt convert uncased_L-12_H-768_A-12/ bert16/ --dtype float16 \\
      --keep-dtype 'LayerNorm|embeddings' --dtype-rule 'pooler/=bfloat16'""",
    "rename": """examples:
  tfckpt rename demo-out/ new/model --map 'simple-conv1/=complex-conv1/'
  echo '{"global_step": "step"}' > map.json
  tfckpt rename demo-out/ k/ --map '(.*)/weights$=\\1/kernel' --map-file map.json""",
    "select": """examples:
  tfckpt select demo-out/ new/model --include '^simple-conv1/(weights|biases)$'
  tfckpt select keras/ckpt-1 shipped/ --drop-object optimizer
  tfckpt select demo-out/ small/ --exclude 'BatchNorm'""",
    "merge": """examples:
  tfckpt merge A/model.ckpt B/model.ckpt -o C/model.ckpt
  tfckpt merge C/ A/ -o D/ --prefer last     # a1/, a2/ from A/""",
    "graft": """examples:
  tfckpt graft tf2/template-1 tf1/model.ckpt -o tf2/model \\
      --map 'dense/kernel=model/kernel' --map 'dense/bias=model/bias'
  tfckpt graft tf2/ tf1/ -o out/ --map '(dense)/=model/' --dry-run
  tfckpt graft keras/ckpt-1 tf1/ -o k/ --drop-object optimizer --allow-missing \\
      --map 'dense/=model/layer_with_weights-0/'""",
    "flatten": """examples:
  tfckpt flatten keras/ckpt-1 flat/model.ckpt
  tfckpt flatten keras/ flat2/ --drop-object optimizer --map 'model/=' --dry-run""",
    "average": """examples:
  tfckpt average run/model.ckpt-{100,200,300} -o avg/   # oldest first
  tfckpt average --last 2 run/ -o avg2/model
  tfckpt average run/model.ckpt-200 run/ -o avg3/ --weights 1 3 --dtype bfloat16

the last checkpoint given (with --last: the state file's latest) is the newest""",
    "export": """examples:
  tfckpt export demo-out/model.ckpt-7 model.safetensors
  tfckpt export demo-out/ model.npz --dtype float16 --overflow clip
  tfckpt export uncased_L-12_H-768_A-12/bert_model.ckpt hf/ --preset auto \\
      --dtype bfloat16 --max-shard-bytes 2G
  tfckpt match demo-out/ model.safetensors -o rules.toml     # then review it
  tfckpt export demo-out/ renamed.safetensors --rules rules.toml""",
    "match": """examples:
  tfckpt export demo-out/ target.safetensors --map 'simple-conv(\\d)/=block\\1.'
  tfckpt match demo-out/model.ckpt-7 target.safetensors -o my_model.toml
  echo '{"dense.weight": [4, 8], "dense.bias": [4]}' > weights.json
  tfckpt match run/ weights.json --min-confidence 0.5 -o review.toml
  tfckpt match tf1/model.ckpt tf2/template-1 --json
  tfckpt export demo-out/ out.safetensors --rules my_model.toml --dry-run

review the rules file before exporting with it (the last example)""",
    "presets": """examples:
  tfckpt presets
  tfckpt export uncased_L-12_H-768_A-12/bert_model.ckpt hf/ --preset hf-bert""",
    "ls": """examples:
  tfckpt ls run/
  tfckpt cp run/ s3://bucket/runs/run/
  tfckpt ls s3://bucket/runs/run/ --json""",
    "prune": """examples:
  tfckpt prune run/ --keep-last 2 --dry-run
  tfckpt prune run/ --keep-last 1 --keep-every-steps 200 --keep 100""",
    "cp": """examples:
  tfckpt cp run/ s3://bucket/runs/run/      # every checkpoint, the state file
  tfckpt cp run/model.ckpt-300 best/        # one checkpoint, under its name
  tfckpt cp run/model.ckpt-300 rel/model    # one checkpoint, renamed""",
    "mv": """examples:
  tfckpt mv run/ s3://bucket/runs/run/
  tfckpt mv tf1/model.ckpt best/

the copy is verified (every checksum read back) before the source is deleted""",
    "completion": """examples:
  source <(tfckpt completion bash)   # this shell (the line in ~/.bashrc: all)
  mkdir -p ~/.zfunc ~/.config/fish/completions
  tfckpt completion zsh > ~/.zfunc/_tfckpt   # fpath=(~/.zfunc $fpath) in .zshrc
  tfckpt completion fish > ~/.config/fish/completions/tfckpt.fish""",
    "import": """examples:
  tfckpt export demo-out/model.ckpt-7 model.safetensors
  tfckpt import model.safetensors back/model
  tfckpt export demo-out/ hf/model.safetensors --max-shard-bytes 100K
  tfckpt import hf/model.safetensors.index.json ckpt/model \\
      --permute 'logits/weights$=1,0'""",
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad command line is one line on stderr (exit status 2), as
    every other error of the command line is, and a value not among the choices gets the
    nearest one suggested: never a usage block. A command's ``--help`` is its short help,
    ``--help-all`` the whole (:mod:`~tfckpt.cli.parsers.helptext`); a command whose output
    is a positional also takes it as ``-o/--output`` (:func:`tfckpt.cli.options.add_output`)."""

    output_alias: tuple[argparse.Action, argparse.Action] | None = None
    short_help = False  # a command's parser: --help is the short help

    def error(self, message: str) -> NoReturn:
        """One line: the error, and where the help is."""
        if self.output_alias is not None and "arguments are required" in message:
            positional, flag = self.output_alias
            message = re.sub(
                rf"\b{re.escape(str(positional.metavar))}\b",
                f"{positional.metavar} (or {'/'.join(flag.option_strings)})",
                message,
                count=1,
            )
        # Through emit: the message may quote what was typed, control characters too.
        emit(f"tfckpt: error: {message} (see {self.prog} --help)", err=True)
        sys.exit(2)

    def format_help(self) -> str:
        """A command's short help (its own options and the common ones); any other
        parser's whole help."""
        return helptext.format_help(self, everything=not self.short_help)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments no parser took are reported by the command's
        parser (its help, not the top level's, is where to look)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = next(
                (a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None
            )
            command = getattr(namespace, "command", None)
            where = sub.choices.get(command, self) if sub is not None and command else self
            where.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def parse_known_args(self, args=None, namespace=None):
        """As argparse's; with an output alias, one of DST and ``-o DST`` into DST's place."""
        if self.output_alias is None:
            return super().parse_known_args(args, namespace)
        positional, flag = self.output_alias
        args = list(sys.argv[1:] if args is None else args)
        before = args[: args.index("--")] if "--" in args else args
        flagged = any(_names_output(a) for a in before)
        nargs = positional.nargs
        if flagged:  # DST is then not needed (and if it is given too, an error below)
            positional.nargs = "?"
        try:
            namespace, extras = super().parse_known_args(args, namespace)
        finally:
            positional.nargs = nargs
        given = getattr(namespace, positional.dest, None)
        # A word left over stood where DST goes (argparse fills an optional positional
        # in the first run of words, so `SRC -o X Y` leaves Y over).
        stray = flagged and any(not e.startswith("-") for e in extras)
        if (given is not None or stray) and namespace.output is not None:
            self.error(
                f"the output given twice, as {positional.metavar} and as "
                f"{'/'.join(flag.option_strings)}: give one"
            )
        if given is None:
            setattr(namespace, positional.dest, namespace.output)
        return namespace, extras

    def _check_value(self, action: argparse.Action, value) -> None:
        # Overrides argparse's check (a private method, stable since Python 3.2) for its
        # message alone: the nearest choice rather than all of them.
        if action.choices is None or value in action.choices:
            return
        choices = [str(c) for c in action.choices]
        near = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (choose from {', '.join(choices)})"
        what = "unknown command" if action.dest == "command" else "invalid choice"
        raise argparse.ArgumentError(action, f"{what} {value!r}{hint}")


def _names_output(arg: str) -> bool:
    """Whether a word of the command line is ``-o``/``--output`` (``-oX``, ``--output=X``,
    an abbreviation ``--out``)."""
    if arg.startswith("--"):
        return len(arg) > 3 and "--output".startswith(arg.partition("=")[0])
    return arg.startswith("-o")


def command(sub: Subparsers, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A command's parser, with its examples and the options every command takes.
    ``description``: paragraphs apart by a blank line; the short help shows the first."""
    p = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.short_help = True  # type: ignore[attr-defined]  # a Parser
    p.add_argument("--help-all", action=helptext.HelpAll, help="show every option, and exit")
    g = opt.shared_group(p)
    with opt.shared(g):
        opt.add_storage_option(g)
        # Here too, not only before the command: `tfckpt dump x --debug` works. Unset when
        # not given, so that `tfckpt --debug dump x` keeps the top-level value.
        g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


DEBUG_HELP = "show tracebacks on errors"


def add_help(sub: Subparsers) -> None:
    """``tfckpt help [COMMAND] [--all]``: what ``tfckpt [COMMAND] --help`` shows."""
    p = sub.add_parser(
        "help",
        help="show a command's help (tfckpt help COMMAND)",
        description="Show the help of COMMAND (with --all: every option), or without "
        "one, the list of commands.",
    )
    p.add_argument("topic", metavar="COMMAND", nargs="?", help="the command")
    p.add_argument("--all", action="store_true", help="every option (as COMMAND --help-all)")
    p.set_defaults(func="help")


def finish(sub: Subparsers) -> None:
    """Each command's parser as its help shows it: a short usage line, its positionals
    and its own options first, then the groups of options several commands share, the
    options every command shares last under their own heading."""
    for p in sub.choices.values():
        groups = p._action_groups  # argparse keeps the groups' order only here
        first = groups[:2]  # positionals, then options

        def rank(g, first=first) -> int:
            if g.title == opt.SHARED:
                return 3
            if g in first:
                return 0
            return 1 if any(not opt.is_shared(a) for a in g._group_actions) else 2

        groups.sort(key=rank)
        positionals = [a for a in p._actions if not a.option_strings]
        usage = [argparse.HelpFormatter(p.prog)._format_args(a, a.dest) for a in positionals]
        p.usage = " ".join(["%(prog)s [options]", *usage])
