"""Which path the mixers of one step take (:class:`PathProbe`), and the switch the suite sets
on them."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch.nn as nn


class PathProbe:
    """Record which path every mixer call of one step takes (a context manager).

    Each :class:`~amvim_mm.models.vim.mixer.BiMambaMixer` call is asked for its decision
    in a forward pre-hook, as its forward takes it: the ``fused`` flag the block passes (the
    backbone's one decision per forward), else :meth:`use_fused`, then the per-call conditions
    (ToP's importance scores and alignment need the unfused path). The calls of the fused
    mixer functions (inference and training) are counted as a cross-check (``path_note`` when
    they disagree). Used for one warm-up call only: the hooks cost Python time.
    """

    def __init__(self, model: nn.Module) -> None:
        from amvim_mm.models.vim.mixer import BiMambaMixer
        self.mixers = [m for m in model.modules() if isinstance(m, BiMambaMixer)]
        self.decisions: List[Optional[bool]] = []
        self.backends: set = set()
        self.kernel_calls = 0
        #: whether the fused mixer function could be wrapped to count its calls
        self.counting = False
        self.errors: List[str] = []
        self._handles: list = []
        self._saved = None

    def __enter__(self) -> 'PathProbe':
        from amvim_mm.models.vim import mixer as mixer_module
        self._handles = [m.register_forward_pre_hook(self._pre, with_kwargs=True)
                         for m in self.mixers]
        # the inference and the training entry of the fused mixer
        names = ('fused_mixer_forward', 'fused_mixer_train')
        saved = [(n, getattr(mixer_module, n, None)) for n in names]
        if all(f is not None for _, f in saved) and self.mixers:
            for name, original in saved:
                def counted(*args, _original=original, **kwargs):
                    self.kernel_calls += 1
                    return _original(*args, **kwargs)
                setattr(mixer_module, name, counted)
            self._saved = (mixer_module, saved)
            self.counting = True
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        if self._saved is not None:
            module, saved = self._saved
            for name, original in saved:
                setattr(module, name, original)
            self._saved = None

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        try:
            hidden = args[0] if args else kwargs['hidden']
            ctx = args[1] if len(args) > 1 else kwargs['ctx']
            route = kwargs.get('route', args[3] if len(args) > 3 else None)
            # the route the call takes: the forward's execution plan (or one made for the call)
            route = route if route is not None else module.call_route(hidden, ctx)
            fused = route.route in ('triton', 'triton-train')
            if not fused:
                from amvim_mm.ops.backends import resolve_scan_backend
                from amvim_mm.ops.causal_conv1d import resolve_conv_backend
                cuda = hidden.is_cuda
                conv = module.path_params(0)[0]
                self.backends.add((resolve_scan_backend(cuda, module.scan_backend),
                                   resolve_conv_backend(cuda, conv.weight.shape[-1])))
        except Exception as e:   # noqa: BLE001  (a probe must not break the row)
            fused = None
            self.errors.append(f'{type(e).__name__}: {e}'.splitlines()[0][:200])
        self.decisions.append(fused)

    def summary(self) -> Dict[str, object]:
        """``path_ran`` ('fused', 'unfused', 'mixed', 'attention' for a model without a mixer,
        'unknown'), ``fused_calls`` ('k/n' mixer calls), the unfused calls' backends."""
        if not self.mixers:
            return dict(path_ran='attention')
        n = len(self.decisions)
        known = [d for d in self.decisions if d is not None]
        k = sum(bool(d) for d in known)
        out: Dict[str, object] = dict(fused_calls=f'{k}/{n}')
        if n == 0:
            out['path_ran'] = 'unknown'      # no mixer call seen
        elif len(known) < n:
            # the probe failed on some calls: the fused function's count decides, if known
            c = self.kernel_calls
            out['path_ran'] = ('unknown' if not self.counting else 'fused' if c >= n
                               else 'mixed' if c else 'unfused')
        else:
            out['path_ran'] = 'fused' if k == n else 'unfused' if k == 0 else 'mixed'
        if self.backends:
            out['scan_backend'] = ','.join(sorted({s for s, _ in self.backends}))
            out['conv_backend'] = ','.join(sorted({c for _, c in self.backends}))
        notes = []
        if self.counting and self.kernel_calls != k and len(known) == n:
            notes.append(f'the fused mixer function ran {self.kernel_calls} times, the '
                         f'decisions say {k}')
        if self.errors:
            notes.append(f'probe failed on {len(self.errors)} calls: {self.errors[0]}')
        if notes:
            out['path_note'] = '; '.join(notes)
        return out


def set_fused_mixer(model: nn.Module, value: Optional[bool]) -> int:
    """Set every mixer's ``fused`` switch (what ``fused_mixer=`` sets at build time); returns
    how many mixers there are."""
    from amvim_mm.models.vim.mixer import BiMambaMixer
    n = 0
    for m in model.modules():
        if isinstance(m, BiMambaMixer):
            m.fused = value
            n += 1
    return n
