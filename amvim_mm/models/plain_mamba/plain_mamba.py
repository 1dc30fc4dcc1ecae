"""PlainMamba (Yang et al., BMVC 2024): a plain (non-hierarchical) Mamba with a convolutional
stem and a continuous ("snake") 2D scan in four directions.

Data flow::

    image -> conv stem (7x7 s2 + BN + ReLU, extra 3x3 convs) -> 8x8 s8 projection (stride 16)
          -> + position embedding (bicubic-resized to the input's grid)
          -> layers: x = x + drop_path(PlainMamba2D(LN(x)))   [L1: then a dw3x3 + BN + GELU
                     block after layer 0, no residual]
          -> ln1 after the last layer; ``norm_layer{i}`` on the other outputs

Parameter names equal the official keys (``patch_embed.stem/convs/projection``, ``pos_embed``,
``layers.{i}.{norm,mamba,dw}``, ``ln1``), so the released files load 1:1 (``backbone.``
stripped, ``head.*`` and EMA buffers dropped).

The mixer and its two quirks: :mod:`.mixer`; the snake directions:
:mod:`.scan`; the layer and the stem: :mod:`.block`.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from amvim_mm.errors import ConfigError
from amvim_mm.ops.backends import check_backend_usable
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS
from ..execution import ExecutionPlan, plan_plain_mamba
from ..layout.scan_context import ScanContext
from ..reduction import restore_grid
from ..skeleton.arch import resolve_arch
from ..skeleton.args import is_int, positive_int, rate, resolve_out_indices
from ..skeleton.base import MambaBackbone
from ..skeleton.checkpoint_guard import pretrained_init_cfg
from ..skeleton.embed import resize_pos_embed
from ..skeleton.layer_decay import teach_upstream_layer_decay
from .block import ConvPatchEmbed, PlainMambaLayer
from .mixer import PlainMamba2D

__all__ = ['PlainMamba', 'PLAIN_MAMBA_ARCHS', 'L3_TOP_BUDGET']

#: the official arch zoo (``PlainMamba.arch_zoo``); d_state 16, expand 2, dt_rank ceil(C/16)
PLAIN_MAMBA_ARCHS = {
    'l1': dict(aliases=('l1', 'L1'), embed_dims=192, num_layers=24, num_convs_patch_embed=1,
               layers_with_dwconv=(0, )),
    'l2': dict(aliases=('l2', 'L2'), embed_dims=384, num_layers=24, num_convs_patch_embed=2,
               layers_with_dwconv=()),
    'l3': dict(aliases=('l3', 'L3'), embed_dims=448, num_layers=36, num_convs_patch_embed=2,
               layers_with_dwconv=()),
    # a small architecture so that every code path runs on a CPU in well under a second
    'test': dict(embed_dims=32, num_layers=4, num_convs_patch_embed=1, layers_with_dwconv=(0, ),
                 d_state=8),
}
REQUIRED_ARCH_KEYS = frozenset({'embed_dims', 'num_layers'})
ARCH_DEFAULTS = dict(patch_size=16, num_convs_patch_embed=2, layers_with_dwconv=(), d_state=16,
                     expand=2, dt_rank=None, d_conv=7)
OUT_TYPES = ('featmap', 'avg_featmap')
#: the FLOPs conventions of :meth:`PlainMamba.flops` (see
#: :mod:`amvim_mm.analysis.plainmamba_flops`)
FLOPS_CONVENTIONS = {
    'official': ('fvcore MACs of convs/linears, 5*numel per LayerNorm, 2*numel per BatchNorm, '
                 'scan 9*L*E*N + L*E per direction'),
    'mamba': ('MACs of linear/conv layers + selective scan 9*L*E*N per direction (mamba-ssm '
              'convention); norms and activations excluded'),
    'mmengine': ("mmengine's FlopAnalyzer (the libraries' get_flops tools) traced on the "
                 'backbone; the selective scan and element-wise ops uncounted'),
}
#: ToP-ViM's PlainMamba-L3 budget: 41.6 % fewer FLOPs than the 14.454 G of L3 at 224, i.e.
#: 8.44 G. Keeping ``rho`` of the tokens after layers 9, 18 and 27 (counted from 1) costs about
#: 1.403 + 0.3624 * 9 * (1 + rho + rho^2 + rho^3) G; with the schedule's ``int()`` rounding
#: rho = 0.598 keeps 196 -> 117 -> 69 -> 41 tokens: 8.447 G (41.6 % fewer; 0.6 gives 8.48 G).
#: Use as ``dict(type='ToP', **L3_TOP_BUDGET)`` (or EViT, the same schedule).
L3_TOP_BUDGET = dict(keep_rate=0.598, locations=(8, 17, 26))


def _arch_settings(arch: Union[str, dict]) -> Dict[str, object]:
    cfg = resolve_arch('PlainMamba', PLAIN_MAMBA_ARCHS, arch, REQUIRED_ARCH_KEYS, ARCH_DEFAULTS)
    for k in ('embed_dims', 'num_layers', 'd_state', 'expand', 'd_conv'):
        if not is_int(cfg[k]) or cfg[k] < 1:
            raise ConfigError(f'PlainMamba arch: {k} must be a positive int, got {cfg[k]!r}')
    if not is_int(cfg['patch_size']) or cfg['patch_size'] < 2 or cfg['patch_size'] % 2:
        raise ConfigError(f'PlainMamba arch: patch_size must be an even int >= 2 (the stem '
                          f'halves, the projection does the rest), got {cfg["patch_size"]!r}')
    if cfg['d_conv'] % 2 == 0:
        raise ConfigError(f'PlainMamba arch: d_conv must be odd, got {cfg["d_conv"]!r}')
    if not is_int(cfg['num_convs_patch_embed']) or cfg['num_convs_patch_embed'] < 0:
        raise ConfigError('PlainMamba arch: num_convs_patch_embed must be an int >= 0, got '
                          f'{cfg["num_convs_patch_embed"]!r}')
    dw = cfg['layers_with_dwconv']
    if not isinstance(dw, (list, tuple)) or not all(
            is_int(i) and 0 <= i < cfg['num_layers'] for i in dw):
        raise ConfigError(f'PlainMamba arch: layers_with_dwconv must be layer indices, got '
                          f'{dw!r}')
    cfg['layers_with_dwconv'] = tuple(int(i) for i in dw)
    if cfg['dt_rank'] is None:
        cfg['dt_rank'] = math.ceil(cfg['embed_dims'] / 16)
    elif not is_int(cfg['dt_rank']) or cfg['dt_rank'] < 1:
        raise ConfigError(f'PlainMamba arch: dt_rank must be a positive int, got '
                          f'{cfg["dt_rank"]!r}')
    return cfg


@MODELS.register_module()
class PlainMamba(MambaBackbone):
    """PlainMamba L1 / L2 / L3 for classification, segmentation and detection.

    Args:
        arch: ``'l1'``, ``'l2'``, ``'l3'`` (or ``'L1'``...), ``'test'``, or a dict with
            ``embed_dims`` and ``num_layers`` (optional ``patch_size`` (16; even: the stem's
            stride 2 times the projection's), ``num_convs_patch_embed``,
            ``layers_with_dwconv``, ``d_state``, ``expand``, ``dt_rank``, ``d_conv``).
        img_size: the position embedding's image size (its grid: ``img_size / patch``); any input
            size works (the embedding is resized bicubically, as the official code does).
        in_channels: image channels.
        out_indices: layers whose outputs are returned (negatives count from the end; default
            the last).
        out_type: ``'featmap'`` (B, C, H/p, W/p), p the patch size (16): layer ``i``'s
            output through its own ``norm_layer{i}`` (LayerNorm eps 1e-6), the last layer's
            through ``ln1`` when
            ``final_norm`` (the official ``PlainMamba.forward(x)[1]`` / mmseg backbone);
            ``'avg_featmap'`` (B, C): ``ln1`` and the mean over tokens (the official
            classifier's pooling), with ``out_indices=-1`` only.
        final_norm: ``ln1`` (eps 1e-6) after the last layer.
        drop_rate: dropout after the position embedding; ``drop_path_rate``: stochastic depth,
            ``linspace(0, rate, num_layers)``.
        frozen_stages: -1 none; ``k >= 0`` freezes the patch and position embeddings and the
            first ``k`` layers.
        norm_eps: the layers' LayerNorm epsilon (1e-5 as the official code).
        scan_backend: selective-scan backend (``None``: automatic).
        cuda_graph: replay CUDA inference forwards from captured CUDA graphs (``None``: the
            ``AMVIM_CUDA_GRAPH`` switch, on by default), as the Vim family (see
            :mod:`amvim_mm.models.skeleton.graphs`).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads a released file (mmcls
            layout: ``state_dict`` with ``backbone.*``, ``head.*``) or a bare backbone state
            dict strictly; ``head.*`` and EMA buffers (``ema_*``) are dropped; output norms
            absent from the file keep weight 1 / bias 0 (logged).
        pretrained: mmseg's deprecated form of ``init_cfg=dict(type='Pretrained',
            checkpoint=pretrained)`` (mmseg's ``EncoderDecoder`` passes its own on); not
            together with ``init_cfg`` (see
            :func:`~amvim_mm.models.skeleton.checkpoint_guard.pretrained_init_cfg`).
    """

    arch_zoo = PLAIN_MAMBA_ARCHS
    classifier_out_types = ('avg_featmap', )

    @property
    def min_input_size(self) -> int:
        """The smallest image height and width: one patch (see :meth:`check_images`)."""
        return self.patch_size

    def input_dtype(self) -> torch.dtype:
        """The dtype of images outside autocast: the stem's first weight's."""
        return self.patch_embed.stem[0].weight.dtype

    def __init__(self,
                 arch: Union[str, dict] = 'l1',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'featmap',
                 final_norm: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eps: float = 1e-5,
                 scan_backend: Optional[str] = None,
                 token_reduction: Optional[dict] = None,
                 reduced_direction_codes: str = 'positional',
                 cuda_graph: Optional[bool] = None,
                 init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None) -> None:
        name = type(self).__name__
        super().__init__(init_cfg=pretrained_init_cfg(name, pretrained, copy.deepcopy(init_cfg)))
        teach_upstream_layer_decay()    # mmseg's / mmdet's decay constructors (see layer_decay)
        self.arch_settings = cfg = _arch_settings(arch)
        self.embed_dims = C = cfg['embed_dims']
        self.num_layers = depth = cfg['num_layers']
        self._check_args(name, out_type, img_size, in_channels, frozen_stages, final_norm,
                         out_indices)
        drop_rate = rate(name, 'drop_rate', drop_rate)
        drop_path_rate = rate(name, 'drop_path_rate', drop_path_rate)
        check_backend_usable(scan_backend, name)
        self.init_forward(cuda_graph)

        self.patch_size = P = cfg['patch_size']
        self.patch_embed = ConvPatchEmbed(self.in_channels, C, cfg['num_convs_patch_embed'], P)
        self.patch_resolution = (math.ceil(self.img_size[0] / P),
                                 math.ceil(self.img_size[1] / P))
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.patch_resolution[0] * self.patch_resolution[1], C))
        self.drop_after_pos = nn.Dropout(p=float(drop_rate))
        dpr = [x.item() for x in torch.linspace(0, float(drop_path_rate), depth)]
        self.layers = nn.ModuleList(
            PlainMambaLayer(C, dpr[i], i in cfg['layers_with_dwconv'], norm_eps,
                            d_state=cfg['d_state'], expand=cfg['expand'],
                            dt_rank=cfg['dt_rank'], d_conv=cfg['d_conv'],
                            scan_backend=scan_backend,
                            reduced_direction_codes=reduced_direction_codes)
            for i in range(depth))
        if final_norm:
            self.ln1 = nn.LayerNorm(C, eps=1e-6)
        if out_type == 'featmap':
            for i in self.out_indices:
                if i != depth - 1:
                    self.add_module(f'norm_layer{i}', nn.LayerNorm(C, eps=1e-6))
        self.frozen_stages = frozen_stages
        self.finish_init(token_reduction, key_hook=self._official_keys)

    def _check_args(self, name: str, out_type, img_size, in_channels, frozen_stages,
                    final_norm, out_indices) -> None:
        """Validate and set ``out_type``, ``img_size``, ``in_channels``, ``final_norm`` and
        ``out_indices``; check ``frozen_stages``."""
        cfg, depth = self.arch_settings, self.num_layers
        if out_type not in OUT_TYPES:
            raise ConfigError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        self.out_type = out_type
        if is_int(img_size):
            img_size = (img_size, img_size)
        if not isinstance(img_size, (tuple, list)) or len(img_size) != 2 or \
                not all(is_int(v) and v >= cfg['patch_size'] for v in img_size):
            raise ConfigError(f'{name}: img_size must be an int or a pair (H, W) of ints >= '
                              f'{cfg["patch_size"]} (the patch size), got {img_size!r}')
        self.img_size = (int(img_size[0]), int(img_size[1]))
        self.in_channels = positive_int(name, 'in_channels', in_channels)
        if not is_int(frozen_stages) or frozen_stages < -1:
            raise ConfigError(f'{name}: frozen_stages must be an int >= -1, got '
                              f'{frozen_stages!r}')
        if not isinstance(final_norm, bool):
            raise ConfigError(f'{name}: final_norm must be a bool, got {final_norm!r}')
        self.final_norm = final_norm
        self.out_indices = resolve_out_indices(name, out_indices, depth, 'layers')
        if out_type == 'avg_featmap' and self.out_indices != [depth - 1]:
            raise ConfigError(f'{name}: out_type="avg_featmap" is the classifier input and needs '
                              f'out_indices=-1, got {out_indices!r}')

    # ----------------------------------------------------------------- init and loading
    def reset_weights(self) -> None:
        """The official initialisation (mixers as :meth:`PlainMamba2D.reset_parameters`,
        norms 1 / 0, position embedding trunc-normal 0.02, convs PyTorch's default)."""
        for m in self.modules():
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                m.reset_parameters()
            elif isinstance(m, nn.Conv2d):
                m.reset_parameters()
            elif isinstance(m, PlainMamba2D):
                m.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=.02)

    def init_weights(self) -> None:
        """Load ``init_cfg=dict(type='Pretrained', checkpoint=...)`` strictly, or initialise
        (a parent's generic ``init_cfg`` has run before: the own initialisation first)."""
        self.reset_weights()
        if not self.load_pretrained():
            super().init_weights()

    def _official_keys(self, state_dict, prefix, *args, **kwargs) -> None:
        """Load pre-hook: drop a classifier head (``head.*``) and EMA buffers (``ema_*``);
        resize a position embedding of another grid (bicubic, as the official code); give
        output norms absent from an official file this model's values (weight 1, bias 0)."""
        for k in [k for k in state_dict if k.startswith(prefix)]:
            rest = k[len(prefix):]
            if rest.startswith('head.') or rest.startswith('ema_'):
                del state_dict[k]
        name = prefix + 'pos_embed'
        if name in state_dict and state_dict[name].shape != self.pos_embed.shape:
            ckpt = state_dict[name]
            side = math.isqrt(ckpt.shape[1])
            if ckpt.dim() == 3 and side * side == ckpt.shape[1] and \
                    ckpt.shape[-1] == self.embed_dims:
                MMLogger.get_current_instance().info(
                    f'Resize the pos_embed shape from {tuple(ckpt.shape)} to '
                    f'{tuple(self.pos_embed.shape)}.')
                state_dict[name] = resize_pos_embed(ckpt, (side, side), self.patch_resolution,
                                                    with_cls_token=False)
        self.keep_missing_output_norms(state_dict, prefix, 'norm_layer',
                                       'patch_embed.projection.weight')

    # ----------------------------------------------------------------- training helpers
    def frozen_parts(self) -> list:
        if self.frozen_stages < 0:
            return []
        return [self.pos_embed, self.patch_embed] + \
            list(self.layers[:min(self.frozen_stages, self.num_layers)])

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """``(layer_depth, num_layers + 2)``: embeddings 0, layer ``i`` ``i + 1``, the norms
        after the layers the last."""
        return self.plain_layer_depth(param_name, prefix, ('patch_embed', 'pos_embed'),
                                      'layers.')

    # ----------------------------------------------------------------- token reduction
    def reduction_domain(self) -> Tuple[int, int]:
        """(tokens, layers) a token reducer's schedule acts on at ``img_size``."""
        return self.patch_resolution[0] * self.patch_resolution[1], self.num_layers

    def reduction_domain_note(self, tokens: int, blocks: int) -> str:
        return f'{tokens} tokens, {blocks} layers'

    def reduction_grid(self, H: int, W: int) -> Tuple[int, int]:
        """The token grid of an H x W image: the stride-2 stem, then the projection's stride
        (inputs padded up to it)."""
        k = self.patch_embed.projection.stride[0]
        h, w = -(-H // 2), -(-W // 2)
        return -(-h // k), -(-w // k)

    def execution_plan(self, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
        return plan_plain_mamba(self, x, fused)

    # ----------------------------------------------------------------- forward
    def embed(self, x: torch.Tensor, plan) -> Tuple[torch.Tensor, ScanContext]:
        """Images -> the position-embedded (B, L, C) tokens and their context."""
        x, grid = self.patch_embed(x)
        pos = self.pos_embed
        if tuple(grid) != tuple(self.patch_resolution):
            pos = resize_pos_embed(pos, self.patch_resolution, grid, with_cls_token=False)
        x = self.drop_after_pos(x + pos)
        return x, ScanContext(grid, cls_index=NO_CLS, device=x.device)

    def block_output(self, i: int, x: torch.Tensor, residual, ctx: ScanContext,
                     keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Layer ``i``'s output as the requested map or pooled vector. A reduced sequence is
        given its full grid back first (merged tokens copied to their cells, pruned cells
        their last feature), then normed; the pooled vector is the size-weighted mean of the
        normed tokens (the grid mean when nothing was pruned). ``keep``: the masked training
        forward's (B, L) mask (the pooled vector is then the mean over the kept tokens, as
        inference pools the present ones)."""
        last = i == self.num_layers - 1
        norm = (self.ln1 if self.final_norm else None) if last else \
            getattr(self, f'norm_layer{i}', None)
        if self.out_type == 'avg_featmap':
            x = norm(x) if norm is not None else x
            if keep is not None:
                w = keep.to(x.dtype)
                return (x * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)
            if not ctx.reduced:
                return x.mean(1)
            w = ctx.size.to(x.dtype)
            return (x * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)
        if ctx.reduced:
            x = restore_grid(ctx, x)
        if norm is not None:
            x = norm(x)
        B, L, C = x.shape
        return x.transpose(1, 2).reshape(B, C, *ctx.grid).contiguous()

    #: PlainMamba's mixer has the masked forward a learned (pruning) reducer trains with
    supports_learned_reduction = True

    # ----------------------------------------------------------------- FLOPs
    #: the conventions :meth:`flops` counts in (see :mod:`amvim_mm.analysis.plainmamba_flops`)
    flops_conventions = FLOPS_CONVENTIONS
    default_flops_convention = 'official'

    def _stem_flops(self, H: int, W: int, bn: int) -> Tuple[int, int]:
        """(FLOPs of the convolutional patch embedding on an H x W image, patch tokens)."""
        pe = self.patch_embed
        c = pe.stem[0].out_channels
        h, w = (H + 1) // 2, (W + 1) // 2                                  # 7x7 stride-2 stem
        f = c * self.in_channels * 49 * h * w + bn * c * h * w
        n_convs = len([m for m in pe.convs if hasattr(m, 'kernel_size')])
        f += n_convs * (c * c * 9 * h * w + bn * c * h * w)
        k = pe.projection.stride[0]                                       # 8 (patch 16)
        gh, gw = -(-h // k), -(-w // k)                                    # padded to k
        M = gh * gw
        return f + self.embed_dims * c * k * k * M, M                     # projection

    def flops(self, input_shape: Tuple[int, int], reducer, num_classes: int, convention: str,
              measure: Callable[[], float]) -> Dict[str, object]:
        """FLOPs for one (H, W) image with ``reducer`` (see
        :func:`amvim_mm.analysis.flops.backbone_flops`; ``measure``: mmengine's count)."""
        depth, C = self.num_layers, self.embed_dims
        official = convention == 'official'
        ln, bn = (5, 2) if official else (0, 0)       # fvcore: eval BN with affine = 2 * numel
        f, M = self._stem_flops(*input_shape, bn)
        removals, counts, realised = [0] * depth, [M] * depth, 0.0
        if reducer is not None:     # a dynamic reducer's (LTMP): the means per image
            removals, counts, realised = reducer.token_plan(M, depth)
        if convention == 'mmengine':
            total = measure() + C * num_classes
            return dict(gflops=total / 1e9, tokens=counts, removals=removals,
                        realised_ratio=realised, convention=self.flops_conventions[convention])
        for layer, L in zip(self.layers, counts):
            f += layer.flops(L, official)
        if self.final_norm:
            f += ln * counts[-1] * C
        if hasattr(reducer, 'extra_flops'):       # a learned reducer's own layers (predictors)
            f += reducer.extra_flops(M, depth)
        f += C * num_classes
        return dict(gflops=f / 1e9, tokens=counts, removals=removals, realised_ratio=realised,
                    convention=self.flops_conventions[convention])
