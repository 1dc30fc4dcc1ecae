"""How the command-line tools end: a one-line error and exit code 2 for a problem the user can
fix, instead of a traceback.

Every tool's ``__main__`` block is ``sys.exit(run_cli(main))``. Caught are the project's own
errors (:class:`amvim_mm.errors.AmvimError`: bad config values, unusable checkpoints, a backend
this machine lacks) and the OS's file errors (missing data root or checkpoint, a file where a
folder is expected, no permission). Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

from amvim_mm.errors import AmvimError

USER_ERRORS = (AmvimError, FileNotFoundError, FileExistsError, IsADirectoryError,
               NotADirectoryError, PermissionError)


def error_line(err: BaseException) -> str:
    """The message of an error, on at most two lines."""
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()] or [type(err).__name__]
    return '\n'.join(lines[:2])


def run_cli(main: Callable[[], Optional[int]]) -> int:
    """Call a tool's ``main``; return its exit code, or 2 after printing ``error: ...``."""
    try:
        return main() or 0
    except USER_ERRORS as err:
        print(f'error: {error_line(err)}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts such as ``--threads``: a positive integer, else the
    parser's one-line error (a negative thread count reached ``torch.set_num_threads``)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f'expected a positive integer, got {text!r}')
    return n
