"""A faster Triton interpreter for the parity tests of the GPU kernels on a CPU.

Triton 3.x's interpreter (``TRITON_INTERPRET=1``) re-patches ``triton.language`` at every call
of a ``@triton.jit`` helper from inside a kernel (``InterpretedFunction.__call__`` calls
``_patch_lang``, which walks every member of ``tl``, ``tl.core``, ``tl.tensor`` and ``tl.math``
with ``inspect.getmembers``), although the kernel's own launch has patched the same modules for
the whole grid already. Our kernels call small helpers (the exp2 polynomial, the scan's
combine, ...) tens of thousands of times, so that walk took a large share of an interpreter
test's time (measured in ``benchmarks/README.md``).

:func:`install` makes a helper's patch a no-op while a kernel launch (``GridExecutor``) that
already patched every language module the helper sees is running; anything else (a helper
called outside a launch, one seeing modules the launch did not patch) takes Triton's own code.
A helper that sees more modules (``triton.language.standard``'s ``sum`` sees ``tl.core``) is
patched by Triton the first time in a launch, and those modules count as patched for the rest of
it (nothing restores them before the launch ends). The interpreted values are untouched: a
skipped patch would set the attributes that are set already (builtins are wrapped once; the
launch's scope restores its changes at its end, and each launch starts afresh). For tests only:
nothing in the package imports this module.
"""
from __future__ import annotations

import functools
import threading

_state = threading.local()


class _NoScope:
    @staticmethod
    def restore() -> None:
        pass


def install() -> bool:
    """Install the shortcut into this process's Triton interpreter (idempotent). Returns False,
    changing nothing, where the interpreter's layout is not the one this was written for."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    if getattr(interp, '_amvim_fast_helpers', False):
        return True
    grid_call = getattr(getattr(interp, 'GridExecutor', None), '__call__', None)
    original = getattr(interp, '_patch_lang', None)
    if grid_call is None or original is None or not hasattr(interp, 'InterpretedFunction'):
        return False

    def langs(fn):
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    @functools.wraps(original)
    def patch_lang(fn):
        active = getattr(_state, 'langs', None)
        if active is not None and langs(fn) <= active:
            return _NoScope()           # a helper inside a launch that patched its modules
        scope = original(fn)
        if getattr(_state, 'pending', False):   # the launch's own patch, at its start
            _state.pending, _state.langs = False, langs(fn)
        elif active is not None:   # a helper seeing more (tl.core): patched until the launch ends
            _state.langs = active | langs(fn)
        return scope

    @functools.wraps(grid_call)
    def launch(self, *args, **kwargs):
        saved = getattr(_state, 'pending', False), getattr(_state, 'langs', None)
        _state.pending, _state.langs = True, None
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _state.pending, _state.langs = saved

    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch
    interp._amvim_fast_helpers = True
    return True


#: the first lines of an interpreter test's subprocess script
PREAMBLE = 'from amvim_mm.testing.triton_interpreter import install\ninstall()\n'

__all__ = ['install', 'PREAMBLE']
