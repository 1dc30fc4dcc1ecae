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
import numbers
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import MMLogger
from mmengine.model import BaseModule

from amvim_mm.errors import (BackendUnavailableError, CheckpointMismatchError, ConfigError,
                             LookupConfigError)
from amvim_mm.ops.backends import (check_backend_usable, log_choice_once, mamba_selective_scan,
                                   requested_backend)
from amvim_mm.ops.causal_conv1d import causal_conv1d_fn
from amvim_mm.ops.fused_embed import fused_patch_embed
from amvim_mm.ops.fused_mixer import (auto_prefers_fused, autocast_dtype, fused_add_rmsnorm,
                                      fused_mixer_available, fused_mixer_forward, fused_requested)
from amvim_mm.ops.selective_scan import aligned_selective_scan, selective_scan_fn
from amvim_mm.ops.token_merge import apply_merge_plan
from amvim_mm.token_layout import NO_CLS, cls_index_for, cls_slot
from amvim_mm.utils.checkpoint import load_backbone_checkpoint
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import normalize_order
from ..reduction import ReductionSession, build_reducer, restore_grid
from .layers import DropPath, PatchEmbed, RMSNorm, infer_square_grid, resize_pos_embed

OUT_TYPES = ('cls_token', 'featmap', 'raw')


class BiMambaMixer(nn.Module):
    """Vim's bidirectional Mamba mixer ("bimamba v2"), generalised to paths given as data.

    Each path has its own ``conv1d``, ``x_proj``, ``dt_proj``, ``A_log`` and ``D``; ``in_proj`` and
    ``out_proj`` are shared. Path ``k`` uses the parameter-name suffix ``suffixes[k]``
    (Vim: ``''`` and ``'_b'``, giving ``conv1d``/``conv1d_b``, ``A_log``/``A_b_log``...).

    Args:
        embed_dims: model width D.
        d_state: SSM state size N.
        d_conv: causal depthwise conv width.
        expand: inner width E = expand * D.
        dt_rank: rank R of the delta projection; ``None`` means ceil(D / 16).
        suffixes: one parameter-name suffix per path.
        scan_backend: selective-scan backend (``None``: automatic, see ``amvim_mm.ops``).
        fused: the fused Triton inference path (:mod:`amvim_mm.ops.fused_mixer`): ``None``
            (automatic: on for CUDA tensors when no gradient is wanted, Triton imports, no
            scan backend was forced by argument or ``AMVIM_SCAN_BACKEND``, and the batch is
            large enough - below batch x E = 16 x 384 the mamba-ssm kernels, when installed,
            are faster on long sequences), ``True`` (always
            when no gradient is wanted; CPU tensors then run Triton's interpreter, for tests) or
            ``False`` (never). ``AMVIM_FUSED_MIXER=0/1`` overrides ``None``. Training, ToP
            alignment and importance scores always take the unfused path.
    """

    #: the fused path computes the mean of the paths; subclasses that merge otherwise say False
    supports_fused = True

    def __init__(self,
                 embed_dims: int,
                 d_state: int = 16,
                 d_conv: int = 4,
                 expand: int = 2,
                 dt_rank: Optional[int] = None,
                 suffixes: Sequence[str] = ('', '_b'),
                 dt_min: float = 0.001,
                 dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4,
                 scan_backend: Optional[str] = None,
                 fused: Optional[bool] = None) -> None:
        super().__init__()
        self.fused = fused
        self._fused_cache: Optional[tuple] = None
        self.embed_dims = embed_dims
        self.d_state = d_state
        self.d_inner = E = expand * embed_dims
        self.dt_rank = R = dt_rank if dt_rank is not None else math.ceil(embed_dims / 16)
        self.suffixes = tuple(suffixes)
        self.scan_backend = scan_backend
        self.dt_init_range = (dt_min, dt_max, dt_init_floor)
        self.in_proj = nn.Linear(embed_dims, 2 * E, bias=False)
        self.out_proj = nn.Linear(E, embed_dims, bias=False)
        self.num_paths = num_paths = len(self.suffixes)
        for k in range(num_paths):
            names = self.path_param_names(k)
            self.add_module(names['conv1d'],
                            nn.Conv1d(E, E, d_conv, groups=E, padding=d_conv - 1))
            self.add_module(names['x_proj'], nn.Linear(E, R + 2 * d_state, bias=False))
            dt_proj = nn.Linear(R, E, bias=True)
            self._init_dt_proj(dt_proj)
            self.add_module(names['dt_proj'], dt_proj)
            self.register_parameter(names['A_log'], nn.Parameter(torch.empty(E, d_state)))
            self.register_parameter(names['D'], nn.Parameter(torch.empty(E)))
            self._init_ssm(k)

    def _init_dt_proj(self, dt_proj: nn.Linear) -> None:
        """Mamba's dt init: weight ~ U(-R^-0.5, R^-0.5); bias = softplus^-1(dt), dt log-uniform
        in [dt_min, dt_max] (the per-channel step sizes 0.001-0.1 of a fresh model)."""
        dt_min, dt_max, floor = self.dt_init_range
        R = dt_proj.in_features
        nn.init.uniform_(dt_proj.weight, -R**-0.5, R**-0.5)
        dt = torch.exp(torch.rand(dt_proj.out_features) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min)).clamp(min=floor)
        with torch.no_grad():
            dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _init_ssm(self, k: int) -> None:
        """S4D-real A (``A_log = log(1..N)`` for every channel) and ``D = 1`` of path ``k``."""
        _, _, _, A_log, D = self.path_params(k)
        with torch.no_grad():
            A_log.copy_(torch.log(torch.arange(1, self.d_state + 1, dtype=torch.float32))
                        .repeat(self.d_inner, 1))
            D.fill_(1.0)

    def reset_parameters(self) -> None:
        """Initialise every parameter as a freshly built mixer has it (Mamba's scheme).

        Used by the backbone's ``init_weights`` after a parent's generic initialisation (e.g.
        TruncNormal on every Linear in an upstream config), which would otherwise leave the
        step sizes at softplus(0) = 0.69 and the projections at std 0.02.
        """
        for m in self.modules():
            if m is not self and hasattr(m, 'reset_parameters'):
                m.reset_parameters()   # nn.Linear / nn.Conv1d / nn.LayerNorm defaults
        for k in range(self.num_paths):
            self._init_dt_proj(self.path_params(k)[2])
            self._init_ssm(k)

    def path_param_names(self, k: int) -> Dict[str, str]:
        """Parameter names of path ``k`` (Vim: ``conv1d``, ``A_log``; ``conv1d_b``, ``A_b_log``)."""
        s = self.suffixes[k]
        return dict(conv1d=f'conv1d{s}', x_proj=f'x_proj{s}', dt_proj=f'dt_proj{s}',
                    A_log=f'A{s}_log', D=f'D{s}')

    def path_params(self, k: int):
        n = self.path_param_names(k)
        return (getattr(self, n['conv1d']), getattr(self, n['x_proj']),
                getattr(self, n['dt_proj']), getattr(self, n['A_log']), getattr(self, n['D']))

    def scan_path(self, k: int, xz: torch.Tensor, gaps: Optional[torch.Tensor] = None,
                  gap_delta: str = 'bias') -> torch.Tensor:
        """Run path ``k`` on ``xz`` (B, 2E, L), already in the path's order -> y (B, E, L).

        Channel-first like the official code, so ``x``, ``z`` and ``delta`` reach the scan with
        unit stride along L (no copies). ``gaps`` (B, L): pruned positions right before each
        token in this path's order; the scan then runs as if they were there with zero input
        (ToP hidden-state alignment), their step size being ``softplus(dt_bias)``
        (``gap_delta='bias'``) or the next kept token's own (``'token'``).
        """
        conv, x_proj, dt_proj, A_log, D = self.path_params(k)
        Bsz, _, L = xz.shape
        x, z = xz.chunk(2, dim=1)                                       # (B, E, L) each
        x = causal_conv1d_fn(x, conv.weight, conv.bias, activation='silu')
        x_dbl = F.linear(x.transpose(1, 2).reshape(Bsz * L, -1), x_proj.weight)
        R, N = self.dt_rank, self.d_state
        # (E, R) @ (R, B*L) -> (B, E, L) view with unit stride along L
        dt = (dt_proj.weight @ x_dbl[:, :R].t()).view(-1, Bsz, L).transpose(0, 1)
        Bm = x_dbl[:, R:R + N].view(Bsz, L, N).transpose(1, 2).contiguous()
        Cm = x_dbl[:, R + N:].view(Bsz, L, N).transpose(1, 2).contiguous()
        A = -torch.exp(A_log.float())
        if gaps is None:
            return selective_scan_fn(x, dt, A, Bm, Cm, D.float(), z,
                                     delta_bias=dt_proj.bias.float(), delta_softplus=True,
                                     backend=self.scan_backend)
        g = gaps.unsqueeze(1).to(torch.float32)                         # (B, 1, L)
        bias = dt_proj.bias.float()
        if gap_delta == 'bias':
            step = F.softplus(bias)[None, :, None]
        else:
            step = F.softplus(dt.float() + bias[None, :, None])
        return aligned_selective_scan(x, dt, A, Bm, Cm, D.float(), z, delta_bias=bias,
                                      gap_delta=g * step, backend=self.scan_backend)

    def merge_paths(self, ys: List[torch.Tensor]) -> torch.Tensor:
        """Vim's merge of (B, E, L) path outputs: their mean (the released "divide_out")."""
        out = ys[0]
        for y in ys[1:]:
            out = out + y
        return out / len(ys)

    def use_fused(self, hidden: torch.Tensor, ctx: Optional[ScanContext]) -> bool:
        """Whether this call takes the fused inference path (see ``fused`` in the class doc).

        ``ctx=None`` asks about the block's fused add + RMSNorm (no scan-context conditions).
        """
        if ctx is not None and self._ctx_needs_unfused(ctx):
            return False
        setting = fused_requested(self.fused)
        if setting is False or not self.supports_fused:
            return False
        if torch.is_grad_enabled() and (hidden.requires_grad or self.in_proj.weight.requires_grad):
            return False
        if setting is None:
            if not hidden.is_cuda or requested_backend(self.scan_backend) != 'auto':
                return False
            if self.d_state & (self.d_state - 1):
                return False
            if not auto_prefers_fused(hidden.shape[0], self.d_inner,
                                      mamba_selective_scan()[0] is not None):
                return False
            ok = fused_mixer_available('cuda')[0]
            if ok:
                log_choice_once('mixer', 'fused triton', 'inference')
            return ok
        ok, reason = fused_mixer_available(hidden.device.type)
        if not ok:
            raise BackendUnavailableError(f'the fused mixer was requested (fused=True or '
                                          f'AMVIM_FUSED_MIXER=1) but is not usable: {reason}')
        return True

    @staticmethod
    def _ctx_needs_unfused(ctx: ScanContext) -> bool:
        """ToP's importance scores and hidden-state alignment exist on the unfused path only."""
        return ctx.want_importance or (ctx.align is not None and ctx.reduced)

    def _apply(self, fn, *args, **kwargs):
        self._fused_cache = None   # .to() / .cuda() / .half(): restack on the next fused call
        return super()._apply(fn, *args, **kwargs)

    def fused_params(self, compute_dtype: Optional[torch.dtype] = None
                     ) -> Tuple[torch.Tensor, ...]:
        """The parameters as the fused kernels take them (cached until a parameter changes):
        ``(in_proj, stacked per-path tensors, out_proj_cat)``.

        ``out_proj_cat`` is ``out_proj`` repeated per path and scaled by 1 / P (Vim's mean of
        the paths). ``compute_dtype`` (the autocast dtype, if any): the matmul weights are
        cast once here instead of by autocast at every call. Zero padding for aligned GEMMs:
        the low rank ``R`` of ``dt`` is rounded up to a multiple of 8 (zero rows in ``x_proj``
        after its first ``R`` rows, zero columns in ``dt_proj``: the same ``delta``; with
        Vim-T's R = 12 the ``dt_proj`` GEMM ran a slow 2-element-aligned cuBLAS kernel), and
        ``x_proj``'s rows to a multiple of 8 (16-byte rows of ``x_dbl``; the kernels read ``B``
        and ``C`` by offset).
        """
        params = [p for k in range(self.num_paths) for p in self.path_params(k)]
        params += [self.out_proj, self.in_proj]
        flat = []
        for m in params:
            flat.extend(m.parameters() if isinstance(m, nn.Module) else (m, ))
        key = (compute_dtype, ) + tuple((t.data_ptr(), t._version, t.dtype) for t in flat)
        if self._fused_cache is not None and self._fused_cache[0] == key:
            return self._fused_cache[1]
        with torch.no_grad():
            def mm(t):   # a matmul operand, in the dtype autocast would give it
                return t if compute_dtype is None else t.to(compute_dtype)

            per = [self.path_params(k) for k in range(self.num_paths)]
            x_proj = torch.stack([x.weight for _, x, *_ in per])               # (P, R+2N, E)
            dt_w = torch.stack([d.weight for _, _, d, *_ in per]).float()      # (P, E, R)
            R = dt_w.shape[-1]
            pad_r = -R % 8
            if pad_r:
                x_proj = torch.cat([x_proj[:, :R], x_proj.new_zeros(
                    x_proj.shape[0], pad_r, x_proj.shape[2]), x_proj[:, R:]], 1)
                dt_w = F.pad(dt_w, (0, pad_r))
            pad = -x_proj.shape[1] % 8
            if pad:
                x_proj = F.pad(x_proj, (0, 0, 0, pad))
            stacked = (
                torch.stack([c.weight[:, 0] for c, *_ in per]),               # (P, E, K)
                torch.stack([c.bias for c, *_ in per]),                       # (P, E)
                mm(x_proj),                                                   # (P, R'+2N+pad, E)
                mm(dt_w),                                                     # (P, E, R')
                torch.stack([d.bias for _, _, d, *_ in per]).float(),         # (P, E)
                torch.stack([-torch.exp(a.float()) for *_, a, _ in per]),     # (P, E, N)
                torch.stack([d for *_, d in per]).float(),                    # (P, E)
            )
            # Vim's mean of the paths folded into out_proj: (Dm, P * E)
            out_cat = torch.cat([self.out_proj.weight] * self.num_paths, 1) / self.num_paths
            cached = (mm(self.in_proj.weight), stacked, mm(out_cat))
        self._fused_cache = (key, cached)
        return cached

    def forward(self, hidden: torch.Tensor, ctx: ScanContext, paths: Sequence,
                fused: Optional[bool] = None) -> torch.Tensor:
        """``fused``: the block's answer of ``use_fused(hidden, None)``, if it has it (saves
        asking twice per block); the scan-context conditions are checked here."""
        if len(paths) != self.num_paths:
            raise ConfigError(f'{type(self).__name__} has {self.num_paths} paths, '
                              f'got {len(paths)} scan orders')
        if fused is None:
            fused = self.use_fused(hidden, ctx)
        elif fused:
            fused = not self._ctx_needs_unfused(ctx)
        if fused:
            in_w, stacked, out_cat = self.fused_params(autocast_dtype(hidden.device.type))
            return fused_mixer_forward(hidden, in_w, self.out_proj.weight, *stacked,
                                       ctx.path_perms(paths), out_proj_cat=out_cat)
        Bsz, L, _ = hidden.shape
        # (2E, D) @ (D, B*L) -> (B, 2E, L) view with unit stride along L (official layout)
        xz = (self.in_proj.weight @ hidden.reshape(Bsz * L, -1).t()).view(-1, Bsz, L)
        xz = xz.transpose(0, 1)
        ys = []
        for k, spec in enumerate(paths):
            index = ctx.path_index(spec)
            y = self.scan_path(k, index.to_path_cf(xz), ctx.path_gaps(spec), ctx.align or 'bias')
            ys.append(index.to_tokens_cf(y))
        if ctx.want_importance:
            # ToP importance: sum over channels of max(0, y), both paths, token order
            ctx.importance = sum(y.float().clamp_min(0).sum(1) for y in ys).detach()
        return F.linear(self.merge_paths(ys).transpose(1, 2), self.out_proj.weight)


class VimBlock(nn.Module):
    """``residual = residual + drop_path(h); h = mixer(norm(residual))`` with an fp32 residual."""

    def __init__(self, mixer: nn.Module, embed_dims: int, paths: Sequence,
                 drop_path: float = 0., norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = RMSNorm(embed_dims, eps=norm_eps)
        self.mixer = mixer
        self.drop_path = DropPath(drop_path)
        self.path_keys = tuple(normalize_order(p) for p in paths)   # validated once
        self.paths = tuple(dict(k) for k in self.path_keys)

    def forward(self, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                ctx: ScanContext, merge=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``merge``: a ToMe step planned for this block
        (:func:`~amvim_mm.models.reduction.state.plan_merge_step`): the streams come in at the
        old length and the merge happens in the fused add + RMSNorm."""
        fused = self.mixer.use_fused(hidden, None)
        if fused and (not self.training or self.drop_path.drop_prob == 0):
            # inference: residual add + RMSNorm in one Triton pass (amvim_mm.ops.fused_mixer)
            normed, residual = fused_add_rmsnorm(hidden, residual, self.norm.weight,
                                                 self.norm.eps, merge=merge)
            return self.mixer(normed, ctx, self.path_keys, fused=True), residual
        if merge is not None:
            hidden, residual = apply_merge_plan(hidden, residual, merge), None
        residual = hidden if residual is None else residual + self.drop_path(hidden)
        hidden = self.norm(residual.to(self.norm.weight.dtype))
        residual = residual.float()
        return self.mixer(hidden, ctx, self.path_keys, fused=fused), residual


def _canonical_arch(arch_zoo: Dict[str, dict], arch: Union[str, dict],
                    name: str) -> Dict[str, object]:
    aliases = {}
    for key, cfg in arch_zoo.items():
        for alias in cfg.get('aliases', (key, )):
            aliases[alias] = key
    if isinstance(arch, str):
        key = aliases.get(arch.lower())
        if key is None:
            raise LookupConfigError(f'unknown {name} arch {arch!r}; choose one of '
                                    f'{sorted(aliases)} or pass a dict with the keys '
                                    f'{sorted(REQUIRED_ARCH_KEYS)}')
        cfg = {k: v for k, v in arch_zoo[key].items() if k != 'aliases'}
        return cfg
    if not isinstance(arch, dict):
        raise ConfigError(f'{name} arch must be a name or a dict, got {type(arch).__name__}')
    missing = REQUIRED_ARCH_KEYS - set(arch)
    unknown = set(arch) - REQUIRED_ARCH_KEYS - OPTIONAL_ARCH_KEYS
    if missing or unknown:
        raise ConfigError(
            f'custom {name} arch {arch!r}: '
            + (f'missing keys {sorted(missing)}; ' if missing else '')
            + (f'unknown keys {sorted(unknown)}; ' if unknown else '')
            + f'required {sorted(REQUIRED_ARCH_KEYS)}, optional {sorted(OPTIONAL_ARCH_KEYS)}')
    for k, v in arch.items():
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f'custom {name} arch: {k} must be a positive int, got {v!r}')
    cfg = dict(d_state=16, d_conv=4, expand=2)
    cfg.update(arch)
    cfg.setdefault('dt_rank', math.ceil(cfg['embed_dims'] / 16))
    return cfg


REQUIRED_ARCH_KEYS = frozenset({'embed_dims', 'num_layers'})
OPTIONAL_ARCH_KEYS = frozenset({'d_state', 'd_conv', 'expand', 'dt_rank'})


def _is_int(v) -> bool:
    """An int-like value (Python or NumPy integer), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _positive_int(name: str, arg: str, v) -> int:
    if not _is_int(v) or v < 1:
        raise ConfigError(f'{name}: {arg} must be a positive int, got {v!r}')
    return int(v)


def _size_pair(name: str, arg: str, v) -> Tuple[int, int]:
    """An int or a pair of ints, all positive -> (H, W)."""
    pair = (v, v) if _is_int(v) else v
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or \
            not all(_is_int(x) and x >= 1 for x in pair):
        raise ConfigError(f'{name}: {arg} must be a positive int or a pair (H, W) of positive '
                          f'ints, got {v!r}')
    return int(pair[0]), int(pair[1])


def _rate(name: str, arg: str, v) -> float:
    """A probability in [0, 1) (dropout, stochastic depth)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
        raise ConfigError(f'{name}: {arg} must be a number in [0, 1), got {v!r}')
    return float(v)


class VimFamilyBackbone(BaseModule):
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
            or ``'raw'`` (B, L, D) with it. The output of block ``i`` is the residual stream
            ``residual + h``; after the last block it goes through ``norm_f`` when
            ``final_norm`` (so the last ``cls_token`` is the official classifier input).
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
        norm_eps: RMSNorm epsilon.
        token_reduction: switch on a token reducer, e.g. ``dict(type='ToMe', ratio=0.17)``
            (see :mod:`amvim_mm.models.reduction`); validated at build time for ``img_size``.
            Dense outputs (``featmap``) are restored to the full grid; ``raw`` returns the
            reduced sequence. The sequence length seen by each block of the last forward is in
            ``self.token_counts``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH[, strict=True])`` loads an official
            Vim file or one of ours strictly (see
            :func:`amvim_mm.utils.checkpoint.load_backbone_checkpoint`).

    Every argument is checked at build time (a :class:`~amvim_mm.errors.ConfigError` names the
    argument, the value and what is allowed); the images of each forward are checked by
    :meth:`check_images` (shape, channels, an empty batch, NaN/inf values).
    """

    arch_zoo: Dict[str, dict] = {}
    num_paths = 2

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 stride: int = 16,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'cls_token',
                 with_cls_token: bool = True,
                 final_norm: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 interpolate_mode: str = 'bicubic',
                 scan_backend: Optional[str] = None,
                 fused_mixer: Optional[bool] = None,
                 norm_eps: float = 1e-5,
                 token_reduction: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=copy.deepcopy(init_cfg))
        name = type(self).__name__
        self.arch_settings = _canonical_arch(self.arch_zoo, arch, name)
        self.embed_dims = D = self.arch_settings['embed_dims']
        self.num_layers = depth = self.arch_settings['num_layers']
        if out_type not in OUT_TYPES:
            raise ConfigError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        if out_type == 'cls_token' and not with_cls_token:
            raise ConfigError(f'{name}: out_type="cls_token" needs with_cls_token=True')
        self.out_type = out_type
        self.with_cls_token = with_cls_token
        self.final_norm = final_norm
        img_size = _size_pair(name, 'img_size', img_size)
        patch_size = _positive_int(name, 'patch_size', patch_size)
        stride = _positive_int(name, 'stride', stride)
        in_channels = _positive_int(name, 'in_channels', in_channels)
        drop_rate = _rate(name, 'drop_rate', drop_rate)
        drop_path_rate = _rate(name, 'drop_path_rate', drop_path_rate)
        self.img_size = tuple(img_size)
        self.interpolate_mode = interpolate_mode

        check_backend_usable(scan_backend, name)
        self.patch_embed = PatchEmbed(in_channels, D, patch_size, stride)
        self.patch_resolution = self.patch_embed.grid_size(*self.img_size)
        num_patches = self.patch_resolution[0] * self.patch_resolution[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, D))
        self.drop_after_pos = nn.Dropout(p=drop_rate)
        self._register_load_state_dict_pre_hook(self._prepare_pos_embed)
        self._register_load_state_dict_pre_hook(self._record_load)
        self.register_load_state_dict_post_hook(self._check_loaded)

        if _is_int(out_indices):
            out_indices = [out_indices]
        # a string is a Sequence too: '3' must not be read as block 3 (nor '10' as 1 and 0)
        if not isinstance(out_indices, Sequence) or isinstance(out_indices, (str, bytes)) \
                or len(out_indices) == 0 or not all(_is_int(i) for i in out_indices):
            raise ConfigError(f'{name}: out_indices must be an int or a non-empty sequence of '
                              f'ints, got {out_indices!r}')
        resolved = []
        for i in map(int, out_indices):
            j = depth + i if i < 0 else i
            if not 0 <= j < depth:
                raise ConfigError(f'{name}: out_indices {i} is out of range for '
                                  f'{depth} layers')
            resolved.append(j)
        self.out_indices = sorted(set(resolved))

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
        # parameters this configuration never uses stay loadable (official keys) but get no
        # gradient, so DDP does not wait for them (no find_unused_parameters needed)
        if not with_cls_token:
            self.cls_token.requires_grad_(False)
        if not final_norm:
            self.norm_f.weight.requires_grad_(False)
        self.frozen_stages = frozen_stages
        self._init_default_weights()
        self._freeze_stages()
        self.token_counts: List[int] = []
        self.set_token_reduction(token_reduction)

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
        cfg = self.init_cfg
        self.reset_weights()
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            unknown = set(cfg) - {'type', 'checkpoint', 'strict', 'prefix', 'map_location'}
            if unknown:
                raise ConfigError(f'{type(self).__name__}: init_cfg of type Pretrained does not '
                                  f'take {sorted(unknown)}')
            if not cfg.get('checkpoint'):
                raise ConfigError(f'{type(self).__name__}: init_cfg of type Pretrained needs '
                                  '"checkpoint" (a file path); use init_cfg=None to train from '
                                  'scratch')
            load_backbone_checkpoint(self, cfg['checkpoint'], strict=cfg.get('strict', True),
                                     prefix=cfg.get('prefix'))
            self._is_init = True
            return
        super().init_weights()

    def _record_load(self, state_dict, prefix, *args, **kwargs) -> None:
        """Remember where this backbone sits in a whole-model load and whether the checkpoint
        has any of its weights (checked by :meth:`_check_loaded`)."""
        self._load_prefix = prefix
        self._load_found = any(k.startswith(prefix) for k in state_dict)

    def _check_loaded(self, module, incompatible) -> None:
        """Refuse a whole-model load that would leave this backbone on random weights.

        mmengine's ``load_from`` (the libraries' own ``tools/test.py``) loads with
        ``strict=False`` and only logs missing keys. Two cases are errors here:

        - the checkpoint holds no weight of the backbone at all (e.g. a file of another model);
        - a dense model (``out_type`` other than ``cls_token``) is given a classifier's
          checkpoint (``backbone.*`` with ``head.fc.*``; official Vim ImageNet files arrive in
          this layout, see :mod:`amvim_mm.utils.compat`): its heads would stay random.
        """
        prefix = getattr(self, '_load_prefix', '')
        if not prefix:   # the backbone itself is loaded: load_state_dict's strict decides
            return
        parent = prefix[:-len('backbone.')] if prefix.endswith('backbone.') else None
        if not self._load_found:
            raise CheckpointMismatchError(
                f'the checkpoint has no weights for the {type(self).__name__} backbone (no key '
                f'starts with {prefix!r}); is it a checkpoint of this model? Backbone weights '
                "alone load with init_cfg=dict(type='Pretrained', checkpoint=...)")
        if parent is not None and self.out_type != 'cls_token' and \
                parent + 'head.fc.weight' in incompatible.unexpected_keys:
            raise CheckpointMismatchError(
                'the checkpoint is a classifier\'s (backbone + head.fc, e.g. an official Vim '
                'ImageNet file); this dense model\'s heads would stay random. Give it to the '
                "backbone (init_cfg=dict(type='Pretrained', checkpoint=...)) and train, or test "
                'a checkpoint of this model')

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
    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        self.pos_embed.requires_grad = False
        self.cls_token.requires_grad = False
        self.patch_embed.eval()
        for p in self.patch_embed.parameters():
            p.requires_grad = False
        self.drop_after_pos.eval()
        for i in range(min(self.frozen_stages, self.num_layers)):
            m = self.layers[i]
            m.eval()
            for p in m.parameters():
                p.requires_grad = False
        if self.frozen_stages >= self.num_layers:
            self.norm_f.eval()
            for p in self.norm_f.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        return self

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer depth of a parameter for layer-wise learning-rate decay.

        Returns ``(layer_depth, num_layers)`` with ``num_layers = depth + 2``: the embeddings
        are depth 0, block ``i`` is ``i + 1``, ``norm_f`` and anything after is the last.
        """
        num_layers = self.num_layers + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix):]
        if name in ('cls_token', 'pos_embed') or name.startswith('patch_embed'):
            return 0, num_layers
        if name.startswith('layers.'):
            return int(name.split('.')[1]) + 1, num_layers
        return num_layers - 1, num_layers

    # ----------------------------------------------------------------- forward
    def pos_embed_for(self, grid: Tuple[int, int]) -> torch.Tensor:
        if tuple(grid) == tuple(self.patch_resolution):
            return self.pos_embed
        return resize_pos_embed(self.pos_embed, self.patch_resolution, grid,
                                self.interpolate_mode)

    def _embed_fused(self, x: torch.Tensor) -> bool:
        pe = self.patch_embed
        p = pe.patch_size
        if self.training or pe.stride != p or p < 4 or p & (p - 1):   # the kernel's K steps
            return False
        if torch.is_grad_enabled() and (x.requires_grad or any(
                t.requires_grad for t in (pe.proj.weight, pe.proj.bias, self.pos_embed,
                                          self.cls_token))):
            return False
        if x.is_cuda and autocast_dtype('cuda') not in (torch.float16, torch.bfloat16):
            return False
        return x.dim() == 4 and self.layers[0].mixer.use_fused(x, None)

    #: check every forward's images for NaN/inf (see :meth:`check_images`); a subclass or an
    #: instance may set it to False to save the reduction and its host sync
    check_finite_input = True

    def check_images(self, x: torch.Tensor) -> Tuple[int, int]:
        """Validate a batch of images and return its patch grid.

        Raises :class:`~amvim_mm.errors.ConfigError` for anything but a (B, C, H, W) tensor with
        B >= 1, the model's C and H, W of at least one patch, and - when
        ``check_finite_input`` is True (default) - for NaN or inf values: one bad pixel would
        otherwise turn every output into NaN without a word. The finiteness test is a single
        reduction per forward (``isfinite(x).all()``, one host sync; the values are counted
        only when it fails). It is skipped while a CUDA graph is being captured (no sync is
        allowed there), while ``torch.jit`` traces or scripts the model (a traced graph could
        not keep a data-dependent check anyway) and while ``torch.compile`` traces it (a
        data-dependent branch would break the graph).
        """
        grid = self.patch_embed.check_input(x)
        if self.check_finite_input and x.is_floating_point() and not self._skip_finite_check(x):
            if not bool(torch.isfinite(x).all()):
                bad = int((~torch.isfinite(x)).sum())
                raise ConfigError(f'{type(self).__name__}: the input images hold {bad} '
                                  f'non-finite (NaN or inf) values of {x.numel()} (input shape '
                                  f'{tuple(x.shape)}); every output would be NaN')
        return grid

    @staticmethod
    def _skip_finite_check(x: torch.Tensor) -> bool:
        if torch.jit.is_tracing() or torch.jit.is_scripting():
            return True
        compiler = getattr(torch, 'compiler', None)
        if compiler is not None and hasattr(compiler, 'is_compiling') and \
                compiler.is_compiling():
            return True
        return x.is_cuda and torch.cuda.is_current_stream_capturing()

    def embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, ScanContext]:
        """Patch embed, middle class token and position embedding -> (tokens, context).

        On the fused inference path (CUDA under 16-bit autocast; any dtype in Triton's
        interpreter) this is one kernel, :func:`amvim_mm.ops.fused_embed.fused_patch_embed`.
        In fp32 on CUDA cuBLAS's fp32 GEMM stays (Triton's fp32 dot products are not faster).

        The images are checked first (:meth:`check_images`): a tensor that is not (B, C, H, W)
        with B >= 1 and the model's channel count, or that holds NaN/inf, raises
        :class:`~amvim_mm.errors.ConfigError`.
        """
        self.check_images(x)
        if self._embed_fused(x):
            pe = self.patch_embed
            grid = pe.check_input(x)
            w, b = pe.gemm_weight(autocast_dtype(x.device.type) or pe.proj.weight.dtype)
            tokens = fused_patch_embed(x, w, b, self.pos_embed_for(grid),
                                       self.cls_token if self.with_cls_token else None,
                                       pe.patch_size, grid)
            cls_index = cls_index_for(grid[0] * grid[1], self.with_cls_token)
            return tokens, ScanContext(grid, cls_index=cls_index, device=tokens.device)
        tokens, grid = self.patch_embed(x)
        B, M, _ = tokens.shape
        pos_embed = self.pos_embed_for(grid)
        mid = cls_slot(M)
        if self.with_cls_token:
            cls = self.cls_token.expand(B, -1, -1)
            tokens = torch.cat([tokens[:, :mid], cls, tokens[:, mid:]], dim=1) + pos_embed
            ctx = ScanContext(grid, cls_index=mid, device=tokens.device)
        else:
            tokens = tokens + torch.cat([pos_embed[:, :mid], pos_embed[:, mid + 1:]], 1)
            ctx = ScanContext(grid, cls_index=NO_CLS, device=tokens.device)
        return self.drop_after_pos(tokens), ctx

    def set_token_reduction(self, cfg: Optional[dict]) -> None:
        """Switch token reduction on (a config dict or reducer) or off (``None``)."""
        reducer = build_reducer(cfg)
        if reducer is not None:  # fail early on a schedule the training grid cannot give
            M = self.patch_resolution[0] * self.patch_resolution[1]
            try:
                reducer.removals(M, self.num_layers)
            except ConfigError as e:
                raise type(e)(f'{e} [{type(self).__name__} img_size={self.img_size}: {M} patch '
                              f'tokens, {self.num_layers} blocks]') from None
        self.token_reducer = reducer

    def format_output(self, stream: torch.Tensor, ctx: ScanContext, last: bool) -> torch.Tensor:
        """Turn the residual stream after a block into the requested output (for ``out_type=
        'cls_token'`` the stream is just the class token's row, (B, 1, D))."""
        B, _, D = stream.shape
        if self.out_type == 'featmap':
            if ctx.reduced:
                feat = restore_grid(ctx, stream)
            elif ctx.cls_index >= 0:
                feat = torch.cat([stream[:, :ctx.cls_index], stream[:, ctx.cls_index + 1:]], 1)
            else:
                feat = stream
            if last and self.final_norm:
                feat = self.norm_f(feat)
            H, W = ctx.grid
            return feat.transpose(1, 2).reshape(B, D, H, W).contiguous()
        if self.out_type == 'cls_token':
            if last and self.final_norm:
                stream = self.norm_f(stream)
            return stream[:, 0]
        return self.norm_f(stream) if last and self.final_norm else stream

    def block_output(self, i: int, hidden: torch.Tensor, residual: torch.Tensor,
                     ctx: ScanContext) -> torch.Tensor:
        """The output of block ``i``: the residual stream after it, formatted
        (:meth:`format_output`); for ``cls_token`` only the class token's row is formed."""
        last = i == self.num_layers - 1
        if self.out_type == 'cls_token':
            c = ctx.cls_index
            hidden, residual = hidden[:, c:c + 1], residual[:, c:c + 1]
        stream = residual + (self.drop_path(hidden) if last else hidden)
        return self.format_output(stream, ctx, last)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        hidden, ctx = self.embed(x)
        session = ReductionSession(self.token_reducer, ctx, hidden, self.num_layers,
                                   self.training)
        residual, outs, counts = None, [], []
        for i, layer in enumerate(self.layers):
            hidden, residual, merge = session.before_block(i, layer, hidden, residual)
            counts.append(hidden.shape[1] if merge is None else merge.rows.shape[1])
            hidden, residual = layer(hidden, residual, session.ctx, merge=merge)
            if i in self.out_indices:
                outs.append(self.block_output(i, hidden, residual, session.ctx))
        self.token_counts, self.last_context = counts, session.ctx
        return tuple(outs)
