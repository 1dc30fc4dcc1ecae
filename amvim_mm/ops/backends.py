"""Which kernels are available, probed lazily (never at import of amvim_mm).

Backends of the custom ops:

* ``cuda``: the ``mamba-ssm`` package's public ``selective_scan_fn`` (and ``causal_conv1d_fn``
  from ``causal-conv1d``), only for CUDA tensors and only when the packages import;
* ``cpu``: the project's compiled CPU kernel (:mod:`amvim_mm.ops.cpu_ops`; built by the set-up
  script), for CPU tensors when no autograd graph is recorded (it has no backward);
* ``torch``: the project's own chunked PyTorch implementation (any device, autograd, exact);
* ``reference``: the plain sequential loop, the ground truth for tests.

The automatic choice is ``cuda`` when usable for the tensors at hand; for CPU tensors ``cpu``
when the kernel is built and the call records no graph (float32/16-bit inputs, B and C in
groups of whole vectors of channels), else ``torch``. It can be overridden per call site by
argument or globally by the environment variable ``AMVIM_SCAN_BACKEND``
(``auto``/``cuda``/``cpu``/``torch``/``reference``).
"""
from __future__ import annotations

import functools
import importlib
import logging
from typing import Callable, Optional, Tuple

from amvim_mm import runtime
from amvim_mm.errors import BackendUnavailableError
from . import cpu_ops

SCAN_BACKENDS = runtime.SCAN_BACKENDS
ENV_VAR = runtime.variable_of('scan_backend')

logger = logging.getLogger('amvim_mm')


@functools.lru_cache(maxsize=None)
def _probe(module: str, attr: str) -> Tuple[Optional[Callable], str]:
    """Import ``module.attr`` once; return (function or None, reason)."""
    try:
        mod = importlib.import_module(module)
        fn = getattr(mod, attr)
    except Exception as e:  # ImportError, OSError from a missing .so, RuntimeError w/o CUDA
        return None, f'{type(e).__name__}: {e}'.splitlines()[0][:200]
    return fn, 'ok'


def mamba_selective_scan() -> Tuple[Optional[Callable], str]:
    """The ``mamba-ssm`` CUDA selective scan (public function only), or (None, reason)."""
    return _probe('mamba_ssm.ops.selective_scan_interface', 'selective_scan_fn')


def causal_conv1d_kernel() -> Tuple[Optional[Callable], str]:
    """The ``causal-conv1d`` CUDA kernel, or (None, reason)."""
    return _probe('causal_conv1d', 'causal_conv1d_fn')


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def check_backend_usable(backend: Optional[str] = None, who: str = 'model') -> None:
    """At build time: a forced ``cuda`` scan backend (argument or ``AMVIM_SCAN_BACKEND``) must
    be usable on this machine, else every forward would fail later (after a long start)."""
    if requested_backend(backend) != 'cuda':
        return
    fn, reason = mamba_selective_scan()
    if fn is None or not cuda_available():
        src = 'scan_backend="cuda"' if backend is not None else f'{ENV_VAR}=cuda'
        why = reason if fn is None else 'CUDA is not available'
        raise BackendUnavailableError(f'{who}: {src} is not usable on this machine ({why}); '
                                      'use "torch" or leave it unset (automatic)')


def requested_backend(backend: Optional[str] = None) -> str:
    """Resolve the requested backend name: argument > ``AMVIM_SCAN_BACKEND`` (through
    :mod:`amvim_mm.runtime`) > ``auto``."""
    if backend is not None:
        return runtime.parse_value('scan_backend', backend)
    return runtime.settings().scan_backend


_logged: set = set()


def log_choice_once(site: str, backend: str, reason: str = '') -> None:
    key = (site, backend)
    if key not in _logged:
        _logged.add(key)
        logger.info('amvim_mm: %s uses the %r backend%s', site, backend,
                    f' ({reason})' if reason else '')


def resolve_scan_backend(is_cuda: bool, backend: Optional[str] = None,
                         cpu_fits: Optional[str] = None) -> str:
    """Pick the scan backend for tensors on CUDA (``is_cuda``) or not. ``cpu_fits``: why the
    compiled CPU kernel cannot take this call (``None``: it can; e.g. a recorded graph)."""
    name = requested_backend(backend)
    if name == 'auto':
        if is_cuda:
            return 'cuda' if mamba_selective_scan()[0] is not None else 'torch'
        return 'cpu' if cpu_fits is None and cpu_ops.available()[0] else 'torch'
    if name == 'cpu':
        why = 'it needs CPU tensors' if is_cuda else cpu_fits or cpu_ops.available()[1]
        if why != 'ok':
            raise BackendUnavailableError(f'scan backend "cpu" cannot take this call: {why}; '
                                          'use "torch" or leave it unset (automatic)')
    if name == 'cuda':
        fn, reason = mamba_selective_scan()
        if fn is None:
            raise BackendUnavailableError(
                'scan backend "cuda" was requested but mamba-ssm is not usable '
                f'({reason}); install the GPU extra (tools/gpu/README.md) or use "torch"')
        if not is_cuda:
            raise BackendUnavailableError('scan backend "cuda" needs CUDA tensors; got CPU '
                                          'tensors (this machine has no usable GPU?)')
    return name
