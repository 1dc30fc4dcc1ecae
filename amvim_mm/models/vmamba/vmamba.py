"""VMamba (Liu et al., NeurIPS 2024): a hierarchical backbone of SS2D blocks, with token
reduction inside one stage.

Data flow (channel-last inside, NCHW maps out)::

    image -> patch embed (stride 4) -> stage 0 -> downsample -> stage 1 -> ... -> stage 3
    stage i: tokens (B, H_i * W_i, C_i) on the grid -> VSSBlock x depth_i
             VSSBlock: x = x + drop_path(SS2D(LN(x))); x = x + drop_path(MLP(LN2(x)))
    out_indices: stage i's output BEFORE its downsample, through ``outnorm{i}`` (NCHW)

Parameter names equal the official classification checkpoint keys (``patch_embed.{0,2,5,7}``,
``layers.{i}.blocks.{j}.{norm,op,norm2,mlp}``, ``layers.{i}.downsample.{1,3}``,
``classifier.norm``), so an official ``{'model': ...}`` file loads strictly; the dense outputs
add ``outnorm{i}`` as the official ``Backbone_VSSM`` does. The official channel-first layout
and this channel-last one are the same computation (LayerNorm over channels, 1x1 "Linear2d" =
``nn.Linear``).
"""
from __future__ import annotations

import copy
import math
import numbers
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError
from amvim_mm.ops.backends import check_backend_usable
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS
from ..execution import ExecutionPlan, plan_vmamba
from ..layout.scan_context import ScanContext
from ..reduction import restore_grid
from ..skeleton.arch import resolve_arch
from ..skeleton.args import is_int, positive_int, rate, resolve_out_indices
from ..skeleton.base import MambaBackbone
from ..skeleton.checkpoint_guard import pretrained_init_cfg
from ..skeleton.layer_decay import teach_upstream_layer_decay
from .blocks import (PatchMerging2D, VSSBlock, VSSLayer, downsample_flops, downsample_v3,
                     patch_embed_v1, patch_embed_v2, stem_flops)
from .ss2d import FORWARD_TYPES, SS2D

__all__ = ['VMamba', 'VMAMBA_ARCHS']

_FINAL = dict(d_state=1, mlp_ratio=4.0, forward_type='v05_noz', patch_embed='v2',
              downsample='v3', conv_bias=False)
_VANILLA = dict(d_state=16, ssm_ratio=2.0, mlp_ratio=0.0, forward_type='v0', patch_embed='v1',
                downsample='v1', conv_bias=True)

#: the released models (official config names in brackets); see configs/vmamba/README.md
VMAMBA_ARCHS = {
    # published VMamba-T/S/B (NeurIPS 2024): s1l8 / s2l15 / s2l15
    'tiny': dict(aliases=('tiny', 't', 'tiny-s1l8'), embed_dims=96, depths=(2, 2, 8, 2),
                 ssm_ratio=1.0, **_FINAL),                       # vssm1_tiny_0230s
    'small': dict(aliases=('small', 's', 'small-s2l15'), embed_dims=96, depths=(2, 2, 15, 2),
                  ssm_ratio=2.0, **_FINAL),                      # vssm1_small_0229
    'base': dict(aliases=('base', 'b', 'base-s2l15'), embed_dims=128, depths=(2, 2, 15, 2),
                 ssm_ratio=2.0, **_FINAL),                       # vssm1_base_0229
    # the other released variants of the v2 family
    'tiny-s2l5': dict(embed_dims=96, depths=(2, 2, 5, 2), ssm_ratio=2.0, **_FINAL),
    'small-s1l20': dict(embed_dims=96, depths=(2, 2, 20, 2), ssm_ratio=1.0, **_FINAL),
    'base-s1l20': dict(embed_dims=128, depths=(2, 2, 20, 2), ssm_ratio=1.0, **_FINAL),
    # Vanilla VMamba (v0): gated SS2D, d_state 16, no MLP, PatchMerging
    'vanilla-tiny': dict(embed_dims=96, depths=(2, 2, 9, 2), **_VANILLA),
    'vanilla-small': dict(embed_dims=96, depths=(2, 2, 27, 2), **_VANILLA),
    'vanilla-base': dict(embed_dims=128, depths=(2, 2, 27, 2), **_VANILLA),
    # a small architecture so that every code path runs on a CPU in well under a second
    'test': dict(embed_dims=16, depths=(1, 1, 2, 1), ssm_ratio=1.0, **_FINAL),
}
REQUIRED_ARCH_KEYS = frozenset({'embed_dims', 'depths'})
ARCH_DEFAULTS = dict(ssm_ratio=1.0, dt_rank=None, **_FINAL)
OUT_TYPES = ('featmap', 'avg_featmap')
#: the FLOPs conventions of :meth:`VMamba.flops` (see :mod:`amvim_mm.analysis.vmamba_flops`)
FLOPS_CONVENTIONS = {
    'official': ("the official VSSM.flops(): fvcore MACs of convs/linears, 5*numel per "
                 'LayerNorm, numel for the pool, scan 9*L*(K*E)*N + L*(K*E); per-stage and '
                 'per-block token counts'),
    'mamba': ('MACs of linear/conv layers + selective scan 9*L*E*N per direction (mamba-ssm '
              'convention); norms, activations and the pool excluded'),
    'mmengine': ("mmengine's FlopAnalyzer (the libraries' get_flops tools) traced on the "
                 'backbone; the selective scan and element-wise ops uncounted'),
}


def _arch_settings(arch: Union[str, dict]) -> Dict[str, object]:
    """Resolve ``arch`` (a zoo name/alias or a custom dict) and validate every value."""
    cfg = resolve_arch('VMamba', VMAMBA_ARCHS, arch, REQUIRED_ARCH_KEYS, ARCH_DEFAULTS,
                       zoo_defaults=dict(dt_rank=None))
    if isinstance(arch, str):
        return cfg

    def bad(k, what):
        return ConfigError(f'custom VMamba arch: {k} must be {what}, got {cfg[k]!r}')

    if not is_int(cfg['embed_dims']) or cfg['embed_dims'] < 1:
        raise bad('embed_dims', 'a positive int')
    d = cfg['depths']
    if not isinstance(d, (list, tuple)) or len(d) != 4 or \
            not all(is_int(x) and x >= 1 for x in d):
        raise bad('depths', 'four positive ints (blocks per stage)')
    cfg['depths'] = tuple(int(x) for x in d)
    if not is_int(cfg['d_state']) or cfg['d_state'] < 1:
        raise bad('d_state', 'a positive int')
    for k in ('ssm_ratio', 'mlp_ratio'):
        if isinstance(cfg[k], bool) or not isinstance(cfg[k], numbers.Real) or cfg[k] < 0:
            raise bad(k, 'a non-negative number')
    if cfg['ssm_ratio'] * cfg['embed_dims'] < 1:
        raise bad('ssm_ratio', 'large enough for at least one inner channel')
    if cfg['dt_rank'] is not None and (not is_int(cfg['dt_rank']) or cfg['dt_rank'] < 1):
        raise bad('dt_rank', 'a positive int or None (ceil(dim / 16) per stage)')
    if cfg['forward_type'] not in FORWARD_TYPES:
        raise bad('forward_type', f'one of {FORWARD_TYPES}')
    if cfg['patch_embed'] not in ('v1', 'v2'):
        raise bad('patch_embed', "'v1' or 'v2'")
    if cfg['downsample'] not in ('v1', 'v3'):
        raise bad('downsample', "'v1' or 'v3'")
    if not isinstance(cfg['conv_bias'], bool):
        raise bad('conv_bias', 'a bool')
    return cfg


# ---------------------------------------------------------------------------------------------
# the backbone
# ---------------------------------------------------------------------------------------------
@MODELS.register_module()
class VMamba(MambaBackbone):
    """VMamba (SS2D, hierarchical) for classification, segmentation and detection.

    Args:
        arch: ``'tiny'`` (= s1l8, the published VMamba-T), ``'small'`` / ``'base'`` (= s2l15),
            ``'tiny-s2l5'``, ``'small-s1l20'``, ``'base-s1l20'``, ``'vanilla-tiny'`` /
            ``'vanilla-small'`` / ``'vanilla-base'`` (v0), ``'test'``; or a dict with
            ``embed_dims`` and ``depths`` (four ints) and optionally ``ssm_ratio``,
            ``d_state``, ``dt_rank`` (None: ceil(dim / 16) per stage), ``mlp_ratio``,
            ``forward_type`` (``'v05_noz'`` / ``'v0'``), ``patch_embed`` (``'v2'``/``'v1'``),
            ``downsample`` (``'v3'``/``'v1'``), ``conv_bias``.
        img_size: the nominal input size (int or (H, W)): token-reduction schedules are
            validated for it at build time, and tools report FLOPs for it. Any input size
            works (VMamba has no position embedding).
        in_channels: image channels.
        out_indices: stages whose outputs are returned (negatives count from the end).
        out_type: ``'featmap'`` (default; dense tasks): for each out index an NCHW map of
            stage ``i``'s output before its downsample, through ``outnorm{i}`` (strides 4, 8,
            16, 32), as the official ``Backbone_VSSM``. ``'avg_featmap'`` (classification,
            ``out_indices=(3,)`` only): the official classifier's ``norm`` and global average
            pool, a (B, 8C) vector for mmpretrain's ``LinearClsHead`` (the checkpoint's
            ``classifier.norm`` is loaded into it).
        drop_path_rate: stochastic depth, ``linspace(0, rate, sum(depths))`` over all blocks
            (official: T 0.2, S 0.3, B 0.6 for ImageNet training).
        frozen_stages: -1 none; 0 the patch embed; ``k >= 1`` also stages ``0..k-1`` and their
            downsamples (and their output norms).
        norm_eps: epsilon of every LayerNorm (1e-5 as the official code).
        scan_backend: selective-scan backend (``None``: automatic).
        token_reduction: a reducer config (``dict(type='ToMe', ratio=0.27)``, ``RandomPrune``,
            ``EViT``, ``ToP``) applied inside the blocks of stage ``reduction_stage``; its
            schedule counts that stage's blocks (``locations`` / ``r`` per block of the stage)
            and its tokens (a 14 x 14 grid at 224). The full grid is restored (merged tokens
            copied to their cells, pruned cells get their feature at the pruning block) before
            the stage's downsample and at its output. ``self.token_counts`` holds the tokens
            each block of the last forward saw.
        reduction_stage: the stage that token reduction acts in (default 2, the third stage:
            ToP-ViM and the Swin pruning works; 57 % (T) to 71 % (S, B) of the block FLOPs).
        cuda_graph: replay CUDA inference forwards from captured CUDA graphs (``None``: the
            ``AMVIM_CUDA_GRAPH`` switch, on by default), as the Vim family (see
            :mod:`amvim_mm.models.skeleton.graphs`: training, gradients, hooks and reducers
            off the allow-list stay eager).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads an official VMamba file
            (``{'model': ...}``, keys of the official classification ``VSSM``) or one of ours
            strictly; ``classifier.head`` is never a backbone weight, ``classifier.norm`` is
            loaded only for ``out_type='avg_featmap'``; output norms absent from the file keep
            their default (weight 1, bias 0) and are named in the log. A missing or empty
            checkpoint path is an error, never a silent random start.
        pretrained: mmseg's deprecated form of ``init_cfg=dict(type='Pretrained',
            checkpoint=pretrained)`` (mmseg's ``EncoderDecoder`` passes its own on); not
            together with ``init_cfg`` (see
            :func:`~amvim_mm.models.skeleton.checkpoint_guard.pretrained_init_cfg`).
    """

    arch_zoo = VMAMBA_ARCHS
    classifier_out_types = ('avg_featmap', )
    #: the smallest image height and width the stride-4 stem takes
    min_input_size = 4

    def input_dtype(self) -> torch.dtype:
        """The dtype of images outside autocast: the stem's first weight's."""
        return self.patch_embed[0].weight.dtype

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
                 out_type: str = 'featmap',
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eps: float = 1e-5,
                 scan_backend: Optional[str] = None,
                 token_reduction: Optional[dict] = None,
                 reduction_stage: int = 2,
                 cuda_graph: Optional[bool] = None,
                 init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None) -> None:
        name = type(self).__name__
        super().__init__(init_cfg=pretrained_init_cfg(name, pretrained, copy.deepcopy(init_cfg)))
        teach_upstream_layer_decay()    # mmseg's / mmdet's decay constructors (see layer_decay)
        self.arch_settings = cfg = _arch_settings(arch)
        C = cfg['embed_dims']
        self.depths = depths = cfg['depths']
        self.num_stages = len(depths)
        self.dims = [C * 2 ** i for i in range(self.num_stages)]
        self.embed_dims = C
        self.num_layers = sum(depths)
        self._check_args(name, out_type, out_indices, frozen_stages, reduction_stage, img_size)
        in_channels = positive_int(name, 'in_channels', in_channels)
        drop_path_rate = rate(name, 'drop_path_rate', drop_path_rate)
        check_backend_usable(scan_backend, name)
        self.in_channels = in_channels
        self.init_forward(cuda_graph)
        embed = patch_embed_v2 if cfg['patch_embed'] == 'v2' else patch_embed_v1
        self.patch_embed = embed(in_channels, C)
        self._build_stages(drop_path_rate, norm_eps, scan_backend)
        self.frozen_stages = frozen_stages
        self.finish_init(token_reduction, key_hook=self._official_keys)

    def _check_args(self, name: str, out_type, out_indices, frozen_stages, reduction_stage,
                    img_size) -> None:
        """Validate and set ``out_type``, ``out_indices``, ``reduction_stage``, ``img_size``."""
        if out_type not in OUT_TYPES:
            raise ConfigError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        self.out_type = out_type
        if not is_int(frozen_stages) or frozen_stages < -1:
            raise ConfigError(f'{name}: frozen_stages must be an int >= -1, got '
                              f'{frozen_stages!r}')
        self.out_indices = resolve_out_indices(name, out_indices, self.num_stages, 'stages')
        if out_type == 'avg_featmap' and self.out_indices != [self.num_stages - 1]:
            raise ConfigError(f'{name}: out_type="avg_featmap" is the classifier input and '
                              f'needs out_indices=({self.num_stages - 1},), got '
                              f'{out_indices!r}')
        if not is_int(reduction_stage) or not 0 <= reduction_stage < self.num_stages:
            raise ConfigError(f'{name}: reduction_stage must be a stage index 0..'
                              f'{self.num_stages - 1}, got {reduction_stage!r}')
        self.reduction_stage = int(reduction_stage)
        if is_int(img_size):
            img_size = (img_size, img_size)
        if not isinstance(img_size, (tuple, list)) or len(img_size) != 2 or \
                not all(is_int(v) and v >= 4 for v in img_size):
            raise ConfigError(f'{name}: img_size must be an int or a pair (H, W) of ints >= 4, '
                              f'got {img_size!r}')
        self.img_size = (int(img_size[0]), int(img_size[1]))

    def _build_stages(self, drop_path_rate: float, norm_eps: float,
                      scan_backend: Optional[str]) -> None:
        """The stages (blocks and downsample; drop path ``linspace(0, rate, sum(depths))``)
        and the output norms (``outnorm{i}``) or the classifier's norm."""
        cfg, depths = self.arch_settings, self.depths
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, self.num_layers)]
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            d = self.dims[i]
            ss2d = dict(d_state=cfg['d_state'], ssm_ratio=cfg['ssm_ratio'],
                        dt_rank=cfg['dt_rank'] if cfg['dt_rank'] is not None
                        else math.ceil(d / 16),
                        conv_bias=cfg['conv_bias'], forward_type=cfg['forward_type'],
                        scan_backend=scan_backend)
            start = sum(depths[:i])
            blocks = [VSSBlock(d, dpr[start + j], cfg['mlp_ratio'], norm_eps, **ss2d)
                      for j in range(depth)]
            if i == self.num_stages - 1:
                down = nn.Identity()
            elif cfg['downsample'] == 'v3':
                down = downsample_v3(d, self.dims[i + 1])
            else:
                down = PatchMerging2D(d, self.dims[i + 1])
            self.layers.append(VSSLayer(blocks, down))
        if self.out_type == 'featmap':
            for i in self.out_indices:
                self.add_module(f'outnorm{i}', nn.LayerNorm(self.dims[i], eps=norm_eps))
        else:
            self.classifier = nn.Module()
            self.classifier.norm = nn.LayerNorm(self.dims[-1], eps=norm_eps)

    # ----------------------------------------------------------------- init and loading
    def reset_weights(self) -> None:
        """The official initialisation: trunc-normal(0.02) linear layers with zero bias,
        LayerNorms (1, 0), PyTorch's default convs, and SS2D's ``mamba_init``."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                m.reset_parameters()
        for m in self.modules():
            if isinstance(m, SS2D):
                m.reset_parameters()

    def init_weights(self) -> None:
        """Load ``init_cfg=dict(type='Pretrained', checkpoint=...)`` strictly, or initialise.

        As for the Vim family, a parent's generic ``init_cfg`` (e.g. TruncNormal on every
        Linear) has run before this; the backbone restores its own initialisation first.
        mmengine's stock ``Pretrained`` reads ``state_dict`` only; official VMamba files hold
        ``model``, which :func:`~amvim_mm.utils.checkpoint.load_backbone_checkpoint` reads.
        """
        self.reset_weights()
        if not self.load_pretrained():
            super().init_weights()

    def _official_keys(self, state_dict, prefix, *args, **kwargs) -> None:
        """Load pre-hook: official files into this layout, exactly.

        - the official loader's old names (``patch_embed.proj`` -> ``.0``, ``patch_embed.norm``
          -> ``.2``, ``ln_1`` -> ``norm``, ``self_attention`` -> ``op``, ``norm`` ->
          ``classifier.norm``, ``head`` -> ``classifier.head``) and the single-file model's
          ``x_proj.weight`` (K*(R+2N), E, 1) / ``dt_projs.weight`` (K*E, R, 1);
        - ``classifier.head.*`` is dropped (a classification head, not a backbone weight);
          ``classifier.norm.*`` is dropped unless ``out_type='avg_featmap'``;
        - output norms absent from an official file (it has none) keep this model's values
          (weight 1, bias 0 after initialisation), logged by name.
        """
        keys = [k for k in state_dict if k.startswith(prefix)]
        if not keys:
            return
        renames = (('patch_embed.proj.', 'patch_embed.0.'), ('patch_embed.norm.', 'patch_embed.2.'),
                   ('head.', 'classifier.head.'), ('norm.', 'classifier.norm.'))
        for k in keys:
            rest = k[len(prefix):]
            new = rest.replace('.ln_1.', '.norm.').replace('.self_attention.', '.op.')
            for old, repl in renames:
                if new.startswith(old):
                    new = repl + new[len(old):]
                    break
            v = state_dict.pop(k)
            if new.endswith('.op.x_proj.weight') or new.endswith('.op.dt_projs.weight'):
                base = new.rsplit('.', 2)[0]
                K = SS2D.num_directions
                if new.endswith('x_proj.weight'):
                    new, v = base + '.x_proj_weight', v.reshape(K, -1, v.shape[1])
                else:
                    new, v = base + '.dt_projs_weight', v.reshape(K, -1, v.shape[1])
            if new.startswith('classifier.head.') or \
                    (new.startswith('classifier.norm.') and self.out_type != 'avg_featmap'):
                continue
            state_dict[prefix + new] = v
        self.keep_missing_output_norms(state_dict, prefix, 'outnorm', 'patch_embed.0.weight')

    # ----------------------------------------------------------------- training helpers
    def frozen_parts(self) -> list:
        if self.frozen_stages < 0:
            return []
        frozen = [self.patch_embed]
        for i in range(min(self.frozen_stages, self.num_stages)):
            frozen.append(self.layers[i])
            if hasattr(self, f'outnorm{i}'):
                frozen.append(getattr(self, f'outnorm{i}'))
        return frozen

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer depth for layer-wise learning-rate decay (mmpretrain's Swin convention).

        ``num_layers = sum(depths) + 2``: the patch embed is 0, block ``j`` of stage ``i`` is
        ``sum(depths[:i]) + j + 1``, a stage's downsample belongs to its last block, and the
        output norms / classifier norm are the last.
        """
        num_layers = self.num_layers + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix):]
        if name.startswith('patch_embed'):
            return 0, num_layers
        if name.startswith('layers.'):
            parts = name.split('.')
            i = int(parts[1])
            if parts[2] == 'blocks':
                return sum(self.depths[:i]) + int(parts[3]) + 1, num_layers
            return sum(self.depths[:i + 1]), num_layers
        return num_layers - 1, num_layers

    # ----------------------------------------------------------------- token reduction
    def stage_grid(self, stage: int, size: Optional[Tuple[int, int]] = None
                   ) -> Tuple[int, int]:
        """The token grid of ``stage`` for an input of ``size`` (default ``img_size``)."""
        h, w = size or self.img_size
        if self.arch_settings['patch_embed'] == 'v2':
            h, w = (h + 1) // 2, (w + 1) // 2
            h, w = (h + 1) // 2, (w + 1) // 2
        else:
            h, w = h // 4, w // 4
        for _ in range(stage):
            h, w = (h + 1) // 2, (w + 1) // 2
        return h, w

    def reduction_domain(self) -> Tuple[int, int]:
        """(tokens, blocks) a token reducer's schedule acts on at ``img_size``: the grid and
        the depth of stage ``reduction_stage``."""
        h, w = self.stage_grid(self.reduction_stage)
        return h * w, self.depths[self.reduction_stage]

    def execution_plan(self, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
        return plan_vmamba(self, x, fused)

    def reduction_domain_note(self, tokens: int, blocks: int) -> str:
        return f'stage {self.reduction_stage} has {tokens} tokens, {blocks} blocks'

    # ----------------------------------------------------------------- forward
    #: SS2D has the masked forward a learned (pruning) reducer trains with
    supports_learned_reduction = True

    def reduction_width(self) -> int:
        return self.dims[self.reduction_stage]

    def embed(self, x: torch.Tensor, plan) -> Tuple[torch.Tensor, None]:
        """Images -> the (B, H/4, W/4, C) map of the stem."""
        return self.patch_embed(x), None

    def stages(self):
        return [layer.blocks for layer in self.layers]

    def reduction_stage_index(self) -> int:
        return self.reduction_stage

    def enter_stage(self, s: int, x: torch.Tensor, ctx) -> Tuple[torch.Tensor, ScanContext]:
        """(B, H, W, C) map -> its (B, H * W, C) tokens on the stage's grid."""
        B, H, W, C = x.shape
        return x.reshape(B, H * W, C), ScanContext((H, W), cls_index=NO_CLS, device=x.device)

    def leave_stage(self, s: int, tokens: torch.Tensor, residual, ctx: ScanContext,
                    outs: list) -> torch.Tensor:
        """The full grid back (after a token reduction), stage ``s``'s output (through
        ``outnorm{s}`` or the classifier's norm and pool), the downsample."""
        if ctx.reduced:
            tokens = restore_grid(ctx, tokens)
        H, W = ctx.grid
        x = tokens.reshape(tokens.shape[0], H, W, tokens.shape[-1])
        if s in self.out_indices:
            if self.out_type == 'featmap':
                outs.append(getattr(self, f'outnorm{s}')(x).permute(0, 3, 1, 2).contiguous())
            else:
                outs.append(self.classifier.norm(x).mean((1, 2)))
        return self.layers[s].downsample(x)

    def is_output_block(self, i: int) -> bool:
        return False        # outputs per stage (leave_stage)

    # ----------------------------------------------------------------- FLOPs
    #: the conventions :meth:`flops` counts in (see :mod:`amvim_mm.analysis.vmamba_flops`)
    flops_conventions = FLOPS_CONVENTIONS
    default_flops_convention = 'official'

    def _stage_plan(self, i: int, M: int, reducer) -> Tuple[List[int], List[int], float]:
        """(removals, tokens per block, realised ratio) of stage ``i`` with ``M`` tokens."""
        depth = self.depths[i]
        if i != self.reduction_stage or reducer is None:
            return [], [M] * depth, 0.0
        return reducer.token_plan(M, depth)    # a dynamic reducer's: the means per image

    def flops(self, input_shape: Tuple[int, int], reducer, num_classes: int, convention: str,
              measure: Callable[[], float]) -> Dict[str, object]:
        """FLOPs for one (H, W) image with ``reducer`` (see
        :func:`amvim_mm.analysis.flops.backbone_flops`; ``measure``: mmengine's count)."""
        H, W = input_shape
        official = convention == 'official'
        ln = 5 if official else 0                 # fvcore: 5 * numel per affine LayerNorm
        cfg = self.arch_settings
        embed, h, w = stem_flops(cfg['patch_embed'], self.in_channels, self.embed_dims, H, W, ln)
        stage_flops, tokens, stage_tokens = [], [], []
        removals, realised = [], 0.0
        for i, layer in enumerate(self.layers):
            M = h * w
            stage_tokens.append(M)
            rem, counts, ratio = self._stage_plan(i, M, reducer)
            if i == self.reduction_stage and reducer is not None:
                removals, realised = rem, ratio
                if hasattr(reducer, 'extra_flops'):      # a learned reducer's own layers
                    embed += reducer.extra_flops(M, self.depths[i])
            tokens.extend(counts)
            f = 0.0
            for blk, L in zip(layer.blocks, counts):
                f += blk.flops(L, official)
            if i < self.num_stages - 1:
                down, h, w = downsample_flops(cfg['downsample'], self.dims[i], self.dims[i + 1],
                                              h, w, ln)
                f += down
            stage_flops.append(f)
        total = embed + sum(stage_flops)
        D = self.dims[-1]
        if num_classes:
            total += ln * D * h * w + (D * h * w if official else 0) + D * num_classes
        if convention == 'mmengine':
            total = measure() + (D * num_classes if num_classes else 0)
            stage_flops = []
        return dict(gflops=total / 1e9, stage_gflops=[f / 1e9 for f in stage_flops],
                    tokens=tokens, stage_tokens=stage_tokens, removals=removals,
                    realised_ratio=realised, reduction_stage=self.reduction_stage,
                    convention=self.flops_conventions[convention])

    def last_featmap(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's output as a (B, 8C, h, w) map, before any output norm (for
        analyses such as the effective receptive field)."""
        self.check_images(x)
        return self.run_stages(x, masked=False)[2].permute(0, 3, 1, 2)
