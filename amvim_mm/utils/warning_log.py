"""Library warnings to a log file instead of the screen.

A sweep builds one runner per model and the libraries (mmengine, mmseg, mmdet) warn about the
same deprecations each time; on the screen those lines land inside the progress bar. Inside
:func:`warnings_to_file` every warning shown is appended to a file instead (each distinct
warning once per process), the filters in force still decide what is shown (``-W error``
still raises).
"""
from __future__ import annotations

import contextlib
import os
import os.path as osp
import warnings
from typing import Iterator


@contextlib.contextmanager
def warnings_to_file(path: str, enabled: bool = True) -> Iterator[str]:
    """Within the block, warnings go to ``path`` (appended; its folder created on the first
    one), not to stderr. ``enabled=False``: a no-op (e.g. a ``--verbose`` run keeps them on
    the screen). Yields ``path``."""
    if not enabled:
        yield path
        return
    seen = set()

    def show(message, category, filename, lineno, file=None, line=None):
        key = (category, str(message), filename, lineno)
        if key in seen:
            return
        seen.add(key)
        os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
        with open(path, 'a', encoding='utf-8') as f:
            f.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield path
