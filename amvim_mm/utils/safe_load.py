"""Reading checkpoint files without running code they carry, and checking what they hold.

A checkpoint is a pickle, and a pickle can call any function while it is read. Every file goes
through ``torch.load(weights_only=True)`` with an **allow-list of types** (:data:`SAFE_GLOBALS`):
the types that official Vim files and mmengine's training checkpoints (segmentation, detection,
classification; with optimizer, parameter schedulers and message hub) contain. Where a file lies
does not matter: a training checkpoint loads safely from any folder, and a file that needs any
other type is refused, wherever it is; a URL or a prefixed name (``torchvision://``...) is read
from its download cache by the same function (:mod:`amvim_mm.utils.remote_checkpoint`). Before
``torch.load`` runs, the file's pickles are replayed without building anything
(:mod:`amvim_mm.utils.pickle_scan`): a numpy dtype or array that holds Python objects (or whose
pickled flags claim so) is refused there, and the globals the file names are listed for the
one-line refusal.

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
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from mmengine.config import ConfigDict
from mmengine.logging import HistoryBuffer

from amvim_mm import runtime
from amvim_mm.errors import CheckpointError, ConfigError, UnsafeCheckpointError
from .pickle_scan import ObjectDtypeError, scan_checkpoint

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


def _allowed_names() -> set:
    """Global names a weights-only load accepts: ours and torch's own (tensors, storages,
    ``OrderedDict``...; the set torch's ``get_unsafe_globals_in_checkpoint`` reads)."""
    ours = {f'{g.__module__}.{g.__qualname__}' if not isinstance(g, tuple) else g[1]
            for g in SAFE_GLOBALS}
    return ours | set(torch._weights_only_unpickler._get_allowed_globals())


# what torch's weights-only errors say besides the cause: its advice to unpickle fully, which
# is wrong for a file that was refused for a reason
_TORCH_BOILERPLATE = ('Weights only load failed', 'Please file an issue', 'Check the documentation')
# what the weights-only unpickler (and our restricted getattr) say when the allow-list refuses
#: ``torch.serialization.safe_globals`` sets torch's process-wide allow-list and restores the
#: previous one on exit: two threads loading at once would end each other's allow-list mid-read
_ALLOWLIST_LOCK = threading.RLock()

_REFUSALS = ('Unsupported global', 'unrecognized function', 'not allowed in a checkpoint',
             'allowlisted')


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(_TORCH_BOILERPLATE)]
    return ((useful or lines or [type(err).__name__])[0])[:200]


def _refusal(shown: str, filename: str, what: str, temporary: bool) -> UnsafeCheckpointError:
    """The one-line refusal: what the file holds and how to opt in."""
    how = (f'if you trust it, save it as a local file and name that file in {UNSAFE_ENV}'
           if temporary else f'if you trust this file, name it: {UNSAFE_ENV}={filename}')
    return UnsafeCheckpointError(f'{shown} cannot be loaded safely: it {what}; {how}')


def _full_load(filename: str, map_location: Any, shown: str, what: str) -> Any:
    """The opt-in: unpickle a file named in ``AMVIM_UNSAFE_LOAD`` fully, with a warning."""
    logger.warning('amvim_mm: %s is named in %s: loading it with FULL unpickling (it can run '
                   'code; it %s)', shown, UNSAFE_ENV, what)
    try:
        return torch.load(filename, map_location=map_location, weights_only=False)
    except Exception as err:
        raise CheckpointError(f'{shown} is not a readable checkpoint, even fully unpickled '
                              f'({_first_line(err)})') from None


def _read(filename: str, map_location: Any, shown: str, temporary: bool) -> Any:
    if os.path.getsize(filename) == 0:
        raise CheckpointError(f'{shown} is empty (0 bytes): not a checkpoint')
    try:
        names = scan_checkpoint(filename)
    except ObjectDtypeError as err:
        what = f'holds {err}, which numpy cannot use safely'
        if unsafe_load_allowed(filename):
            return _full_load(filename, map_location, shown, what)
        raise _refusal(shown, filename, what, temporary) from None
    except Exception as err:   # EOFError, zip/pickle errors ...
        raise CheckpointError(f'{shown} is not a readable checkpoint (truncated, damaged or '
                              f'not a torch file: {_first_line(err)})') from None
    try:
        with _ALLOWLIST_LOCK, torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = [n for n in names if n not in _allowed_names()]
        if not unsafe and not any(s in str(err) for s in _REFUSALS):
            raise CheckpointError(f'{shown} is not a readable checkpoint '
                                  f'({_first_line(err)})') from None
        what = (f'pickles {", ".join(unsafe)}, which could run code' if unsafe else
                f'needs more than the allow-list ({_first_line(err)})')
        if unsafe_load_allowed(filename):
            return _full_load(filename, map_location, shown, what)
        raise _refusal(shown, filename, what, temporary) from None
    except Exception as err:   # zip/storage errors, a mangled pickle stack ...
        raise CheckpointError(f'{shown} is not a readable checkpoint (truncated, damaged or '
                              f'not a torch file: {_first_line(err)})') from None


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
    if want is None:
        _say_unverified(filename)
    elif state_dict_sha256(sd) != want:
        raise CheckpointError(f'{filename}: the weights do not match the SHA-256 recorded when '
                              'the file was written; the file is damaged (e.g. a flipped bit)')


#: files already reported as unverified (one line per file and process)
_UNVERIFIED: set = set()


def _say_unverified(filename: str) -> None:
    """One log line that a checkpoint carries no recorded weights hash, so its weights are
    loaded unverified (files written by this project's tools carry one; official and other
    files do not; a file whose hash key was removed is then not silently taken as checked)."""
    if filename in _UNVERIFIED:
        return
    _UNVERIFIED.add(filename)
    from mmengine.logging import print_log
    print_log(f'{filename}: no recorded weights hash ({HASH_KEY}); its weights are loaded '
              'unverified (files written by amvim_mm carry one)', logger='current',
              level=logging.WARNING)


def load_checkpoint_file(filename: Union[str, os.PathLike], map_location: Any = 'cpu',
                         check: bool = True, origin: Optional[str] = None,
                         temporary: bool = False) -> Any:
    """Read a checkpoint safely (see the module docstring) and check its weights.

    ``origin`` is where a downloaded file came from (a URL, ``s3://...``), shown in messages
    next to the local path; ``temporary`` says the local file is a copy deleted after reading,
    which ``AMVIM_UNSAFE_LOAD`` cannot name (the refusal then says to save it first).

    Raises ``FileNotFoundError`` for a missing file, :class:`UnsafeCheckpointError` for a file
    that needs types outside the allow-list or holds numpy object dtypes,
    :class:`CheckpointError` for an empty, truncated, damaged or non-finite one.
    """
    filename = os.fspath(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'checkpoint file not found: {filename}')
    shown = filename if origin is None else origin if temporary else \
        f'{origin} (cached as {filename})'
    checkpoint = _read(filename, map_location, shown, temporary)
    if check:
        check_weights(checkpoint, shown)
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
