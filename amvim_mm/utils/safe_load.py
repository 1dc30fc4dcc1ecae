"""Reading checkpoint files without running code they carry, and checking what they hold.

A checkpoint is a pickle, and a pickle can call any function while it is read. Every file goes
through ``torch.load(weights_only=True)`` with an **allow-list of types** (:data:`SAFE_GLOBALS`):
the types that official Vim files and mmengine's training checkpoints (segmentation, detection,
classification; with optimizer, parameter schedulers and message hub) contain. Where a file lies
does not matter: a training checkpoint loads safely from any folder, and a file that needs any
other type is refused, wherever it is.

The one way to read a file with full unpickling is to name it: ``AMVIM_UNSAFE_LOAD`` holds a list
of file paths (separated by ``os.pathsep``); a checkpoint whose real path equals one of them is
unpickled fully, with a warning in the log. Directories are not accepted.

After reading, the weights are checked: every floating-point tensor must be finite, and a file
this project wrote (an mmengine checkpoint written through :class:`~amvim_mm.engine.
checkpoint_hook.AtomicCheckpointHook`, or the converter's output) records the SHA-256 of its
weights under ``meta[HASH_KEY]``, which is verified, so a flipped bit is an error instead of a
model that quietly scores worse.
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pickle
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from mmengine.config import ConfigDict
from mmengine.logging import HistoryBuffer

from amvim_mm import runtime
from amvim_mm.errors import CheckpointError, ConfigError, UnsafeCheckpointError

logger = logging.getLogger('amvim_mm')

UNSAFE_ENV = runtime.variable_of('unsafe_load')
#: ``meta`` key of the weights' SHA-256 in files this project writes
HASH_KEY = 'amvim_state_dict_sha256'


# registered by HistoryBuffer.__init__ (so absent from _statistics_methods until one exists)
_HISTORY_BUFFER_METHODS = ('min', 'max', 'current', 'mean')


def _history_buffer_getattr(obj: Any, name: str) -> Any:
    """``getattr`` as mmengine's ``HistoryBuffer`` pickles it, and nothing else.

    A ``HistoryBuffer`` stores its statistics methods (``min``, ``max``, ``current``, ``mean``
    and registered ones) as ``getattr(HistoryBuffer, name)``. An unrestricted ``getattr`` would
    let a pickle walk from any allowed object to ``os.system``.
    """
    if obj is HistoryBuffer and isinstance(name, str) and \
            (name in _HISTORY_BUFFER_METHODS or name in HistoryBuffer._statistics_methods):
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'getattr({obj!r}, {name!r}) is not allowed in a checkpoint')


class _YacsCfgNode:
    """What an official VMamba training file's ``config`` (a ``yacs.config.CfgNode``, a dict
    subclass with four bookkeeping attributes) is read as: an ``OrderedDict`` with those
    attributes in its ``__dict__``. Nothing of yacs is imported or run; the unpickler may only
    fill the dict with items it could read anyway."""

    def __new__(cls, *args, **kwargs):
        return OrderedDict()


_np_multiarray = np._core.multiarray
#: types a checkpoint may contain beyond torch's own tensors and containers
SAFE_GLOBALS: List[Any] = [
    argparse.Namespace,                  # official Vim files: the training arguments
    (_YacsCfgNode, 'yacs.config.CfgNode'),   # official VMamba files: the training config
    HistoryBuffer,                       # mmengine message hub
    ConfigDict,
    (_history_buffer_getattr, 'builtins.getattr'),
    np.ndarray, np.dtype,
    (_np_multiarray._reconstruct, 'numpy._core.multiarray._reconstruct'),
    (_np_multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),   # numpy 1.x files
    (_np_multiarray.scalar, 'numpy._core.multiarray.scalar'),
    (_np_multiarray.scalar, 'numpy.core.multiarray.scalar'),
] + [type(np.dtype(t)) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                 np.float16, np.float32, np.float64)]


def unsafe_load_allowed(filename: Union[str, os.PathLike]) -> bool:
    """Whether ``AMVIM_UNSAFE_LOAD`` names this file (by real path)."""
    entries = runtime.settings().unsafe_load
    if not entries:
        return False
    target = os.path.realpath(filename)
    for entry in entries:
        if os.path.isdir(entry):
            raise ConfigError(f'{UNSAFE_ENV} names the directory {entry!r}; it takes checkpoint '
                              'files, one by one')
        if os.path.realpath(entry) == target:
            return True
    return False


def _unsafe_globals(filename: str) -> List[str]:
    """The globals of a zip checkpoint that the allow-list does not cover."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            names = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
    except Exception:   # not a zip checkpoint: torch.load's own error says more
        return []
    allowed = {f'{g.__module__}.{g.__qualname__}' if not isinstance(g, tuple) else g[1]
               for g in SAFE_GLOBALS}
    return sorted(n for n in names if n not in allowed)


def _read(filename: str, map_location: Any) -> Any:
    if os.path.getsize(filename) == 0:
        raise CheckpointError(f'{filename} is empty (0 bytes): not a checkpoint')
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = _unsafe_globals(filename)
        text = str(err)
        if not unsafe and not any(s in text for s in ('Unsupported global', 'unrecognized '
                                                      'function', 'not allowed in a checkpoint')):
            raise CheckpointError(f'{filename} is not a readable checkpoint '
                                  f'({_first_line(err)})') from None
        if unsafe_load_allowed(filename):
            logger.warning('amvim_mm: %s is named in %s: loading it with FULL unpickling '
                           '(it can run code; it pickles %s)', filename, UNSAFE_ENV,
                           ', '.join(unsafe) or 'unknown types')
            return torch.load(filename, map_location=map_location, weights_only=False)
        raise UnsafeCheckpointError(
            f'{filename} cannot be loaded safely: it pickles '
            f'{", ".join(unsafe) if unsafe else "types outside the allow-list"}, which could '
            f'run code. If you trust this file, name it: {UNSAFE_ENV}={filename}') from None
    except Exception as err:   # EOFError, zip/storage errors, a mangled pickle stack ...
        raise CheckpointError(f'{filename} is not a readable checkpoint (truncated, damaged or '
                              f'not a torch file: {_first_line(err)})') from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def weights_of(checkpoint: Any) -> Optional[Mapping]:
    """The weight mapping of a loaded checkpoint (``state_dict``, ``model`` or the dict itself),
    or ``None`` if it holds none."""
    if not isinstance(checkpoint, Mapping):
        return None
    for key in ('state_dict', 'model'):
        if isinstance(checkpoint.get(key), Mapping):
            return checkpoint[key]
    if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return checkpoint
    return None


def state_dict_sha256(sd: Mapping) -> str:
    """SHA-256 of a state dict's names, dtypes, shapes and bytes (key order independent)."""
    h = hashlib.sha256()
    for k in sorted(sd):
        v = sd[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            t = v.detach().to('cpu').contiguous()
            h.update(f'{t.dtype}{tuple(t.shape)}'.encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def check_weights(checkpoint: Any, filename: str) -> None:
    """Finite weights and, where recorded, the weights' SHA-256; a :class:`CheckpointError`
    naming the tensor or the mismatch otherwise."""
    sd = weights_of(checkpoint)
    if sd is None:
        return
    for k, v in sd.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and \
                not bool(torch.isfinite(v).all()):
            bad = int((~torch.isfinite(v)).sum())
            if bad:
                raise CheckpointError(f'{filename}: tensor {k!r} has {bad} non-finite values '
                                      '(NaN/inf); the file is damaged or the training diverged')
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
    want = meta.get(HASH_KEY) if isinstance(meta, Mapping) else None
    if want is not None and state_dict_sha256(sd) != want:
        raise CheckpointError(f'{filename}: the weights do not match the SHA-256 recorded when '
                              'the file was written; the file is damaged (e.g. a flipped bit)')


def load_checkpoint_file(filename: Union[str, os.PathLike], map_location: Any = 'cpu',
                         check: bool = True) -> Any:
    """Read a checkpoint safely (see the module docstring) and check its weights.

    Raises ``FileNotFoundError`` for a missing file, :class:`UnsafeCheckpointError` for a file
    that needs types outside the allow-list, :class:`CheckpointError` for an empty, truncated,
    damaged or non-finite one.
    """
    filename = os.fspath(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'checkpoint file not found: {filename}')
    checkpoint = _read(filename, map_location)
    if check:
        check_weights(checkpoint, filename)
    return checkpoint


def retired_env_problems() -> List[str]:
    """Set variables of the old directory-trust model, which are ignored now."""
    return [f'{name} is set but no longer honoured: training checkpoints load safely from any '
            f'folder; to unpickle one file fully, name it in {UNSAFE_ENV}'
            for name in runtime.retired_variables()]


def mark_weights(meta: Dict, state_dict: Mapping) -> Dict:
    """Record the weights' SHA-256 in ``meta`` (for files this project writes)."""
    meta[HASH_KEY] = state_dict_sha256(state_dict)
    return meta
