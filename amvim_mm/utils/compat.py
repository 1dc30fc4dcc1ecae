"""Compatibility shims for upstream breakage, all in one place.

Each shim names the upstream problem and the version that fixes it. Nothing here edits installed
packages or monkeypatches other libraries' classes; the only hook into another library is
registering our own checkpoint loader through mmengine's public ``CheckpointLoader`` API.

1. **torch >= 2.6 ``torch.load(weights_only=True)`` default vs mmengine 0.10.7.**
   mmengine 0.10.7 calls ``torch.load`` without ``weights_only``; under torch >= 2.6 its own
   training checkpoints (``HistoryBuffer``, numpy scalars, ``builtins.getattr``) then fail to load in
   ``load_from``, ``resume`` and ``load_checkpoint``. Fixed on mmengine's main branch after 0.10.7
   (unreleased as of 2026-11). Our fix: :func:`load_checkpoint_file`, registered for local paths:
   it loads **safely first** (``weights_only=True`` plus a tiny allow-list: ``argparse.Namespace``,
   which official Vim checkpoints hold under ``"args"``), and falls back to full unpickling only for
   a *trusted* file: one under a trusted directory (the run's work dir, registered by our tools
   with :func:`trust_directory`; ``./work_dirs``; ``$AMVIM_TRUSTED_DIRS``) or with the explicit
   opt-in ``AMVIM_ALLOW_UNSAFE_LOAD=1``. The fallback is logged. An untrusted file that needs full
   unpickling is refused with an error that names the offending types and the opt-in.
"""
from __future__ import annotations

import argparse
import logging
import os
import pickle
from pathlib import Path
from typing import Any, List, Optional, Union

import torch

logger = logging.getLogger('amvim_mm')

# Harmless types allowed in pretrained files (torch.load weights_only=True).
SAFE_GLOBALS = [argparse.Namespace]

_TRUSTED_DIRS: List[Path] = []


class UnsafeCheckpointError(pickle.UnpicklingError):
    """Raised when a checkpoint needs full unpickling and is not trusted."""


def trust_directory(path: Union[str, os.PathLike]) -> None:
    """Allow full unpickling of checkpoints under ``path`` (e.g. the run's own work dir)."""
    p = Path(path).resolve()
    if p not in _TRUSTED_DIRS:
        _TRUSTED_DIRS.append(p)


def _trusted_dirs() -> List[Path]:
    dirs = list(_TRUSTED_DIRS) + [Path('work_dirs').resolve()]
    for d in os.environ.get('AMVIM_TRUSTED_DIRS', '').split(os.pathsep):
        if d:
            dirs.append(Path(d).resolve())
    return dirs


def is_trusted(filename: Union[str, os.PathLike]) -> bool:
    if os.environ.get('AMVIM_ALLOW_UNSAFE_LOAD', '') in ('1', 'true', 'True', 'yes'):
        return True
    f = Path(filename).resolve()
    return any(f == d or d in f.parents for d in _trusted_dirs())


def load_checkpoint_file(filename: Union[str, os.PathLike],
                         map_location: Any = 'cpu',
                         trusted: Optional[bool] = None) -> Any:
    """Load a checkpoint file the safe way first; see the module docstring.

    Args:
        filename: path of the file.
        map_location: as for ``torch.load``.
        trusted: ``True`` allows full unpickling if needed, ``False`` forbids it, ``None`` decides
            by :func:`is_trusted`.
    """
    filename = os.fspath(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'checkpoint file not found: {filename}')
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        safe_error = err
    if trusted is None:
        trusted = is_trusted(filename)
    if not trusted:
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
        except Exception:  # not a zip checkpoint
            names = []
        raise UnsafeCheckpointError(
            f'{filename} cannot be loaded with weights_only=True'
            + (f' (it pickles: {", ".join(sorted(names))})' if names else '')
            + '. A checkpoint is a pickle and can run code when loaded. If you made this file '
            '(e.g. a training checkpoint of yours), put it under ./work_dirs, add its folder to '
            'AMVIM_TRUSTED_DIRS, or set AMVIM_ALLOW_UNSAFE_LOAD=1.') from safe_error
    logger.info('amvim_mm: %s is a trusted training checkpoint; loading with full unpickling',
                filename)
    return torch.load(filename, map_location=map_location, weights_only=False)


def _mmengine_local_loader(filename: str, map_location: Any = None) -> Any:
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_checkpoint_file(filename, map_location=map_location)


def register_checkpoint_loader() -> None:
    """Register :func:`load_checkpoint_file` as mmengine's loader for local paths.

    Uses mmengine's public ``CheckpointLoader.register_scheme`` (``force=True`` replaces its
    ``load_from_local``, whose bare ``torch.load`` fails on torch >= 2.6).
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=_mmengine_local_loader, force=True)
