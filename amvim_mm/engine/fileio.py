"""An mmengine file backend whose writes are atomic (checkpoints are never half-written).

mmengine 0.10.7's ``LocalBackend.put`` writes the target file in place, so a run killed while
saving leaves a truncated checkpoint (and ``last_checkpoint`` pointing at it). This backend
writes to a temporary file in the same directory, fsyncs it and renames it over the target.
Registered under the new name ``atomic_local`` (mmengine's own backends are untouched); our
configs and ``tools/train.py`` select it with
``default_hooks.checkpoint.backend_args=dict(backend='atomic_local')``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union

from mmengine.fileio import LocalBackend, register_backend


def atomic_write_bytes(data: bytes, filepath: Union[str, Path]) -> None:
    filepath = Path(filepath)
    filepath.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{filepath.name}.', suffix='.tmp', dir=filepath.parent)
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


class AtomicLocalBackend(LocalBackend):
    """``LocalBackend`` with atomic ``put`` / ``put_text``."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write_bytes(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write_bytes(obj.encode(encoding), filepath)


register_backend('atomic_local', AtomicLocalBackend)
