"""Runtime switches of amvim_mm: every ``AMVIM_*`` environment variable, read in one place.

timm's pattern (``timm.layers.config``): the switches are one immutable :class:`Settings`
value; :func:`settings` returns the one in force, parsed from the environment by one parser
(an unknown value is a :class:`~amvim_mm.errors.ConfigError` naming the variable), and
:func:`override` changes them for a block of code without touching ``os.environ``::

    from amvim_mm import runtime
    with runtime.override(fused_mixer=False, scan_backend='torch'):
        model(x)

The environment is parsed again only when one of the variables changed (the raw values are the
cache key), so reading the settings costs one lookup per variable; a backbone's forward reads
them once (:func:`pinned`: the kernels' and mixers' many questions inside it are answered from
that one reading).

While a model is exported (:func:`exporting`: ``torch.onnx.export`` with either exporter,
``torch.export``, or a :func:`frozen_for_export` block) the environment is not read at all:
the settings in force are :data:`EXPORT` (the PyTorch scan and conv, no fused Triton mixer, no
compiled CPU kernels, no CUDA graphs), laid over an :func:`override` when one is active, so a
traced forward holds no ``os.environ`` read and no kernel call.

=================================  ========================  =================================
variable                           field                     values
=================================  ========================  =================================
``AMVIM_SCAN_BACKEND``             ``scan_backend``          auto, cuda, cpu, torch, reference
``AMVIM_CONV_BACKEND``             ``conv_backend``          auto, cuda, torch
``AMVIM_FUSED_MIXER``              ``fused_mixer``           auto (None), 1 (True), 0 (False)
``AMVIM_FUSED_REDUCTION_KERNELS``  ``reduction_kernels``     1 (default), 0
``AMVIM_FUSED_SCAN_CONFIG``        ``scan_config``           "BLOCK_E,num_warps,dt_in_kernel"
``AMVIM_FUSED_BWD_CONFIG``         ``bwd_config``            "T,BLOCK_E,num_warps"
``AMVIM_FUSED_SCAN_CHUNK``         ``scan_chunk``            auto (None), 0 (sequential), T
``AMVIM_TOME_MATCH_CONFIG``        ``match_config``          "BLOCK_D,num_warps,num_stages"
``AMVIM_EMBED_CONFIG``             ``embed_config``          "BLOCK_M,BLOCK_N,warps,stages"
``AMVIM_SNAKE_SCAN_CONFIG``        ``snake_config``          "BLOCK_E,num_warps"
``AMVIM_UNSAFE_LOAD``              ``unsafe_load``           checkpoint paths, ``os.pathsep``
``AMVIM_CPU_KERNELS``              ``cpu_kernels``           1 (default), 0
``AMVIM_CUDA_GRAPH``               ``cuda_graph``            1 (default), 0
``AMVIM_CACHE``                    ``cache_dir``             directory (``~/.cache/amvim_mm``)
``CXX``                            ``cxx``                   C++ compiler of the CPU kernels (g++)
=================================  ========================  =================================
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from typing import Dict, Iterator, Optional, Tuple

from amvim_mm.errors import ConfigError

SCAN_BACKENDS = ('cuda', 'cpu', 'torch', 'reference')
CONV_BACKENDS = ('cuda', 'torch')
_TRUE = ('1', 'true', 'on', 'yes')
_FALSE = ('0', 'false', 'off', 'no')


@dataclasses.dataclass(frozen=True)
class Settings:
    """The runtime switches (see the module docstring for their variables)."""

    scan_backend: str = 'auto'
    conv_backend: str = 'auto'
    fused_mixer: Optional[bool] = None
    reduction_kernels: bool = True
    scan_config: Optional[Tuple[int, int, int]] = None
    bwd_config: Optional[Tuple[int, int, int]] = None
    scan_chunk: Optional[int] = None
    match_config: Optional[Tuple[int, int, int]] = None
    embed_config: Optional[Tuple[int, int, int, int]] = None
    snake_config: Optional[Tuple[int, int]] = None
    unsafe_load: Tuple[str, ...] = ()
    cpu_kernels: bool = True
    cuda_graph: bool = True
    cache_dir: str = os.path.abspath(os.path.expanduser('~/.cache/amvim_mm'))
    cxx: str = 'g++'


#: field -> (environment variable, parser)
def _choice(var: str, what: str, allowed: Tuple[str, ...]):
    def parse(raw: str, source: str = var) -> str:
        name = raw.strip().lower() or 'auto'
        if name not in allowed + ('auto', ):
            raise ConfigError(f'unknown {what} {name!r} (from {source}); choose one of auto, '
                              f'{", ".join(allowed)}')
        return name
    return parse


def _tristate(var: str):
    def parse(raw: str) -> Optional[bool]:
        v = raw.strip().lower()
        if v in ('', 'auto'):
            return None
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise ConfigError(f'{var}={v!r}: use 1 (on), 0 (off) or auto')
    return parse


def _switch(var: str, default: bool = True):
    def parse(raw: str) -> bool:
        v = raw.strip().lower()
        if v == '':
            return default
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise ConfigError(f'{var}={v!r}: use 1 (on) or 0 (off)')
    return parse


def _launch(var: str, fields: str, example: str):
    def parse(raw: str) -> Optional[Tuple[int, ...]]:
        if not raw:
            return None
        values = raw.split(',')
        try:
            if len(values) != len(fields.split(',')):
                raise ValueError
            return tuple(int(v) for v in values)
        except ValueError:
            raise ConfigError(f'{var}={raw!r}: expected "{fields}", e.g. "{example}"') from None
    return parse


def _chunk(var: str):
    def parse(raw: str) -> Optional[int]:
        v = raw.strip().lower()
        if v in ('', 'auto'):
            return None
        try:
            n = int(v)
            if n < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f'{var}={raw!r}: use auto, 0 (the sequential scan) or a chunk '
                              'length T > 0 (the chunked scan), e.g. "64"') from None
        return n
    return parse


def _cache_dir(raw: str) -> str:
    """The build cache (mmcv wheel, compiled CPU kernels): ``AMVIM_CACHE`` or the default."""
    return os.path.abspath(os.path.expanduser(raw.strip() or '~/.cache/amvim_mm'))


def _paths(raw: str) -> Tuple[str, ...]:
    return tuple(p for p in raw.split(os.pathsep) if p)


VARIABLES = {
    'scan_backend': ('AMVIM_SCAN_BACKEND',
                     _choice('AMVIM_SCAN_BACKEND', 'scan backend', SCAN_BACKENDS)),
    'conv_backend': ('AMVIM_CONV_BACKEND',
                     _choice('AMVIM_CONV_BACKEND', 'causal conv backend', CONV_BACKENDS)),
    'fused_mixer': ('AMVIM_FUSED_MIXER', _tristate('AMVIM_FUSED_MIXER')),
    'reduction_kernels': ('AMVIM_FUSED_REDUCTION_KERNELS',
                          _switch('AMVIM_FUSED_REDUCTION_KERNELS')),
    'scan_config': ('AMVIM_FUSED_SCAN_CONFIG',
                    _launch('AMVIM_FUSED_SCAN_CONFIG', 'BLOCK_E,num_warps,dt_in_kernel',
                            '64,2,0')),
    'bwd_config': ('AMVIM_FUSED_BWD_CONFIG',
                   _launch('AMVIM_FUSED_BWD_CONFIG', 'T,BLOCK_E,num_warps', '32,32,2')),
    'scan_chunk': ('AMVIM_FUSED_SCAN_CHUNK', _chunk('AMVIM_FUSED_SCAN_CHUNK')),
    'match_config': ('AMVIM_TOME_MATCH_CONFIG',
                     _launch('AMVIM_TOME_MATCH_CONFIG', 'BLOCK_D,num_warps,num_stages',
                             '64,8,1')),
    'embed_config': ('AMVIM_EMBED_CONFIG',
                     _launch('AMVIM_EMBED_CONFIG', 'BLOCK_M,BLOCK_N,num_warps,num_stages',
                             '64,128,4,4')),
    'snake_config': ('AMVIM_SNAKE_SCAN_CONFIG',
                     _launch('AMVIM_SNAKE_SCAN_CONFIG', 'BLOCK_E,num_warps', '32,1')),
    'unsafe_load': ('AMVIM_UNSAFE_LOAD', _paths),
    'cpu_kernels': ('AMVIM_CPU_KERNELS', _switch('AMVIM_CPU_KERNELS')),
    'cuda_graph': ('AMVIM_CUDA_GRAPH', _switch('AMVIM_CUDA_GRAPH', default=True)),
    'cache_dir': ('AMVIM_CACHE', _cache_dir),
    'cxx': ('CXX', lambda raw: raw.strip() or 'g++'),
}


@functools.lru_cache(maxsize=8)
def _parse(raw: Tuple[Tuple[str, str], ...]) -> Settings:
    return Settings(**{field: VARIABLES[field][1](value) for field, value in raw})


def from_environment() -> Settings:
    """The settings the environment gives (parsed again only when a variable changed)."""
    return _parse(tuple((f, os.environ.get(var, '')) for f, (var, _) in VARIABLES.items()))


_local = threading.local()


#: the switches an export freezes (the PyTorch routes only; see :func:`exporting`)
EXPORT_FIELDS = dict(scan_backend='torch', conv_backend='torch', fused_mixer=False,
                     reduction_kernels=False, cpu_kernels=False, cuda_graph=False)
#: the settings of an export outside any :func:`override` (the defaults and
#: :data:`EXPORT_FIELDS`; no environment read)
EXPORT = Settings(**EXPORT_FIELDS)


def exporting() -> bool:
    """Whether a model is being exported: ``torch.export`` (also under ``torch.onnx.export(...,
    dynamo=True)``), the TorchScript ONNX exporter's trace, or a :func:`frozen_for_export`
    block. Read by the settings and by the models' export route (static shapes, constant
    index tensors, no in-place buffers)."""
    if getattr(_local, 'export_depth', 0):
        return True
    import torch
    if torch.compiler.is_exporting():
        return True
    return torch.jit.is_tracing() and torch.onnx.is_in_onnx_export()


def static_int(value) -> int:
    """``value`` (a size) as a Python int. Under the TorchScript ONNX exporter's trace sizes
    are traced 0-d tensors; the export route reads the sizes that fix its unrolled structure
    (a scan's chunk plan, the patch grid) as constants on purpose, without the tracer's
    warning about it."""
    import warnings

    import torch
    if not isinstance(value, torch.Tensor):
        return int(value)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', torch.jit.TracerWarning)
        return int(value)


def _for_export(s: Settings) -> Settings:
    """``s`` with the export's switches (:data:`EXPORT_FIELDS`)."""
    if all(getattr(s, k) == v for k, v in EXPORT_FIELDS.items()):
        return s
    return dataclasses.replace(s, **EXPORT_FIELDS)


@contextlib.contextmanager
def frozen_for_export() -> Iterator[Settings]:
    """The export's settings for the block (:data:`EXPORT` over the settings in force, read
    once here) and :func:`exporting` true inside it, whatever tracer runs."""
    with override(**EXPORT_FIELDS) as s:
        _local.export_depth = getattr(_local, 'export_depth', 0) + 1
        try:
            yield s
        finally:
            _local.export_depth -= 1


def settings() -> Settings:
    """The settings in force: the innermost :func:`override` or :func:`pinned` block's, else
    the environment's, or :data:`EXPORT` while :func:`exporting` (the environment unread; a
    forward's :func:`pinned` lays :data:`EXPORT_FIELDS` over an override)."""
    stack = getattr(_local, 'stack', None)
    if stack:
        return stack[-1]
    return EXPORT if exporting() else from_environment()


@contextlib.contextmanager
def pinned() -> Iterator[Settings]:
    """The settings in force, read once for the block (a backbone's forward): calls of
    :func:`settings` inside it return them without reading the environment again. Inside an
    :func:`override` (or another ``pinned``) nothing changes, except while :func:`exporting`:
    the block then has the export's switches (:data:`EXPORT_FIELDS`) over the override's."""
    stack = getattr(_local, 'stack', None)
    export = exporting()
    if stack and not export:
        yield stack[-1]
        return
    if stack is None:
        stack = _local.stack = []
    stack.append(_for_export(stack[-1]) if stack else EXPORT if export else from_environment())
    try:
        yield stack[-1]
    finally:
        stack.pop()


@contextlib.contextmanager
def override(**changes) -> Iterator[Settings]:
    """Change some settings for the block (validated like the environment's values)."""
    unknown = set(changes) - set(VARIABLES)
    if unknown:
        raise ConfigError(f'unknown runtime settings {sorted(unknown)}; choose from '
                          f'{", ".join(VARIABLES)}')
    for field, value in changes.items():   # strings go through the variable's parser
        if isinstance(value, str) and field != 'unsafe_load':
            changes[field] = VARIABLES[field][1](value)
    new = dataclasses.replace(settings(), **changes)
    stack = getattr(_local, 'stack', None)
    if stack is None:
        stack = _local.stack = []
    stack.append(new)
    try:
        yield new
    finally:
        stack.pop()


def variable_of(field: str) -> str:
    """The environment variable behind a settings field."""
    return VARIABLES[field][0]


def parse_value(field: str, value: str, source: str = 'argument'):
    """Parse a backend name given as an argument, with the environment's rules."""
    return VARIABLES[field][1](value, source)


#: variables of earlier versions that trusted whole directories; no longer honoured
RETIRED = ('AMVIM_TRUSTED_DIRS', 'AMVIM_ALLOW_UNSAFE_LOAD')


def retired_variables() -> Tuple[str, ...]:
    """The retired variables that are set (``check_env`` reports them)."""
    return tuple(name for name in RETIRED if os.environ.get(name))


#: what a distributed launcher (torchrun, Slurm through mmengine) sets for each process: facts
#: of the run, not switches (read when a tool starts its process group)
LAUNCHER_VARIABLES = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR',
                      'MASTER_PORT')


def launcher_environment() -> Dict[str, str]:
    """The launcher's variables of this process that are set (:data:`LAUNCHER_VARIABLES`)."""
    return {name: os.environ[name] for name in LAUNCHER_VARIABLES if name in os.environ}
