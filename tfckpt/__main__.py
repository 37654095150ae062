"""The ``tfckpt`` program (``python -m tfckpt`` and the installed ``tfckpt`` script).

It imports the command line only inside :func:`main`, where an interrupt is caught: a
Ctrl-C while the commands are still loading ends as any other interrupt does, with one
line on stderr and exit status 130, never a traceback.
"""

import sys

EXIT_INTERRUPTED = 130


def main() -> int:
    """Run the command line on ``sys.argv[1:]``; the exit status."""
    try:
        from tfckpt.cli import main as run

        return run()
    except KeyboardInterrupt:
        # Here only when the interrupt came before tfckpt.cli.main took over (it
        # answers its own): while Python loaded the command line.
        print("tfckpt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
