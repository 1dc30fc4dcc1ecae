"""The Vim family: one mixer, one block and one backbone base; Vim and AMVim are configs of it.

Data flow::

    image -> patch embed -> class token at the middle + pos embed
          -> blocks: residual = residual + drop_path(h); h = mixer(RMSNorm(residual))
             mixer: in_proj -> per path: tokens in the path's order -> conv1d -> x_proj ->
                    dt_proj -> selective scan (gated by silu(z)) -> back to token order
                    -> mean over paths -> out_proj
          -> outputs at ``out_indices``

Parameter names equal the official Vim checkpoint keys, so an official file loads 1:1.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from amvim_mm.errors import ConfigError
from amvim_mm.ops.backends import check_backend_usable
from amvim_mm.token_layout import cls_row, drop_cls
from ..heads.token_grid import token_grid
from ..layout.scan_context import ScanContext
from ..reduction import ReductionSchedule, restore_grid
from ..skeleton.arch import resolve_arch
from ..skeleton.args import positive_int, rate, resolve_out_indices, size_pair
from ..skeleton.base import MambaBackbone
from .block import VimBlock
from ..skeleton.checkpoint_guard import pretrained_init_cfg
from ..skeleton.drop import DropPath
from ..skeleton.embed import PatchEmbed, infer_square_grid, resize_pos_embed
from ..skeleton.layer_decay import teach_upstream_layer_decay
from .mixer import BiMambaMixer
from .embed import VimEmbedding
from .norm import RMSNorm

OUT_TYPES = ('cls_token', 'featmap', 'raw', 'tokens')
#: what block ``i``'s output is made of (see ``tap`` in :class:`VimFamilyBackbone`)
TAPS = ('stream', 'mixer')


def _canonical_arch(arch_zoo: Dict[str, dict], arch: Union[str, dict],
                    name: str) -> Dict[str, object]:
    """:func:`~.arch.resolve_arch`, then a custom dict's values checked (positive ints) and
    ``dt_rank`` defaulting to ``ceil(embed_dims / 16)``."""
    cfg = resolve_arch(name, arch_zoo, arch, REQUIRED_ARCH_KEYS, ARCH_DEFAULTS, zoo_defaults={})
    if isinstance(arch, dict):
        for k, v in arch.items():
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f'custom {name} arch: {k} must be a positive int, got {v!r}')
        if cfg['dt_rank'] is None:
            cfg['dt_rank'] = math.ceil(cfg['embed_dims'] / 16)
    return cfg


REQUIRED_ARCH_KEYS = frozenset({'embed_dims', 'num_layers'})
#: the FLOPs conventions of :meth:`VimFamilyBackbone.flops` (see :mod:`amvim_mm.analysis.flops`)
FLOPS_CONVENTIONS = {
    'mamba': ('MACs of linear/conv layers + selective scan 9*L*E*N per path (mamba-ssm '
              'convention), per-block token counts (a learned reducer\'s linear layers '
              'included); norms, activations and the training-free reducers\' cost excluded'),
    'localmamba': ("LocalMamba's flops(): projections + L*D norm, conv/x_proj/dt_proj once per "
                   'block, scan 5*L*E*N + 2*L*E per path, per-block token counts'),
    'mmengine': ("mmengine's FlopAnalyzer (the libraries' get_flops tools) traced on the "
                 'backbone: one FLOP per multiply-accumulate of the ops it has handles for '
                 '(linear, conv, matmul); the selective scan and element-wise ops uncounted'),
}
#: a custom arch's optional keys and their defaults (``dt_rank`` None: ``ceil(embed_dims / 16)``)
ARCH_DEFAULTS = dict(d_state=16, d_conv=4, expand=2, dt_rank=None)


class VimFamilyBackbone(VimEmbedding, MambaBackbone):
    """Base of Vim-family backbones: everything but the choice of scan paths per layer.

    Subclasses set ``arch_zoo`` and implement :meth:`layer_paths`.

    Args:
        arch: a name of ``arch_zoo`` (``'tiny'``/``'t'``, ``'small'``/``'s'``, ``'base'``/``'b'``,
            ``'test'``) or a dict with ``embed_dims`` and ``num_layers`` (optional ``d_state``,
            ``d_conv``, ``expand``, ``dt_rank``).
        img_size: training image size (int or (H, W)); sets the position-embedding grid. Any
            other input size works: the embedding is resized around the middle class token.
        patch_size, stride: patch embedding (16/16; the fine-grained models use stride 8).
        in_channels: image channels.
        out_indices: blocks whose output is returned; negatives count from the end.
        out_type: ``'cls_token'`` (B, D), ``'featmap'`` (B, D, H/s, W/s) without the class token,
            ``'raw'`` (B, L, D) with it, or ``'tokens'``: a
            :class:`~amvim_mm.models.heads.TokenGrid` (the kept tokens and their restore map,
            for the per-token heads of :mod:`amvim_mm.models.heads`). The output of block ``i`` is the tensor ``tap``
            names; after the last block it goes through ``norm_f`` when ``final_norm`` (so the
            last ``cls_token`` is the official classifier input).
        tap: which tensor of block ``i`` is its output. ``'stream'`` (default): the residual
            stream after the block, ``residual + h`` (the official Vim-S segmentation code's
            ``use_residual_as_feature=True, last_layer_process='add'``, the detection code's
            last-block feature, and the classifier input). ``'mixer'``: the block's mixer
            output ``h`` alone, without the residual (the official Vim-T segmentation code's
            default taps). Stochastic depth: the final ``drop_path`` acts on the last block's
            ``h`` only when ``final_norm`` (the classifier path, as in the reference code); the
            official dense code adds the last ``h`` without it.
        with_cls_token: insert the middle class token (dense tasks may switch it off; the
            checkpoint's class-token entries are then unused).
        final_norm: apply ``norm_f`` after the last block.
        drop_rate: dropout after the position embedding.
        drop_path_rate: stochastic depth; block ``i`` uses ``[0] + linspace(0, rate, depth)``
            at index ``i`` and the final add uses ``rate``, as in the reference code.
        frozen_stages: freeze the embeddings and the first ``frozen_stages`` blocks (-1: none).
        interpolate_mode: position-embedding resize mode.
        scan_backend: selective-scan backend for every block (``None``: automatic).
        fused_mixer: the fused Triton inference path of the mixers (``None``: automatic, on
            for CUDA inference when Triton imports; see :class:`BiMambaMixer`).
        cuda_graph: replay CUDA inference forwards from captured CUDA graphs (``None``: the
            ``AMVIM_CUDA_GRAPH`` switch, on by default; False: off): the same kernels and numbers
            without the host's launch overhead, which bounds an eager forward at the dense
            tasks' small batches; a shape is captured the second time it is seen, training,
            gradients, hooks and reducers off the allow-list stay eager (see
            :mod:`amvim_mm.models.skeleton.graphs`).
        norm_eps: RMSNorm epsilon.
        token_reduction: switch on a token reducer, e.g. ``dict(type='ToMe', ratio=0.17)``
            (see :mod:`amvim_mm.models.reduction`); validated at build time for ``img_size``.
            Dense outputs (``featmap``) are restored to the full grid; ``raw`` returns the
            reduced sequence. The sequence length seen by each block of the last forward is in
            ``self.token_counts``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH[, strict=True])`` loads an official
            Vim file or one of ours strictly (see
            :func:`amvim_mm.utils.checkpoint.load_backbone_checkpoint`).
        pretrained: mmseg's deprecated form of ``init_cfg=dict(type='Pretrained',
            checkpoint=pretrained)`` (mmseg's ``EncoderDecoder`` passes its own on); not
            together with ``init_cfg`` (see
            :func:`~amvim_mm.models.skeleton.checkpoint_guard.pretrained_init_cfg`).

    Every argument is checked at build time (a :class:`~amvim_mm.errors.ConfigError` names the
    argument, the value and what is allowed); the images of each forward are checked by
    :meth:`check_images` (shape, channels, an empty batch, dtype, NaN/inf values; see
    :mod:`~amvim_mm.models.skeleton.input_check`).
    """

    arch_zoo: Dict[str, dict] = {}

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 stride: int = 16,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'cls_token',
                 tap: str = 'stream',
                 with_cls_token: bool = True,
                 final_norm: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 interpolate_mode: str = 'bicubic',
                 scan_backend: Optional[str] = None,
                 fused_mixer: Optional[bool] = None,
                 cuda_graph: Optional[bool] = None,
                 norm_eps: float = 1e-5,
                 token_reduction: Optional[dict] = None,
                 init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None) -> None:
        name = type(self).__name__
        super().__init__(init_cfg=pretrained_init_cfg(name, pretrained, copy.deepcopy(init_cfg)))
        teach_upstream_layer_decay()    # mmseg's / mmdet's decay constructors (see layer_decay)
        self.arch_settings = _canonical_arch(self.arch_zoo, arch, name)
        self.embed_dims = self.arch_settings['embed_dims']
        self.num_layers = depth = self.arch_settings['num_layers']
        if out_type not in OUT_TYPES:
            raise ConfigError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        if out_type == 'cls_token' and not with_cls_token:
            raise ConfigError(f'{name}: out_type="cls_token" needs with_cls_token=True')
        if tap not in TAPS:
            raise ConfigError(f'{name}: tap must be one of {TAPS}, got {tap!r}')
        self.out_type = out_type
        self.tap = tap
        self.with_cls_token = with_cls_token
        self.final_norm = final_norm
        self.img_size = size_pair(name, 'img_size', img_size)
        self.interpolate_mode = interpolate_mode
        check_backend_usable(scan_backend, name)
        self.init_forward(cuda_graph)
        self._build_embedding(name, patch_size, stride, in_channels, drop_rate)
        self.out_indices = resolve_out_indices(name, out_indices, depth, 'layers')
        drop_path_rate = rate(name, 'drop_path_rate', drop_path_rate)
        self._build_layers(drop_path_rate, fused_mixer, scan_backend, norm_eps)
        # parameters this configuration never uses stay loadable (official keys) but get no
        # gradient, so DDP does not wait for them (no find_unused_parameters needed)
        if not with_cls_token:
            self.cls_token.requires_grad_(False)
        if not final_norm:
            self.norm_f.weight.requires_grad_(False)
        self.frozen_stages = frozen_stages
        self.finish_init(token_reduction, key_hook=self._prepare_pos_embed)

    def _build_embedding(self, name: str, patch_size: int, stride: int, in_channels: int,
                         drop_rate: float) -> None:
        """Patch embedding, class token, position embedding (and its resize on load)."""
        D = self.embed_dims
        patch_size = positive_int(name, 'patch_size', patch_size)
        stride = positive_int(name, 'stride', stride)
        self.in_channels = positive_int(name, 'in_channels', in_channels)
        drop_rate = rate(name, 'drop_rate', drop_rate)
        self.patch_embed = PatchEmbed(self.in_channels, D, patch_size, stride)
        self.patch_resolution = self.patch_embed.grid_size(*self.img_size)
        num_patches = self.patch_resolution[0] * self.patch_resolution[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, D))
        self.drop_after_pos = nn.Dropout(p=drop_rate)

    def _build_layers(self, drop_path_rate: float, fused_mixer: Optional[bool],
                      scan_backend: Optional[str], norm_eps: float) -> None:
        """The blocks (drop path ``[0] + linspace(0, rate, depth)``), ``norm_f``, the final
        drop path."""
        D, depth = self.embed_dims, self.num_layers
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        inter_dpr = [0.0] + dpr
        mixer_kwargs = {k: self.arch_settings[k] for k in ('d_state', 'd_conv', 'expand',
                                                           'dt_rank')}
        mixer_kwargs['fused'] = fused_mixer
        self.layers = nn.ModuleList()
        for i in range(depth):
            paths = self.layer_paths(i)
            mixer = self.build_mixer(i, D, mixer_kwargs, scan_backend)
            self.layers.append(VimBlock(mixer, D, paths, inter_dpr[i], norm_eps))
        self.norm_f = RMSNorm(D, eps=norm_eps)
        self.drop_path = DropPath(drop_path_rate)

    # ----------------------------------------------------------------- hooks for subclasses
    def layer_paths(self, i: int) -> List[dict]:
        """Scan orders of the paths of block ``i`` (one dict per path)."""
        raise NotImplementedError

    def build_mixer(self, i: int, embed_dims: int, mixer_kwargs: dict,
                    scan_backend: Optional[str]) -> nn.Module:
        return BiMambaMixer(embed_dims, suffixes=('', '_b'), scan_backend=scan_backend,
                            **mixer_kwargs)

    # ----------------------------------------------------------------- init and loading
    def _init_default_weights(self) -> None:
        """Initialisation of the reference code (used when training from scratch)."""
        nn.init.trunc_normal_(self.pos_embed, std=.02)
        nn.init.trunc_normal_(self.cls_token, std=.02)
        nn.init.trunc_normal_(self.patch_embed.proj.weight, std=.02)
        nn.init.zeros_(self.patch_embed.proj.bias)
        for layer in self.layers:
            # mamba's _init_weights: out_proj rescaled for the residual stream depth
            w = layer.mixer.out_proj.weight
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            with torch.no_grad():
                w /= math.sqrt(self.num_layers)

    def reset_weights(self) -> None:
        """Every parameter as a freshly built backbone has it (mixers, norms, embeddings)."""
        for layer in self.layers:
            layer.mixer.reset_parameters()
        for m in self.modules():
            if isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        self._init_default_weights()

    def init_weights(self) -> None:
        """Load ``init_cfg=dict(type='Pretrained', ...)`` strictly, or (re)initialise.

        mmengine initialises a parent model *before* its children, so an upstream config's
        model-level ``init_cfg`` (DeiT / ViT: ``TruncNormal`` on every ``Linear``) has already
        overwritten our parameters when this runs: step sizes at softplus(0) = 0.69 instead of
        0.001-0.1, projections at std 0.02. Like mamba-ssm's ``_no_reinit``, the backbone
        therefore restores its own (Mamba) initialisation here; an ``init_cfg`` of the backbone
        itself (other than ``Pretrained``) is applied after it, as the user's explicit choice.
        """
        self.reset_weights()
        if not self.load_pretrained():
            super().init_weights()

    def _prepare_pos_embed(self, state_dict, prefix, *args, **kwargs) -> None:
        """Resize a checkpoint's position embedding to this model's grid (middle class token)."""
        name = prefix + 'pos_embed'
        if name not in state_dict:
            return
        ckpt = state_dict[name]
        if ckpt.shape == self.pos_embed.shape:
            return
        if ckpt.dim() != 3 or ckpt.shape[-1] != self.embed_dims:
            return  # leave the mismatch to load_state_dict, which names it
        src = infer_square_grid(ckpt.shape[1] - 1)
        MMLogger.get_current_instance().info(
            f'Resize the pos_embed shape from {tuple(ckpt.shape)} to '
            f'{tuple(self.pos_embed.shape)} (grid {src} -> {self.patch_resolution}, middle '
            'class token kept).')
        state_dict[name] = resize_pos_embed(ckpt, src, self.patch_resolution,
                                            self.interpolate_mode)

    # ----------------------------------------------------------------- training helpers
    def frozen_parts(self) -> list:
        if self.frozen_stages < 0:
            return []
        parts = [self.pos_embed, self.cls_token, self.patch_embed, self.drop_after_pos]
        parts += list(self.layers[:min(self.frozen_stages, self.num_layers)])
        return parts + ([self.norm_f] if self.frozen_stages >= self.num_layers else [])

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer depth of a parameter for layer-wise learning-rate decay.

        Returns ``(layer_depth, num_layers)`` with ``num_layers = depth + 2``: the embeddings
        are depth 0, block ``i`` is ``i + 1``, ``norm_f`` and anything after is the last.
        """
        return self.plain_layer_depth(param_name, prefix, ('cls_token', 'pos_embed',
                                                           'patch_embed'), 'layers.')

    # ----------------------------------------------------------------- forward
    def reduction_domain(self) -> Tuple[int, int]:
        """(patch tokens, blocks) a token reducer's schedule acts on at ``img_size``."""
        return self.patch_resolution[0] * self.patch_resolution[1], self.num_layers

    def reduction_domain_note(self, tokens: int, blocks: int) -> str:
        return f'{tokens} patch tokens, {self.num_layers} blocks'

    def restores_grid(self) -> bool:
        """``featmap`` outputs restore the grid, ``tokens`` carry its restore map (pruned cells
        keep their features); ``cls_token`` and ``raw`` are tokens of the sequence."""
        return self.out_type in ('featmap', 'tokens')

    def format_output(self, stream: torch.Tensor, ctx: ScanContext, last: bool) -> torch.Tensor:
        """Turn the residual stream after a block into the requested output (for ``out_type=
        'cls_token'`` the stream is just the class token's row, (B, 1, D))."""
        B, _, D = stream.shape
        if self.out_type == 'featmap':
            if ctx.reduced:
                feat = restore_grid(ctx, stream)
            else:
                feat = drop_cls(stream, ctx.cls_index)
            if last and self.final_norm:
                feat = self.norm_f(feat)
            H, W = ctx.grid
            return feat.transpose(1, 2).reshape(B, D, H, W).contiguous()
        if self.out_type == 'cls_token':
            if last and self.final_norm:
                stream = self.norm_f(stream)
            return stream[:, 0]
        if self.out_type == 'tokens':       # the carriers and their restore map
            grid = token_grid(ctx, stream)
            return grid.map(self.norm_f) if last and self.final_norm else grid
        return self.norm_f(stream) if last and self.final_norm else stream

    def block_output(self, i: int, hidden: torch.Tensor, residual: torch.Tensor,
                     ctx: ScanContext, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The output of block ``i``: the tensor ``tap`` names (the residual stream after it,
        or its mixer output), formatted (:meth:`format_output`); for ``cls_token`` only the
        class token's row is formed."""
        last = i == self.num_layers - 1
        if self.out_type == 'cls_token':
            hidden, residual = cls_row(hidden, ctx.cls_index), cls_row(residual, ctx.cls_index)
        if self.tap == 'mixer':
            return self.format_output(hidden, ctx, last)
        stream = residual + (self.drop_path(hidden) if last and self.final_norm else hidden)
        return self.format_output(stream, ctx, last)

    # ----------------------------------------------------------------- FLOPs
    #: the conventions :meth:`flops` counts in (see :mod:`amvim_mm.analysis.flops`)
    flops_conventions = FLOPS_CONVENTIONS

    def block_flops(self, layer: nn.Module, L: int, convention: str) -> int:
        """FLOPs of block ``layer`` on ``L`` tokens: its mixer's count
        (:meth:`~.mixer.BiMambaMixer.flops`)."""
        return layer.mixer.flops(L, convention)

    def token_plan(self, M: int, reducer, count_after_merge: bool = False
                   ) -> Tuple[List[int], List[int]]:
        """(removals, sequence length per block) for ``M`` patches with ``reducer``."""
        depth, cls = self.num_layers, int(self.with_cls_token)
        removals = reducer.removals(M, depth) if reducer is not None else [0] * depth
        counted = [0] + list(removals[:-1]) if count_after_merge else removals
        tokens = ReductionSchedule.token_counts(counted, M, cls_token=bool(cls))
        if reducer is not None and reducer.dynamic:
            # counts that depend on the image (LTMP): the means over the images it evaluated
            removals, tokens, _ = reducer.token_plan(M, depth, cls_token=bool(cls))
            return removals, tokens
        if reducer is not None and reducer.freeze_sources:
            # EViT's fused token joins from its first location on
            first = next((i for i, k in enumerate(removals) if k), None)
            if first is not None:
                tokens = [t + (i >= first) for i, t in enumerate(tokens)]
        return removals, tokens

    def flops(self, input_shape: Tuple[int, int], reducer, num_classes: int, convention: str,
              measure: Callable[[], float], count_after_merge: bool = False
              ) -> Dict[str, object]:
        """FLOPs for one (H, W) image with ``reducer`` (see
        :func:`amvim_mm.analysis.flops.vim_family_flops`; ``measure``: mmengine's count)."""
        gh, gw = self.patch_embed.grid_size(*input_shape)
        M, D = gh * gw, self.embed_dims
        removals, tokens = self.token_plan(M, reducer, count_after_merge)
        result = dict(removals=removals, tokens=tokens,
                      realised_ratio=ReductionSchedule.realised_ratio(removals, M),
                      convention=self.flops_conventions[convention])
        if convention == 'mmengine':
            total = measure() + D * num_classes
            return dict(result, gflops=total / 1e9, per_block_gflops=None)
        p = self.patch_embed.patch_size
        total = M * self.patch_embed.proj.in_channels * p * p * D
        per_block = [self.block_flops(layer, L, convention)
                     for layer, L in zip(self.layers, tokens)]
        total += sum(per_block)
        if hasattr(reducer, 'extra_flops'):      # a learned reducer's own layers (predictors)
            total += reducer.extra_flops(M, self.num_layers)
        total += D * num_classes
        return dict(result, gflops=total / 1e9, per_block_gflops=[f / 1e9 for f in per_block])

    #: Vim-family mixers have the masked forward a learned reducer trains with, merges too
    supports_learned_reduction = True
    masked_training_merges = True
    #: :meth:`VimEmbedding.embed` checks the images (after the execution plan is taken)
    embed_checks_images = True

    def call_block(self, block, hidden, residual, ctx, merge, route):
        return block(hidden, residual, ctx, merge=merge, route=route)

    def call_block_masked(self, block, hidden, residual, ctx, keep):
        return block(hidden, residual, ctx, keep=keep)
