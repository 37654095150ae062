"""``tfckpt completion SHELL`` prints a script each shell loads and completes with: command
names (with their summaries), options, and choices, made from the parser itself."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from cli_helpers import in_process

from tfckpt.cli import build_parser


def _script(shell: str, path) -> str:
    rc, out, err = in_process("completion", shell)
    assert rc == 0 and err == "", err
    path.write_text(out)
    return out


def _commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return list(sub.choices)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_loads_it_and_completes_commands_options_and_choices(tmp_path):
    _script("bash", tmp_path / "tfckpt.bash")
    probe = f"""
source {tmp_path / "tfckpt.bash"}
complete -p tfckpt
complete_words() {{ COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=()
  _shtab_tfckpt; echo "${{COMPREPLY[*]}}"; }}
complete_words tfckpt con
complete_words tfckpt convert --ov
complete_words tfckpt convert --overflow c
complete_words tfckpt ''
"""
    out = subprocess.run(
        ["bash", "--norc", "-c", probe], capture_output=True, text=True, check=True
    )
    lines = out.stdout.splitlines()
    assert lines[0].startswith("complete ") and lines[0].endswith(" tfckpt"), lines
    assert lines[1] == "convert"
    assert lines[2].split() == ["--overflow", "--overwrite"]
    assert lines[3] == "clip"
    assert lines[4].split() == _commands()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh")
def test_zsh_registers_it(tmp_path):
    (tmp_path / "fpath").mkdir()
    text = _script("zsh", tmp_path / "fpath" / "_tfckpt")
    assert text.startswith("#compdef tfckpt")
    probe = (
        f"fpath=({tmp_path / 'fpath'} $fpath); autoload -U compinit; "
        f"compinit -u -d {tmp_path / 'zcompdump'}; echo $_comps[tfckpt]; "
        "autoload -Uz +X _tfckpt && echo loaded"
    )
    out = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["_tfckpt", "loaded"], out
    for command in _commands():
        assert f"{command}:" in text or f'"{command}:' in text, command


@pytest.mark.skipif(shutil.which("fish") is None, reason="no fish")
def test_fish_completes_commands_options_and_choices(tmp_path):
    _script("fish", tmp_path / "tfckpt.fish")

    def complete(line: str) -> list[str]:
        probe = f"source {tmp_path / 'tfckpt.fish'}; complete -C '{line}'"
        out = subprocess.run(["fish", "-c", probe], capture_output=True, text=True, check=True)
        return [row.split("\t")[0] for row in out.stdout.splitlines()]

    assert complete("tfckpt con") == ["convert"]
    assert complete("tfckpt convert --ov") == ["--overflow", "--overwrite"]
    assert complete("tfckpt convert --overflow ") == ["clip", "error", "inf"]


def test_unknown_shell_is_one_line():
    rc, out, err = in_process("completion", "powershell")
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and "bash" in err
