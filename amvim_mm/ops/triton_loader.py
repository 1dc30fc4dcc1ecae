"""The one way the ops load their Triton kernels.

The kernel modules (``ops/_*_kernels.py``) hold undecorated functions: here they are wrapped
with ``triton.jit`` once per process, compiled for CUDA tensors or run by Triton's interpreter
on CPU tensors. The interpreter is chosen when Python starts (``TRITON_INTERPRET=1``, read by
Triton itself), so a CPU call without it is refused with one line naming the switch.
"""
from __future__ import annotations

import functools
import importlib
from typing import Tuple

from amvim_mm.errors import BackendUnavailableError

__all__ = ['jit_kernels']


@functools.lru_cache(maxsize=None)
def jit_kernels(module: str, names: Tuple[str, ...], what: str, interpret: bool) -> tuple:
    """``triton.jit`` of the functions ``names`` of ``amvim_mm.ops.<module>``, in order.

    ``what`` names the kernels in the error; ``interpret``: the call is for CPU tensors (Triton's
    interpreter), refused unless Python started with ``TRITON_INTERPRET=1``.
    """
    import triton
    if interpret and not triton.knobs.runtime.interpret:
        raise BackendUnavailableError(f"on CPU tensors {what} runs in Triton's interpreter "
                                      'only: set TRITON_INTERPRET=1 before starting Python '
                                      '(slow; meant for tests)')
    kernels = importlib.import_module(f'amvim_mm.ops.{module}')
    return tuple(triton.jit(getattr(kernels, n)) for n in names)
