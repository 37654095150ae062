"""Start-up: ``import tfckpt`` and the command line load only the modules they use."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_import_loads_names_on_first_use():
    run_python(
        "import sys, types, tfckpt\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tfckpt.') or m == 'numpy')\n"
        "assert loaded == ['tfckpt.errors', 'tfckpt.version'], loaded\n"
        # a submodule named like a public function leaves the function in place
        "import tfckpt.rewrite.graft, tfckpt.interop.export\n"
        "from tfckpt.rewrite.average import plan_average\n"
        "for name in ('graft', 'export', 'average'):\n"
        "    assert isinstance(getattr(tfckpt, name), types.FunctionType), name\n"
        "for name in tfckpt.__all__:\n"
        "    exec(f'from tfckpt import {name}')\n"
        "    assert not isinstance(getattr(tfckpt, name), types.ModuleType), name\n"
        "assert set(tfckpt.__all__) <= set(dir(tfckpt))\n"
        "assert not hasattr(tfckpt, 'no_such_name')\n"
        "assert tfckpt.inspection.dump is sys.modules['tfckpt.inspection'].dump\n"
    )


def test_dump_loads_no_transform_modules(tf_checkpoints):
    path = tf_checkpoints("tf1_saver").path
    run_python(
        "import sys, io, contextlib, tfckpt.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert tfckpt.cli.main(['dump', '--json', {path!r}]) == 0\n"
        "loaded = {'tfckpt.rewrite.engine', 'tfckpt.rewrite.planner', 'tfckpt.checkpoint.writer', 'tfckpt.io.commit'}\n"
        "loaded &= set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )


def test_version_loads_no_commands():
    run_python(
        "import sys, io, contextlib, tfckpt.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        tfckpt.cli.main(['--version'])\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0\n"
        "assert out.getvalue().strip() == 'tfckpt ' + tfckpt.__version__, out.getvalue()\n"
        "loaded = {'tfckpt.cli.commands', 'tfckpt.checkpoint.reader', 'crc32c'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )


def test_stats_and_convert_load_no_plotting_without_a_report(tf_checkpoints, tmp_path):
    """matplotlib (and the report's modules) load for --html / --report only."""
    path = tf_checkpoints("tf1_saver").path
    out = str(tmp_path / "fp16" / "model")
    run_python(
        "import sys, io, contextlib, tfckpt.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    assert tfckpt.cli.main(['stats', '--json', {path!r}]) == 0\n"
        f"    assert tfckpt.cli.main(['convert', {path!r}, {out!r}, '--dtype', 'float16', '--overflow', 'inf']) == 0\n"
        "loaded = {m for m in sys.modules if m.startswith(('matplotlib', 'tfckpt.inspection.report'))}\n"
        "assert not loaded, loaded\n"
    )
