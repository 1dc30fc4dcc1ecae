"""What a checkpoint's pickles would build, found out without building it.

torch's weights-only unpickler decides which *types* a file may create, but an allowed type can
still be handed a hostile *state*: ``numpy.dtype.__setstate__`` takes the dtype's flags from the
file, so a float64 dtype whose flags claim it holds Python objects passes the allow-list and then
makes numpy fail ("Internal error") wherever an array of it is used or freed, ``torch.load``
itself included. A check after loading is too late, so :func:`scan_checkpoint` replays the
file's pickles first, with an unpickler in which every global is a stand-in (:class:`_Stub`):
nothing is imported or called except numpy's dtype constructor and ``dtype.__setstate__`` (on a
fresh copy) and ``_codecs.encode``, so each dtype and array type the file would create is built
and checked. The replay reads the same bytes ``torch.load`` reads (torch's own zip reader and
``data.pkl``; for older files the pickles in the order torch's legacy loader reads them) and
also lists every global the file names, for the refusal message.
"""
from __future__ import annotations

import codecs
import io
import pickle
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from typing import Any, Dict, List

import numpy as np
import torch

#: numpy's dtype flags that mean "the items are Python objects" (NPY_ITEM_HASOBJECT,
#: NPY_LIST_PICKLE, NPY_ITEM_IS_POINTER)
OBJECT_FLAGS = 0x01 | 0x02 | 0x04
# the globals that make an ndarray: the position of their dtype argument
_ARRAY_MAKERS = {'numpy.ndarray': 1, 'numpy._core.multiarray._reconstruct': 2,
                 'numpy.core.multiarray._reconstruct': 2}
# torch's legacy format: magic number, protocol, sys info, the object, the storage keys
_LEGACY_PICKLES = 5


class ObjectDtypeError(pickle.UnpicklingError):
    """A checkpoint builds a numpy dtype (or an array of one) that holds Python objects."""


def _dtype_maker(name: str) -> Any:
    """``numpy.dtype`` or one of numpy's dtype classes for a global name, else None (looked up
    in numpy's already imported modules only)."""
    if name == 'numpy.dtype':
        return np.dtype
    if name.startswith('numpy.dtypes.'):
        cls = getattr(np.dtypes, name[len('numpy.dtypes.'):], None)
        if isinstance(cls, type) and issubclass(cls, np.dtype):
            return cls
    return None


def check_dtype(dtype: np.dtype) -> None:
    """Raise :class:`ObjectDtypeError` for an object dtype or flags that claim objects (reads
    only ``kind``, ``flags`` and ``str``, which never touch the items)."""
    if dtype.kind == 'O' or dtype.flags & OBJECT_FLAGS:
        raise ObjectDtypeError(f'a numpy dtype {dtype.str!r} (flags {dtype.flags:#x}) marked '
                               'as holding Python objects')


def _real(value: Any) -> Any:
    """A value with every stand-in that stands for a real dtype or bytes replaced by it."""
    if isinstance(value, _Stub):
        return value.real if value.real is not None else value
    if isinstance(value, tuple):
        return tuple(_real(v) for v in value)
    if isinstance(value, list):
        return [_real(v) for v in value]
    if isinstance(value, dict):
        return {_real(k): _real(v) for k, v in value.items()}
    return value


class _Stub:
    """What a global, or a call or ``NEWOBJ`` of one, stands for during the replay: it takes any
    arguments, state and items and keeps nothing, except the dtype (checked) or bytes that a
    dtype maker or ``_codecs.encode`` would really return (:attr:`real`)."""

    global_name = ''

    def __new__(cls, *args: Any, **kwargs: Any) -> '_Stub':
        self = object.__new__(cls)
        self.real = None
        name = cls.global_name
        args, kwargs = _real(args), _real(kwargs)
        maker = _dtype_maker(name)
        if maker is not None:
            self.real = maker(*args, **kwargs)
            check_dtype(self.real)
        elif name == '_codecs.encode' and all(isinstance(a, str) for a in args) and not kwargs:
            self.real = codecs.encode(*args)
        elif name in _ARRAY_MAKERS:
            at = _ARRAY_MAKERS[name]
            _check_dtype_argument(args[at] if len(args) > at else kwargs.get('dtype'))
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        if isinstance(self.real, np.dtype):
            fresh = np.dtype(self.real, False, True)   # never the shared builtin instance
            fresh.__setstate__(_real(state))
            check_dtype(fresh)
            self.real = fresh
        elif type(self).global_name in _ARRAY_MAKERS and isinstance(state, tuple):
            for item in _real(state):     # (version, shape, dtype, is_fortran, data)
                if isinstance(item, np.dtype):
                    check_dtype(item)

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def add(self, item: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _check_dtype_argument(arg: Any) -> None:
    """Check the dtype argument of an array maker: a dtype or a type code (``b'b'``, ``'O'``);
    anything else is left to numpy (which refuses it in the real load)."""
    if isinstance(arg, (str, bytes)):
        try:
            arg = np.dtype(arg)
        except (TypeError, ValueError, SyntaxError):
            return
    if isinstance(arg, np.dtype):
        check_dtype(arg)


class _Replayer(pickle.Unpickler):
    """An unpickler whose globals are all stand-ins; it records their names."""

    def __init__(self, file: Any, names: Dict[str, None]) -> None:
        super().__init__(file, encoding='latin1')
        self._names = names
        self._classes: Dict[str, type] = {}

    def find_class(self, module: str, name: str) -> type:
        # Python 2 names (``__builtin__.set``), mapped as torch's unpickler maps them
        if (module, name) in NAME_MAPPING:
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
        full = f'{module}.{name}'
        self._names.setdefault(full)
        if full not in self._classes:
            self._classes[full] = type('_Stub', (_Stub, ), {'global_name': full})
        return self._classes[full]

    def persistent_load(self, pid: Any) -> Any:
        return _Stub()


def scan_checkpoint(filename: str) -> List[str]:
    """Replay the pickles of a ``torch.save`` file; return the globals it names.

    Raises :class:`ObjectDtypeError` for a dtype or array that holds Python objects, and the
    unpickler's or torch's reader's error for a file that is not a readable checkpoint.
    """
    names: Dict[str, None] = {}
    with open(filename, 'rb') as f:
        if torch.serialization._is_zipfile(f):        # torch.load's own test and reader
            f.seek(0)
            with torch.serialization._open_zipfile_reader(f) as archive:
                data = archive.get_record('data.pkl')
            _Replayer(io.BytesIO(data), names).load()
            return list(names)
        f.seek(0)
        for i in range(_LEGACY_PICKLES):
            try:
                obj = _Replayer(f, names).load()
            except EOFError:
                if i == 0:
                    raise
                break
            if i == 0 and obj != torch.serialization.MAGIC_NUMBER:
                break   # not torch's legacy format: torch reads this one pickle only
    return list(names)

