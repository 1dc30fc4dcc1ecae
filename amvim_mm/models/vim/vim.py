"""Vim (Vision Mamba, bimamba v2, middle class token) and AMVim (asymmetric multi-scale
scanning)."""
from __future__ import annotations

from typing import List, Optional, Sequence

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS
from ..layout.scan_orders import normalize_order
from .family import VimFamilyBackbone

# embed dims / depth of the released models; d_state 16, d_conv 4, expand 2, dt_rank ceil(D/16)
VIM_ARCHS = {
    'tiny': dict(aliases=('tiny', 't'), embed_dims=192, num_layers=24, d_state=16, d_conv=4,
                 expand=2, dt_rank=12),
    'small': dict(aliases=('small', 's'), embed_dims=384, num_layers=24, d_state=16, d_conv=4,
                  expand=2, dt_rank=24),
    'base': dict(aliases=('base', 'b'), embed_dims=768, num_layers=24, d_state=16, d_conv=4,
                 expand=2, dt_rank=48),
    # a small architecture so that every code path runs on a CPU in well under a second
    'test': dict(aliases=('test', ), embed_dims=32, num_layers=4, d_state=8, d_conv=4,
                 expand=2, dt_rank=2),
}


@MODELS.register_module()
class Vim(VimFamilyBackbone):
    """Vision Mamba (Zhu et al., 2024): a forward raster path and its reverse.

    Loads the official checkpoints (``vim_t_midclstok_76p1acc.pth``...) 1:1. See
    :class:`~amvim_mm.models.vim.family.VimFamilyBackbone` for the arguments.

    Example:
        >>> from amvim_mm.registry import MODELS
        >>> m = MODELS.build(dict(type='Vim', arch='tiny', out_type='featmap',
        ...                       out_indices=(5, 11, 17, 23)))
    """

    arch_zoo = VIM_ARCHS

    def layer_paths(self, i: int) -> List[dict]:
        return [dict(order='raster'), dict(order='raster', reverse=True)]


@MODELS.register_module()
class AMVim(VimFamilyBackbone):
    """AMVim (NeurIPS 2025): Vim with an asymmetric, windowed second path ("D1-D2_D4").

    Same parameters, keys and FLOPs as :class:`Vim` (an official Vim checkpoint loads 1:1);
    only the order of one path changes. By default path 1 is the raster order (D1) and path 2 is
    the reverse of: ``window_size`` x ``window_size`` windows in row-major order, column-major
    inside each window, anchored at the top-left with partial border windows (D2_D4).

    Args:
        window_size: window size k (1 gives exactly Vim; the grid size gives D1-D4).
        windowed_path: which path (0 or 1) is windowed.
        inner: order inside a window: ``'col'`` (D4, default), ``'row'`` (D2) or ``'random'``
            (a fixed random order from ``seed``, the paper's D1-D2_rand).
        seed: seed of the random inner order.
        shift_odd_blocks: Swin-style variant: odd blocks shift the window grid cyclically by
            ``window_size // 2``.
        paths: full override, a sequence of two scan-order dicts (see ``scan_orders``), used for
            every block; the other path arguments must then stay at their defaults (an error
            otherwise).
        **kwargs: everything :class:`Vim` takes.
    """

    arch_zoo = VIM_ARCHS

    def __init__(self,
                 *args,
                 window_size: int = 3,
                 windowed_path: int = 1,
                 inner: str = 'col',
                 seed: int = 0,
                 shift_odd_blocks: bool = False,
                 paths: Optional[Sequence[dict]] = None,
                 **kwargs) -> None:
        if windowed_path not in (0, 1):
            raise ConfigError(f'AMVim: windowed_path must be 0 or 1, got {windowed_path!r}')
        if paths is not None:
            if len(paths) != 2:
                raise ConfigError(f'AMVim: paths must hold 2 scan orders, got {len(paths)}')
            changed = [k for k, v, d in (('window_size', window_size, 3),
                                         ('windowed_path', windowed_path, 1),
                                         ('inner', inner, 'col'), ('seed', seed, 0),
                                         ('shift_odd_blocks', shift_odd_blocks, False))
                       if v != d]
            if changed:
                raise ConfigError(f'AMVim: paths overrides every path argument; {changed} would '
                                  'be ignored (put them into the paths dicts)')
            paths = [dict(normalize_order(p)) for p in paths]
        self._paths = paths
        window = dict(order='window', size=window_size, inner=inner, seed=seed,
                      reverse=windowed_path == 1)
        normalize_order(window)  # validates size / inner early, with a clear message
        self._window = window
        self._windowed_path = windowed_path
        self.shift_odd_blocks = shift_odd_blocks
        super().__init__(*args, **kwargs)

    def layer_paths(self, i: int) -> List[dict]:
        if self._paths is not None:
            return [dict(p) for p in self._paths]
        window = dict(self._window)
        if self.shift_odd_blocks and i % 2 == 1:
            window['shift'] = window['size'] // 2
        raster = dict(order='raster', reverse=self._windowed_path == 0)
        return [raster, window] if self._windowed_path == 1 else [window, raster]
