"""LocalVim (LocalMamba's Vim variant): the window-scan baseline, 4 directions per layer."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS
from .vim import VIM_ARCHS
from .mixer import BiMambaMixer
from .family import VimFamilyBackbone

# The direction names of the LocalMamba paper / code, as scan orders of this package.
DIRECTIONS: Dict[str, dict] = {
    'h': dict(order='raster'),
    'h_flip': dict(order='raster', reverse=True),
    'v': dict(order='column'),
    'v_flip': dict(order='column', reverse=True),
    'w2': dict(order='window', size=2, inner='row'),
    'w2_flip': dict(order='window', size=2, inner='row', reverse=True),
    'w7': dict(order='window', size=7, inner='row'),
    'w7_flip': dict(order='window', size=7, inner='row', reverse=True),
}

# The searched direction table of the released LocalVim-T (depth 20), one row per layer.
LOCALVIM_TINY_DIRECTIONS = (
    ('h', 'v_flip', 'w7', 'w7_flip'),
    ('h_flip', 'w2_flip', 'w7', 'w7_flip'),
    ('h', 'h_flip', 'v', 'w7'),
    ('h', 'h_flip', 'v', 'v_flip'),
    ('h', 'h_flip', 'v', 'v_flip'),
    ('h', 'h_flip', 'v', 'v_flip'),
    ('h_flip', 'v', 'v_flip', 'w7'),
    ('h_flip', 'v', 'v_flip', 'w2_flip'),
    ('h', 'h_flip', 'v', 'v_flip'),
    ('h', 'h_flip', 'v', 'v_flip'),
    ('h', 'v', 'v_flip', 'w2'),
    ('h', 'v', 'v_flip', 'w2_flip'),
    ('h', 'h_flip', 'v_flip', 'w7'),
    ('h_flip', 'v', 'v_flip', 'w2'),
    ('h', 'h_flip', 'v', 'v_flip'),
    ('h', 'v', 'w2', 'w2_flip'),
    ('v', 'v_flip', 'w2', 'w7'),
    ('h', 'h_flip', 'v', 'w2'),
    ('h', 'h_flip', 'w2_flip', 'w7'),
    ('v', 'v_flip', 'w2', 'w2_flip'),
)

LOCALVIM_ARCHS = {
    'tiny': dict(VIM_ARCHS['tiny'], num_layers=20),
    'small': dict(VIM_ARCHS['small'], num_layers=20),
    'test': dict(VIM_ARCHS['test'], num_layers=4),
}
TEST_DIRECTIONS = (('h', 'v_flip', 'w2', 'w7_flip'), ('h_flip', 'v', 'w2_flip', 'w7'),
                   ('h', 'h_flip', 'v', 'v_flip'), ('w2', 'w2_flip', 'w7', 'w7_flip'))


class ChannelAttention(nn.Module):
    """LocalMamba's gate: LayerNorm -> mean over tokens -> Linear -> GELU -> Linear -> sigmoid."""

    def __init__(self, channels: int, ratio: float = 0.125) -> None:
        super().__init__()
        reduced = int(channels * ratio)
        self.norm = nn.LayerNorm(channels)
        self.global_reduce = nn.Linear(channels, reduced)
        self.act_fn = nn.GELU()
        self.channel_select = nn.Linear(reduced, channels)

    def forward(self, x: torch.Tensor, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``keep`` (B, L): average over the kept tokens only (a masked training forward)."""
        if keep is None:
            g = self.norm(x).mean(1, keepdim=True)
        else:
            w = keep.unsqueeze(-1).to(x.dtype)
            g = (self.norm(x) * w).sum(1, keepdim=True) / w.sum(1, keepdim=True)
        g = self.channel_select(self.act_fn(self.global_reduce(g)))
        return x * torch.sigmoid(g)


class LocalMambaMixer(BiMambaMixer):
    """Per-direction conv1d/x_proj/dt_proj/A/D (``conv1d_{k}``, ``A_log_{k}``...), shared
    in/out projections and channel-attention gate, **summed** path outputs."""

    supports_fused = False  # paths are merged by channel attention, not averaged

    def __init__(self, embed_dims: int, num_paths: int = 4, **kwargs) -> None:
        super().__init__(embed_dims, suffixes=tuple(f'_{k}' for k in range(num_paths)),
                         **kwargs)
        self.attn = ChannelAttention(self.d_inner)

    def path_param_names(self, k: int) -> Dict[str, str]:
        """LocalMamba's names: the suffix after the whole name (``A_log_0``, not ``A_0_log``)."""
        s = self.suffixes[k]
        return dict(conv1d=f'conv1d{s}', x_proj=f'x_proj{s}', dt_proj=f'dt_proj{s}',
                    A_log=f'A_log{s}', D=f'D{s}')

    def flops(self, L: int, convention: str = 'mamba') -> int:
        """The Vim mixer's FLOPs and the channel attention of each path."""
        red = self.attn.global_reduce.out_features
        return super().flops(L, convention) + self.num_paths * 2 * self.d_inner * red

    def merge_paths(self, ys: List[torch.Tensor], keep: Optional[torch.Tensor] = None
                    ) -> torch.Tensor:
        """Gate each (B, E, L) path output by the shared channel attention (pooled over the
        kept tokens when ``keep`` is given), then sum."""
        out = None
        for y in ys:
            g = self.attn(y.transpose(1, 2), keep).transpose(1, 2)
            out = g if out is None else out + g
        return out


@MODELS.register_module()
class LocalVim(VimFamilyBackbone):
    """LocalVim (Huang et al., LocalMamba, 2024), middle class token variant.

    Every layer scans in the 4 directions of its row of ``directions`` (names from
    ``h, h_flip, v, v_flip, w2, w2_flip, w7, w7_flip``: raster, column-major, KxK windows in
    row-major order with row-major order inside, ``_flip`` = reversed). The default is the
    released tiny table (depth 20).

    **Decision**: windows of a grid that is not a multiple of K are partial (the reference pads
    the grid with zeros to a multiple of K); the two agree for 14x14 grids with K = 2 or 7.

    Args:
        directions: one sequence of direction names per layer (the same number per layer).
        **kwargs: everything :class:`Vim` takes.
    """

    arch_zoo = LOCALVIM_ARCHS

    def __init__(self, *args, directions: Optional[Sequence[Sequence[str]]] = None,
                 **kwargs) -> None:
        self._directions = directions
        super().__init__(*args, **kwargs)

    def _table(self) -> Sequence[Sequence[str]]:
        if self._directions is not None:
            table = self._directions
        elif self.num_layers == len(LOCALVIM_TINY_DIRECTIONS):
            table = LOCALVIM_TINY_DIRECTIONS
        elif self.num_layers == len(TEST_DIRECTIONS):
            table = TEST_DIRECTIONS
        else:
            raise ConfigError(f'LocalVim: no default direction table for {self.num_layers} '
                              'layers; pass directions=[[4 names] per layer]')
        if len(table) != self.num_layers:
            raise ConfigError(f'LocalVim: directions has {len(table)} rows for '
                              f'{self.num_layers} layers')
        widths = {len(row) for row in table}
        if len(widths) != 1:
            raise ConfigError('LocalVim: every row of directions needs the same number of '
                              f'directions, got {sorted(widths)}')
        for row in table:
            for d in row:
                if d not in DIRECTIONS:
                    raise ConfigError(f'LocalVim: unknown direction {d!r}; choose from '
                                      f'{", ".join(DIRECTIONS)}')
        return table

    def layer_paths(self, i: int) -> List[dict]:
        return [dict(DIRECTIONS[d]) for d in self._table()[i]]

    def build_mixer(self, i, embed_dims, mixer_kwargs, scan_backend):
        return LocalMambaMixer(embed_dims, num_paths=len(self._table()[i]),
                               scan_backend=scan_backend, **mixer_kwargs)
