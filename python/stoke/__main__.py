"""python -m stoke: the stoke command-line tool from the Python package.

    python -m stoke devices [--json]          the chosen accelerator and every backend considered
    python -m stoke load SOURCE [options]     time the loader on a source (--help for options)
    python -m stoke bench pinned|copy         micro-benchmarks;  python -m stoke version

The commands are the C tool's own code (tools/, linked into the extension), so the output, the
--json objects and the exit statuses are those of `stoke`; see the README for their fields.
"""
import signal
import sys

from . import _stoke


def main(argv=None):
    """Runs one command line (default: sys.argv[1:]) and returns its exit status: 0, 1 for a
    failure, 2 for a usage error.  The command writes to file descriptors 1 and 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    for f in (sys.stdout, sys.stderr):
        if f is not None:  # (None: the descriptor was closed; the C code reports its writes)
            f.flush()
    return _stoke._cli_main(args)


def cli():
    """The `stoke` command a pip install puts on PATH, and `python -m stoke`: as the C tool,
    Ctrl-C ends the run at once and a closed pipe ends the process (Python's handlers would
    only act after the command returned)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())


if __name__ == "__main__":
    cli()
