"""An mmengine file backend whose writes are atomic (checkpoints are never half-written).

mmengine 0.10.7's ``LocalBackend.put`` writes the target file in place, so a run killed while
saving leaves a truncated checkpoint (and ``last_checkpoint`` pointing at it). This backend
writes to a temporary file in the same directory, fsyncs it and renames it over the target.
Registered under the new name ``atomic_local`` (mmengine's own backends are untouched); our
configs and ``tools/train.py`` select it with
``default_hooks.checkpoint.backend_args=dict(backend='atomic_local')``.

The temporary file of a write to ``<dir>/<name>`` is ``<dir>/.<name>.amvim-<random>.tmp``
(``<random>``: the 8 characters ``tempfile.mkstemp`` draws from ``[a-z0-9_]``). A killed write
leaves it behind; :func:`remove_stale_temporaries` deletes such leftovers and nothing else, so
the ``.*.tmp`` files of users and editors in the same folder are never touched.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable, Optional, Union

from mmengine.fileio import LocalBackend, register_backend

#: what marks a temporary file as one of :func:`atomic_write_bytes`'s
TEMP_MARK = 'amvim-'
_TEMP_NAME = re.compile(r'\.(?P<target>.+)\.' + re.escape(TEMP_MARK) + r'[a-z0-9_]{8}\.tmp')


def temporary_target(name: str) -> Optional[str]:
    """The file name whose atomic write uses the temporary file ``name``, or ``None`` when
    ``name`` is not one of :func:`atomic_write_bytes`'s temporaries (``.<target>.amvim-<8
    characters of [a-z0-9_]>.tmp``, matched exactly)."""
    m = _TEMP_NAME.fullmatch(name)
    return m.group('target') if m else None


def atomic_write_bytes(data: bytes, filepath: Union[str, Path]) -> None:
    """Write ``data`` to ``filepath`` through a temporary file in the same folder that is
    fsynced and renamed over the target: a reader sees the old file or the new one, whole."""
    filepath = Path(filepath)
    filepath.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{filepath.name}.{TEMP_MARK}', suffix='.tmp',
                               dir=filepath.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)   # mkstemp creates 0600; give the usual file mode
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filepath)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_stale_temporaries(folder: Union[str, Path], is_target: Callable[[str], bool]) -> int:
    """Delete the temporaries that killed :func:`atomic_write_bytes` calls left in ``folder``
    for targets that ``is_target`` (given the target's file name) accepts; returns the count.

    Only regular files named exactly like our temporaries are candidates, so a user's
    ``.notes.tmp`` (or any other file) in the folder survives.
    """
    n = 0
    for entry in os.scandir(folder):
        target = temporary_target(entry.name)
        if target is None or not is_target(target):
            continue
        try:
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                continue
            os.unlink(entry.path)
            n += 1
        except OSError:
            pass
    return n


class AtomicLocalBackend(LocalBackend):
    """``LocalBackend`` with atomic ``put`` / ``put_text``."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write_bytes(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write_bytes(obj.encode(encoding), filepath)


register_backend('atomic_local', AtomicLocalBackend)


def check_output_path(out: Union[str, Path], inputs: dict, force: bool = False) -> None:
    """Refuse, before any work, an output file that is one of the tool's inputs (the same file,
    also through links or another spelling of its path) or that exists without ``force``.

    Args:
        out: the file the tool is about to write.
        inputs: ``{what: path}`` of the files the tool reads (e.g. ``{'checkpoint': ...}``).
        force: replace an existing ``out`` that is not an input.
    """
    from amvim_mm.errors import ConfigError
    out = os.path.expanduser(str(out))
    for what, path in inputs.items():
        if not path:
            continue
        path = os.path.expanduser(str(path))
        same = (os.path.samefile(out, path) if os.path.exists(out) and os.path.exists(path)
                else os.path.realpath(out) == os.path.realpath(path))
        if same:
            raise ConfigError(f'the output {out} is the {what} given as input; refusing to '
                              'overwrite it (choose another output path)')
    if os.path.isdir(out):
        raise ConfigError(f'the output {out} is a folder; give a file path')
    if os.path.exists(out) and not force:
        raise ConfigError(f'the output {out} exists; pass --force to replace it')
