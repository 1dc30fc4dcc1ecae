"""Vision-LSTM (ViL, Alkin et al., ICLR 2025; NX-AI/vision-lstm): ``ViL`` (v2 and v1) and
``AMViL`` (the flipped traversal replaced by AMVim's windowed scan order).

Data flow::

    image -> 16x16 s16 patch embedding (bottom/right zero padding to a multiple of 16)
          -> + position embedding (1, h, w, D) (bicubic-resized to the input's grid)
          -> v2: blocks[i] = pair: rowwise_from_top_left, then rowwise_from_bot_right
             v1: blocks[i] = one block, traversing from the top left (even i) or from the
                 bottom right (odd i)
          -> outputs: 'featmap' the blocks[i] outputs as maps (no norm, as the official
             blocks[i]; ``tap='mixer'``: the block's branch before the residual add instead);
             'pooled' the official classifier input
             (v2: legacy_norm(cat(norm(x)[first], norm(x)[last])); v1: norm(mean of
             legacy_norm(x) at the first and the last token)); 'avg_featmap' the same norms
             around the mean over all tokens (D channels for both versions)

Parameter names equal the official ones (``patch_embed.proj``, ``pos_embed.embed``,
``blocks.{i}.rowwise_from_top_left.*`` / ``.rowwise_from_bot_right.*`` (v2), ``blocks.{i}.*``
(v1), ``norm``, ``legacy_norm``), so a released ``.th`` file loads 1:1 (``head.*`` dropped).
The layer, the traversals as scan orders and the conv on the grid: :mod:`.layer`.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import MMLogger

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS
from ..execution import BlockPlan, ExecutionPlan, plan_vil
from ..heads.token_grid import token_grid
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import normalize_order
from ..reduction import restore_grid
from ..skeleton.arch import resolve_arch
from ..skeleton.args import is_int, positive_int, rate, resolve_out_indices
from ..skeleton.base import MambaBackbone
from ..skeleton.checkpoint_guard import pretrained_init_cfg
from ..skeleton.layer_decay import teach_upstream_layer_decay
from .layer import ResidualLayerNorm, ViLBlock, ViLBlockPair

__all__ = ['ViL', 'AMViL', 'VIL_ARCHS']

#: the released models (hubconf); v2 ``num_layers`` counts block pairs
VIL_ARCHS = {
    'tiny': dict(version=2, embed_dims=192, num_layers=12),
    'small': dict(version=2, embed_dims=384, num_layers=12),
    'base': dict(version=2, embed_dims=768, num_layers=12),
    'tiny-v1': dict(version=1, embed_dims=192, num_layers=24),
    'tinyplus-v1': dict(version=1, embed_dims=192, num_layers=29),
    'small-v1': dict(version=1, embed_dims=384, num_layers=24),
    'smallplus-v1': dict(version=1, embed_dims=384, num_layers=26),
    'base-v1': dict(version=1, embed_dims=768, num_layers=24),
    # a small architecture so that every code path runs on a CPU in well under a second
    'test': dict(version=2, embed_dims=32, num_layers=4),
}
REQUIRED_ARCH_KEYS = frozenset({'embed_dims', 'num_layers'})
ARCH_DEFAULTS = dict(version=2, patch_size=16, expansion=2, qkv_block_size=4,
                     conv_kernel_size=None)
#: per version: conv kind and default kernel, biases of the projections and block norms
VERSIONS = {2: dict(conv_kind='2d', kernel=3, bias=True),
            1: dict(conv_kind='causal1d', kernel=4, bias=False)}
OUT_TYPES = ('featmap', 'pooled', 'avg_featmap', 'tokens')
#: what block ``i``'s 'featmap' output is made of (see ``tap`` in :class:`ViL`)
TAPS = ('stream', 'mixer')
FLOPS_CONVENTIONS = {
    'mamba': ('MACs of the linear/conv layers (patch embedding, projections, headwise q/k/v, '
              'gates, convs) + the mLSTM parallel form 2*L^2*E per traversal (QK^T and CV, '
              'the full L x L matrices); norms, activations and gate matrices excluded'),
    'mmengine': ("mmengine's FlopAnalyzer traced on the backbone"),
}


def _arch_settings(arch: Union[str, dict]) -> Dict[str, object]:
    cfg = resolve_arch('ViL', VIL_ARCHS, arch, REQUIRED_ARCH_KEYS, ARCH_DEFAULTS)
    if cfg['version'] not in VERSIONS or isinstance(cfg['version'], bool):
        raise ConfigError(f'ViL arch: version must be 1 or 2, got {cfg["version"]!r}')
    if cfg['conv_kernel_size'] is None:
        cfg['conv_kernel_size'] = VERSIONS[cfg['version']]['kernel']
    for k in ('embed_dims', 'num_layers', 'patch_size', 'expansion', 'qkv_block_size',
              'conv_kernel_size'):
        if not is_int(cfg[k]) or cfg[k] < 1:
            raise ConfigError(f'ViL arch: {k} must be a positive int, got {cfg[k]!r}')
    if cfg['embed_dims'] * cfg['expansion'] % cfg['qkv_block_size']:
        raise ConfigError(f'ViL arch: embed_dims * expansion ({cfg["embed_dims"]} * '
                          f'{cfg["expansion"]}) must be a multiple of qkv_block_size '
                          f'({cfg["qkv_block_size"]})')
    if cfg['version'] == 2 and cfg['conv_kernel_size'] % 2 == 0:
        raise ConfigError(f'ViL arch: the v2 conv2d kernel must be odd (same-size output), got '
                          f'{cfg["conv_kernel_size"]}')
    return cfg


class PatchEmbed(nn.Module):
    """``proj``: a P x P stride-P conv (official ``VitPatchEmbed``); inputs are zero-padded
    bottom/right to a multiple of P (the official code asserts divisibility)."""

    def __init__(self, in_channels: int, dim: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch_size, patch_size)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        P = self.proj.stride[0]
        ph, pw = -x.shape[-2] % P, -x.shape[-1] % P
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:])


class PosEmbed2d(nn.Module):
    """``embed`` (1, h, w, D), bicubic-resized to another grid (official ``VitPosEmbed2d``)."""

    def __init__(self, grid: Tuple[int, int], dim: int) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.zeros(1, *grid, dim))

    @staticmethod
    def resize(embed: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
        """(1, h, w, D) -> (1, H, W, D) as the official ``interpolate_sincos``."""
        if tuple(embed.shape[1:3]) == tuple(grid):
            return embed
        out = F.interpolate(embed.permute(0, 3, 1, 2), size=tuple(grid), mode='bicubic')
        return out.permute(0, 2, 3, 1)

    def forward(self, grid: Tuple[int, int]) -> torch.Tensor:
        """The (1, H * W, D) embedding of an H x W grid."""
        return self.resize(self.embed, grid).flatten(1, 2)


@MODELS.register_module()
class ViL(MambaBackbone):
    """Vision-LSTM v2 (``tiny``, ``small``, ``base``) and v1 (``*-v1``).

    Args:
        arch: a name of :data:`VIL_ARCHS` or a dict with ``embed_dims`` and ``num_layers``
            (optional ``version`` (2), ``patch_size``, ``expansion``, ``qkv_block_size``,
            ``conv_kernel_size``). v2: ``num_layers`` block pairs, conv2d k3, biases,
            bilateral concat pooling; v1: alternating blocks, causal conv1d k4, no biases in
            projections and norms, bilateral mean pooling.
        img_size: the position embedding's image size; any input size works (resized).
        out_indices: blocks whose outputs are returned (v2: pairs; negatives from the end).
        out_type: ``'featmap'`` (B, D, H/16, W/16) the raw block outputs; ``'pooled'`` the
            official classifier input (v2 (B, 2D), v1 (B, D)); ``'avg_featmap'`` (B, D) the
            mean over tokens between the same norms. The last two with ``out_indices=-1``.
            ``'tokens'``: the ``'featmap'`` output as the kept tokens and their restore map
            (:class:`~amvim_mm.models.heads.TokenGrid`, for the per-token heads).
        tap: which tensor of block ``i`` is its ``'featmap'`` output. ``'stream'`` (default):
            the block's output, the residual stream after it (what the official segmentation
            code's ``block_extractor`` hooks on ``blocks[i]`` take). ``'mixer'``: the block's
            branch before the residual add, ``layer(norm(x))`` without stochastic depth (v2:
            the pair's second sub-block, the traversal from the bottom right, whose add ends the
            pair; a token a learned reducer's masked forward dropped keeps its stream, as a
            pruned cell's frozen feature does at inference). Only with ``out_type='featmap'``
            (the classifier inputs are norms of the stream).
        drop_path_rate / drop_path_decay: stochastic depth; the official schedule is the same
            rate for every block (both sub-blocks of a pair), ``drop_path_decay=True``
            ``linspace(0, rate, num_layers)``.
        layer_depth_per_pair: the unit of layer-wise lr decay (:meth:`get_layer_depth`). True
            (default): one depth per pair of traversals, the official rule for both versions
            (v2: a block is a pair; v1: blocks ``2k`` and ``2k + 1`` share a depth, the official
            ``layerwise_lr_decay`` with ``group_two_blocks: true`` of every ViL segmentation
            recipe); False: one depth per v1 block (no effect on v2).
        frozen_stages: -1 none; ``k >= 0`` freezes the embeddings and the first ``k`` blocks.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)``: an official file (raw or under
            ``state_dict``) loads strictly; ``head.*`` is dropped; a position embedding of
            another grid is resized (bicubic, as the official ``load_state_dict``).
    """

    arch_zoo = VIL_ARCHS
    classifier_out_types = ('pooled', 'avg_featmap')
    supports_learned_reduction = True
    flops_conventions = FLOPS_CONVENTIONS
    default_flops_convention = 'mamba'

    @property
    def min_input_size(self) -> int:
        return self.patch_size

    def input_dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'featmap',
                 drop_path_rate: float = 0.,
                 drop_path_decay: bool = False,
                 tap: str = 'stream',
                 layer_depth_per_pair: bool = True,
                 frozen_stages: int = -1,
                 token_reduction: Optional[dict] = None,
                 cuda_graph: Optional[bool] = None,
                 init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None) -> None:
        name = type(self).__name__
        super().__init__(init_cfg=pretrained_init_cfg(name, pretrained, copy.deepcopy(init_cfg)))
        teach_upstream_layer_decay()
        self.arch_settings = cfg = _arch_settings(arch)
        self.version = cfg['version']
        self.embed_dims = D = cfg['embed_dims']
        self.num_layers = depth = cfg['num_layers']
        self.patch_size = P = cfg['patch_size']
        self._check_args(name, out_type, img_size, in_channels, frozen_stages, out_indices)
        if not isinstance(drop_path_decay, bool):
            raise ConfigError(f'{name}: drop_path_decay must be a bool, got {drop_path_decay!r}')
        if not isinstance(tap, str) or tap not in TAPS:
            raise ConfigError(f'{name}: tap must be one of {TAPS}, got {tap!r}')
        if tap != 'stream' and out_type != 'featmap':
            raise ConfigError(f'{name}: tap={tap!r} needs out_type=\'featmap\' (the classifier '
                              f'inputs are norms of the stream), got out_type={out_type!r}')
        if not isinstance(layer_depth_per_pair, bool):
            raise ConfigError(f'{name}: layer_depth_per_pair must be a bool, got '
                              f'{layer_depth_per_pair!r}')
        self.tap, self.layer_depth_per_pair = tap, layer_depth_per_pair
        self._branch: Optional[torch.Tensor] = None    # tap='mixer': the last block's branch
        drop_path_rate = rate(name, 'drop_path_rate', drop_path_rate)
        self.init_forward(cuda_graph)

        self.patch_embed = PatchEmbed(self.in_channels, D, P)
        self.patch_resolution = (math.ceil(self.img_size[0] / P), math.ceil(self.img_size[1] / P))
        self.pos_embed = PosEmbed2d(self.patch_resolution, D)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)] \
            if drop_path_decay else [drop_path_rate] * depth
        self.blocks = nn.ModuleList(self._make_block(i, dpr[i]) for i in range(depth))
        if self.version == 2:
            self.norm = ResidualLayerNorm(D, bias=True, eps=1e-6)
            self.legacy_norm = nn.LayerNorm(2 * D)       # bilateral concat: 2D channels
        else:
            self.legacy_norm = ResidualLayerNorm(D, bias=False)
            self.norm = nn.LayerNorm(D, eps=1e-6)
        self.frozen_stages = frozen_stages
        self.finish_init(token_reduction, key_hook=self._official_keys)

    def _check_args(self, name, out_type, img_size, in_channels, frozen_stages,
                    out_indices) -> None:
        if out_type not in OUT_TYPES:
            raise ConfigError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        self.out_type = out_type
        size = (img_size, img_size) if is_int(img_size) else img_size
        if not isinstance(size, (tuple, list)) or len(size) != 2 or \
                not all(is_int(v) and v >= self.patch_size for v in size):
            raise ConfigError(f'{name}: img_size must be an int or a pair (H, W) of ints >= '
                              f'{self.patch_size} (the patch size), got {img_size!r}')
        self.img_size = (int(size[0]), int(size[1]))
        self.in_channels = positive_int(name, 'in_channels', in_channels)
        if not is_int(frozen_stages) or frozen_stages < -1:
            raise ConfigError(f'{name}: frozen_stages must be an int >= -1, got '
                              f'{frozen_stages!r}')
        self.out_indices = resolve_out_indices(name, out_indices, self.num_layers, 'blocks')
        if out_type != 'featmap' and self.out_indices != [self.num_layers - 1]:
            raise ConfigError(f'{name}: out_type={out_type!r} is the classifier input and needs '
                              f'out_indices=-1, got {out_indices!r}')

    # ----------------------------------------------------------------- traversals
    def block_paths(self, i: int) -> List[dict]:
        """The scan orders of block ``i``'s traversals (v2: the pair's two sub-blocks; v1:
        the block's one): from the top left and from the bottom right."""
        top_left, bot_right = dict(order='raster'), dict(order='raster', reverse=True)
        if self.version == 2:
            return [top_left, bot_right]
        return [top_left if i % 2 == 0 else bot_right]

    def _make_block(self, i: int, drop_path: float) -> nn.Module:
        cfg, D = self.arch_settings, self.embed_dims
        ver = VERSIONS[self.version]
        kw = dict(drop_path=drop_path, norm_bias=ver['bias'], conv_kind=ver['conv_kind'],
                  conv_kernel_size=cfg['conv_kernel_size'], proj_bias=ver['bias'],
                  expansion=cfg['expansion'], qkv_block_size=cfg['qkv_block_size'])
        paths = [dict(normalize_order(p)) for p in self.block_paths(i)]
        if self.version == 2:
            return ViLBlockPair(ViLBlock(D, paths[0], False, **kw),
                                ViLBlock(D, paths[1], True, **kw))
        return ViLBlock(D, paths[0], False, **kw)

    def traversals(self) -> List[ViLBlock]:
        """Every (sub-)block in execution order."""
        if self.version == 1:
            return list(self.blocks)
        return [b for p in self.blocks for b in (p.rowwise_from_top_left,
                                                 p.rowwise_from_bot_right)]

    def stages(self):
        return (self.blocks, )

    # ----------------------------------------------------------------- init and loading
    def reset_weights(self) -> None:
        """The official initialisation: patch projection xavier-uniform (as a linear map) with
        zero bias, position embedding trunc-normal 0.02, the layers as the official
        ``reset_parameters``, norms 1 / 0."""
        w = self.patch_embed.proj.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch_embed.proj.bias)
        nn.init.trunc_normal_(self.pos_embed.embed, std=.02)
        for b in self.traversals():
            b.layer.reset_parameters()
            b.norm.reset_parameters()
        self.norm.reset_parameters()
        self.legacy_norm.reset_parameters()

    def init_weights(self) -> None:
        self.reset_weights()
        if not self.load_pretrained():
            super().init_weights()

    def _official_keys(self, state_dict, prefix, *args, **kwargs) -> None:
        """Load pre-hook: drop a classifier head (``head.*``); resize a position embedding of
        another grid (bicubic, as the official ``load_state_dict``)."""
        for k in [k for k in state_dict if k.startswith(prefix + 'head.')]:
            del state_dict[k]
        name = prefix + 'pos_embed.embed'
        own = self.pos_embed.embed
        if name in state_dict and state_dict[name].shape != own.shape:
            ckpt = state_dict[name]
            if ckpt.dim() == 4 and ckpt.shape[0] == 1 and ckpt.shape[-1] == own.shape[-1]:
                MMLogger.get_current_instance().info(
                    f'Resize the pos_embed shape from {tuple(ckpt.shape)} to '
                    f'{tuple(own.shape)}.')
                state_dict[name] = PosEmbed2d.resize(ckpt, own.shape[1:3])

    # ----------------------------------------------------------------- training helpers
    def frozen_parts(self) -> list:
        if self.frozen_stages < 0:
            return []
        return [self.patch_embed, self.pos_embed] + \
            list(self.blocks[:min(self.frozen_stages, self.num_layers)])

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """``(layer_depth, n)``: embeddings 0, block ``i`` ``i + 1``, the norms after the
        blocks the last (``n - 1``, the base lr), ``n = num_layers + 2``; v1 with
        ``layer_depth_per_pair`` (default): block ``i`` at ``i // 2 + 1`` of
        ``n = ceil(num_layers / 2) + 2``, the official rule (``group_two_blocks``: the pair
        ``k`` gets ``rate ** (n - 2 - k)``, the patch and position embeddings ``rate **
        (n - 1)``)."""
        depth, n = self.plain_layer_depth(param_name, prefix, ('patch_embed', 'pos_embed'),
                                          'blocks.')
        if self.version == 2 or not self.layer_depth_per_pair:
            return depth, n
        pairs = math.ceil(self.num_layers / 2) + 2
        if depth == 0 or depth == n - 1:
            return (0 if depth == 0 else pairs - 1), pairs
        return (depth - 1) // 2 + 1, pairs

    # ----------------------------------------------------------------- forward
    def _last_traversal(self, block: nn.Module) -> ViLBlock:
        """The (sub-)block whose residual add ends ``block`` (v2: the second of the pair)."""
        return block if self.version == 1 else block.rowwise_from_bot_right

    def _run_tapped(self, block: nn.Module, hidden: torch.Tensor, ctx: ScanContext,
                    keep: Optional[torch.Tensor], route: Optional[BlockPlan] = None
                    ) -> torch.Tensor:
        """``block``'s own forward, keeping its branch (``tap='mixer'``): the last
        traversal's layer output, caught by a forward hook that lives for this one call (so
        the block's code and numbers are those of ``tap='stream'``; nothing stays registered
        that would keep a forward out of a CUDA graph)."""
        caught: List[torch.Tensor] = []
        handle = self._last_traversal(block).layer.register_forward_hook(
            lambda module, args, out: caught.append(out[0]))
        try:
            out = block(hidden, ctx, route=route) if keep is None else \
                block(hidden, ctx, keep=keep)
        finally:
            handle.remove()
        self._branch = caught[-1]
        return out

    def call_block(self, block, hidden, residual, ctx, merge, route):
        if self.tap == 'stream':
            return block(hidden, ctx, route=route), None
        return self._run_tapped(block, hidden, ctx, None, route), None

    def call_block_masked(self, block, hidden, residual, ctx, keep):
        if self.tap == 'stream':
            return block(hidden, ctx, keep=keep), None
        return self._run_tapped(block, hidden, ctx, keep), None

    def run_stages(self, x: torch.Tensor, masked: bool):
        try:
            return super().run_stages(x, masked)
        finally:
            self._branch = None     # no tensor of this forward stays on the module

    def reduction_domain(self) -> Tuple[int, int]:
        return self.patch_resolution[0] * self.patch_resolution[1], self.num_layers

    def reduction_grid(self, H: int, W: int) -> Tuple[int, int]:
        """The token grid of an H x W image (inputs padded up to the patch size)."""
        P = self.patch_embed.proj.stride[0]
        return -(-H // P), -(-W // P)

    def cell_head_dim(self) -> int:
        """The mLSTM cell's head dims (q / k and v alike)."""
        cell = self.traversals()[0].layer.mlstm_cell
        return cell.dim // cell.num_heads

    def execution_plan(self, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
        return plan_vil(self, x, fused)

    def embed(self, x: torch.Tensor, plan) -> Tuple[torch.Tensor, ScanContext]:
        x, grid = self.patch_embed(x)
        x = x + self.pos_embed(grid).to(x.dtype)
        return x, ScanContext(grid, cls_index=NO_CLS, device=x.device)

    def _pool(self, x: torch.Tensor, w: Optional[torch.Tensor]) -> torch.Tensor:
        """The classifier input of (B, L, D) tokens in token order (``w``: (B, L) weights of
        the mean for 'avg_featmap', None for the plain mean)."""
        if self.out_type == 'pooled':
            # two slices, not x[:, [0, -1]]: a list index is a host tensor copied to the
            # device at every call, which a CUDA-graph capture refuses
            ends = torch.stack((x[:, 0], x[:, -1]), dim=1)
            if self.version == 2:
                return self.legacy_norm(self.norm(ends).flatten(1))
            return self.norm(self.legacy_norm(ends).mean(1))
        t = self.norm(x) if self.version == 2 else self.legacy_norm(x)
        if w is None:
            t = t.mean(1)
        else:
            w = w.to(t.dtype)
            t = (t * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)
        return t if self.version == 2 else self.norm(t)

    def block_output(self, i: int, x: torch.Tensor, residual, ctx: ScanContext,
                     keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Block ``i``'s output: a map of the full grid (a reduced sequence restored first:
        merged tokens at all their cells, pruned cells their last feature), or the classifier
        input ('pooled': the first and last cell of the restored grid; 'avg_featmap': the
        size-weighted mean of the present tokens, the kept ones in the masked forward).
        ``tap='mixer'``: the block's branch in place of its output (a token the masked forward
        dropped keeps its stream)."""
        if self.tap == 'mixer':
            branch, self._branch = self._branch, None
            x = branch if keep is None else torch.where(keep.bool().unsqueeze(-1), branch, x)
        if self.out_type == 'avg_featmap':
            w = keep if keep is not None else (ctx.size if ctx.reduced else None)
            return self._pool(x, w)
        if self.out_type == 'tokens':     # the carriers and their restore map (heads/)
            return token_grid(ctx, x)
        if ctx.reduced:
            x = restore_grid(ctx, x)
        if self.out_type == 'pooled':
            return self._pool(x, None)
        B, L, D = x.shape
        return x.transpose(1, 2).reshape(B, D, *ctx.grid).contiguous()

    # ----------------------------------------------------------------- FLOPs
    def flops(self, input_shape: Tuple[int, int], reducer, num_classes: int, convention: str,
              measure: Callable[[], float]) -> Dict[str, object]:
        """FLOPs (MACs) for one (H, W) image with ``reducer`` (see
        :func:`amvim_mm.analysis.flops.backbone_flops`)."""
        depth, D, P = self.num_layers, self.embed_dims, self.patch_size
        M = math.ceil(input_shape[0] / P) * math.ceil(input_shape[1] / P)
        removals, counts, realised = [0] * depth, [M] * depth, 0.0
        if reducer is not None:
            removals, counts, realised = reducer.token_plan(M, depth)
        head = (2 * D if self.version == 2 else D) * num_classes
        if convention == 'mmengine':
            f = measure() + head
        else:
            f = M * self.in_channels * P * P * D + head
            f += sum(block.flops(int(L)) for block, L in zip(self.blocks, counts, strict=True))
            if hasattr(reducer, 'extra_flops'):
                f += reducer.extra_flops(M, depth)
        return dict(gflops=f / 1e9, tokens=counts, removals=removals, realised_ratio=realised,
                    convention=self.flops_conventions[convention])


@MODELS.register_module()
class AMViL(ViL):
    """ViL whose flipped traversal follows AMVim's windowed scan order (the AMVim authors'
    proposal): v2 every ``rowwise_from_bot_right`` sub-block, v1 every block traversing from
    the bottom right (odd ``i``, the even-numbered blocks counted from 1). Same parameters and
    keys as :class:`ViL` (a ViL file loads 1:1).

    By default the flipped traversal becomes the reverse of ``window_size`` x ``window_size``
    windows in row-major order, column-major inside (AMVim's D2_D4; ``window_size=1`` is
    exactly ViL). **Decision**: in the windowed v2 sub-block the conv2d still sees the patch
    grid with the kernel rotated by 180 degrees (the neighbourhoods the ViL weights were
    trained on); only the mLSTM's traversal changes.

    Args:
        window_size, inner, seed: the window order (see :class:`~.vim.AMVim`).
        windowed_path: 1 (default) windows the bottom-right traversal (reversed window
            order); 0 windows the top-left one (forward window order) instead.
        shift_odd_blocks: odd windowed blocks (v2: pair ``i`` odd; v1: the
            ``i // 2``-th windowed block odd) shift the window grid by ``window_size // 2``.
        **kwargs: everything :class:`ViL` takes.
    """

    def __init__(self, *args, window_size: int = 3, windowed_path: int = 1, inner: str = 'col',
                 seed: int = 0, shift_odd_blocks: bool = False, **kwargs) -> None:
        if windowed_path not in (0, 1) or isinstance(windowed_path, bool):
            raise ConfigError(f'AMViL: windowed_path must be 0 or 1, got {windowed_path!r}')
        if not isinstance(shift_odd_blocks, bool):
            raise ConfigError(f'AMViL: shift_odd_blocks must be a bool, got '
                              f'{shift_odd_blocks!r}')
        window = dict(order='window', size=window_size, inner=inner, seed=seed,
                      reverse=windowed_path == 1)
        normalize_order(window)   # validates size / inner early, with a clear message
        self._window, self._windowed_path = window, windowed_path
        self.shift_odd_blocks = shift_odd_blocks
        super().__init__(*args, **kwargs)

    def block_paths(self, i: int) -> List[dict]:
        paths = super().block_paths(i)
        slot = self._windowed_path if self.version == 2 else 0
        flipped = bool(paths[slot].get('reverse', False))
        if flipped != (self._windowed_path == 1):    # v1: a block of the other direction
            return paths
        window = dict(self._window)
        nth = i if self.version == 2 else i // 2
        if self.shift_odd_blocks and nth % 2 == 1:
            window['shift'] = window['size'] // 2
        paths[slot] = window
        return paths
