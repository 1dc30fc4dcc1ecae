"""Vim's bidirectional Mamba mixer, generalised to any number of scan paths given as data."""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from amvim_mm.ops.causal_conv1d import causal_conv1d_fn
from amvim_mm.ops.cpu_mixer import cpu_mixer_forward
from amvim_mm.ops.fused_mixer import (autocast_dtype, fused_mixer_forward, pack_mixer_weights,
                                      stack_mixer_params)
from amvim_mm.ops.fused_mixer_autograd import fused_mixer_train
from amvim_mm.ops.selective_scan import aligned_selective_scan, selective_scan_fn
from ..execution import (CPU, TRITON, TRITON_TRAIN, BlockFacts, Choice, MixerFacts,
                         call_facts, plan_vim)
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import is_reverse, masked_path_permutation, scan_rank_on


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
        fused: the fused Triton path (:mod:`amvim_mm.ops.fused_mixer`; under autograd
            :mod:`amvim_mm.ops.fused_mixer_autograd`): ``None`` (automatic: on for CUDA
            tensors when Triton imports and no scan backend was forced by argument or
            ``AMVIM_SCAN_BACKEND``; in inference also only where the table of
            :func:`~amvim_mm.ops.scan_choice.auto_scan_choice` does not name the mamba-ssm
            kernels for this batch, width and length; in training only under 16-bit autocast
            with enough tokens: :func:`~amvim_mm.ops.fused_mixer_autograd.
            auto_prefers_fused_training`), ``True`` (always; in training it halves the
            activation memory; CPU tensors then run Triton's interpreter, for tests) or
            ``False`` (never; the fused CPU mixer stays off too). ``AMVIM_FUSED_MIXER=0/1``
            overrides ``None``. Which route a call takes is the forward's execution plan's
            (:mod:`amvim_mm.models.execution`); ToP's alignment and importance scores run on
            every inference route (under autograd on the PyTorch path).
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
                  gap_delta: str = 'bias', mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Run path ``k`` on ``xz`` (B, 2E, L), already in the path's order -> y (B, E, L).

        Channel-first like the official code, so ``x``, ``z`` and ``delta`` reach the scan with
        unit stride along L (no copies). ``gaps`` (B, L): pruned positions right before each
        token in this path's order; the scan then runs as if they were there with zero input
        (ToP hidden-state alignment), their step size being ``softplus(dt_bias)``
        (``gap_delta='bias'``) or the next kept token's own (``'token'``). ``mask`` (B, L): a
        keep mask multiplied into the conv output (a learned reducer's straight-through mask in
        a masked training forward, :meth:`forward_masked`).
        """
        conv, x_proj, dt_proj, A_log, D = self.path_params(k)
        Bsz, _, L = xz.shape
        x, z = xz.chunk(2, dim=1)                                       # (B, E, L) each
        x = causal_conv1d_fn(x, conv.weight, conv.bias, activation='silu')
        if mask is not None:
            x = x * mask.unsqueeze(1).to(x.dtype)
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

    def forward_masked(self, hidden: torch.Tensor, ctx: ScanContext, paths: Sequence,
                       keep: torch.Tensor) -> torch.Tensor:
        """The mixer on the full sequence with per-sample keep masks (learned reducers'
        training): equal, at the kept tokens, to the mixer on each sample's physically pruned
        sequence; the dropped tokens' outputs are zero.

        Every path scans each sample's kept tokens first, in the order inference would scan
        the survivors (:func:`~amvim_mm.models.layout.scan_orders.masked_path_permutation`),
        the dropped ones after, so that the causal conv and the scan of the kept prefix never
        see a dropped token. ``keep`` (B, L) is 1 / 0 (a float straight-through mask carries
        the gradient into the conv output and the output), the class token kept; ``ctx`` is the
        full sequence's context.
        """
        if not ctx.full_grid:
            raise ConfigError('forward_masked takes the full sequence (a full-grid context)')
        Bsz, L, _ = hidden.shape
        if keep.shape != (Bsz, L):
            raise ConfigError(f'keep must be (batch, L) = {(Bsz, L)}, got {tuple(keep.shape)}')
        kept = keep > 0.5
        xz = (self.in_proj.weight @ hidden.reshape(Bsz * L, -1).t()).view(-1, Bsz, L)
        xz = xz.transpose(0, 1)                                           # (B, 2E, L)
        ys = []
        for k, spec in enumerate(paths):
            rank = scan_rank_on(*ctx.grid, spec, hidden.device)
            perm = masked_path_permutation(rank, ctx.pos, kept, ctx.cls_index, is_reverse(spec))
            xk = torch.gather(xz, 2, perm.unsqueeze(1).expand_as(xz))
            mk = torch.gather(keep, 1, perm)
            y = self.scan_path(k, xk, mask=mk)
            ys.append(torch.empty_like(y).scatter_(2, perm.unsqueeze(1).expand_as(y), y))
        if ctx.want_importance:   # ToP importance (token order; a dropped token's is unused)
            ctx.importance = sum(y.float().clamp_min(0).sum(1) for y in ys).detach()
        out = F.linear(self.merge_paths(ys, keep).transpose(1, 2), self.out_proj.weight)
        return out * keep.unsqueeze(-1).to(out.dtype)

    def merge_paths(self, ys: List[torch.Tensor], keep: Optional[torch.Tensor] = None
                    ) -> torch.Tensor:
        """Vim's merge of (B, E, L) path outputs: their mean (the released "divide_out");
        ``keep``: the masked forward's keep mask (for merges that pool over tokens)."""
        out = ys[0]
        for y in ys[1:]:
            out = out + y
        return out / len(ys)

    def mixer_facts(self) -> MixerFacts:
        """What the execution plan needs of this mixer (:mod:`amvim_mm.models.execution`)."""
        return MixerFacts(self.fused, self.supports_fused, self.scan_backend, self.d_state,
                          self.d_inner, self.num_paths)

    def call_route(self, hidden: torch.Tensor, ctx: Optional[ScanContext],
                   seq_len: Optional[int] = None) -> Choice:
        """This mixer's route for a call outside a forward (tests, tools): the same rules as
        a forward's plan (:func:`~amvim_mm.models.execution.plan_vim`) on the call's facts
        and the mixer's own ``fused`` argument; ``seq_len``: the length the automatic choice
        is told (default ``hidden.shape[1]``)."""
        grad = torch.is_grad_enabled() and self.in_proj.weight.requires_grad
        return plan_vim(call_facts(
            hidden, self.mixer_facts(), BlockFacts(in_proj_grad=grad, params_grad=grad),
            self.training, ctx=ctx, tokens=seq_len)).block(0).mixer

    def use_fused(self, hidden: torch.Tensor, ctx: Optional[ScanContext],
                  seq_len: Optional[int] = None) -> bool:
        """Whether a call on ``hidden`` takes the Triton mixer (``ctx=None``: the forward's
        decision, without the scan context's ToP conditions)."""
        return self.call_route(hidden, ctx, seq_len).route in (TRITON, TRITON_TRAIN)

    def flops(self, L: int, convention: str = 'mamba') -> int:
        """FLOPs of the mixer on ``L`` tokens: in/out projections and per path the conv,
        x_proj, dt_proj and scan (``'mamba'``: ``9 * L * E * N``); ``'localmamba'``:
        LocalMamba's formula (conv / x_proj / dt_proj once, an ``L * D`` norm term, scan
        ``5 * L * E * N + 2 * L * E`` per path)."""
        D, E, N, R = self.embed_dims, self.d_inner, self.d_state, self.dt_rank
        K = self.path_params(0)[0].kernel_size[0]
        f = L * D * 2 * E + L * E * D                       # in_proj, out_proj
        proj = L * E * K + L * E * (R + 2 * N) + L * R * E  # conv, x_proj, dt_proj
        if convention == 'mamba':
            return f + self.num_paths * (proj + 9 * L * E * N)
        return f + L * D + proj + self.num_paths * (5 * L * E * N + 2 * L * E)

    def _apply(self, fn, *args, **kwargs):
        self._fused_cache = None   # .to() / .cuda() / .half(): restack on the next fused call
        return super()._apply(fn, *args, **kwargs)

    def fused_params(self, compute_dtype: Optional[torch.dtype] = None
                     ) -> Tuple[torch.Tensor, ...]:
        """The parameters as the fused kernels take them
        (:func:`~amvim_mm.ops.fused_mixer.pack_mixer_weights`), cached until a parameter
        changes (another tensor, or an in-place write: its ``_version``) or the module moves.

        The key is read from the mixer's and its direct submodules' parameters (walking the
        paths' parameters by name cost a noticeable share of a short ToMe block's time on a
        CPU); a mixer whose kernel parameters lie deeper is keyed on those parameters
        themselves."""
        cache = self._fused_cache
        key = self._fused_key(compute_dtype, cache is not None and cache[2])
        if cache is not None and cache[0] == key:
            return cache[1]
        packed = pack_mixer_weights([self.path_params(k) for k in range(self.num_paths)],
                                    self.in_proj.weight, self.out_proj.weight, compute_dtype)
        shallow = {id(t) for t in self._watched_params(False)}
        deep = not all(id(t) in shallow for t in self._kernel_params())
        self._fused_cache = (self._fused_key(compute_dtype, deep), packed, deep)
        return packed

    def _fused_key(self, compute_dtype: Optional[torch.dtype], deep: bool) -> tuple:
        """The identity and version of every watched parameter (:meth:`_watched_params`)."""
        flat = self._watched_params(deep)
        return (compute_dtype, tuple(map(torch.Tensor.data_ptr, flat)),
                tuple(t._version for t in flat))

    def _kernel_params(self) -> List[torch.Tensor]:
        """Every parameter :meth:`fused_params` packs, found through the paths' names."""
        owners = [p for k in range(self.num_paths) for p in self.path_params(k)]
        owners += [self.out_proj, self.in_proj]
        flat: List[torch.Tensor] = []
        for m in owners:    # leaf modules (convs, linears): their own parameters, directly
            flat.extend((p for p in m._parameters.values() if p is not None)
                        if isinstance(m, nn.Module) else (m, ))
        return flat

    def _watched_params(self, deep: bool) -> List[torch.Tensor]:
        """The tensors whose identity and version key :meth:`fused_params`' cache: the
        mixer's own and its direct submodules' parameters (``deep``: the packed ones)."""
        if deep:
            return self._kernel_params()
        return [p for m in (self, *self._modules.values()) for p in m._parameters.values()
                if p is not None]

    def forward(self, hidden: torch.Tensor, ctx: ScanContext, paths: Sequence,
                route: Optional[Choice] = None) -> torch.Tensor:
        """``route``: the mixer's route in the forward's
        :class:`~amvim_mm.models.execution.ExecutionPlan` (None: :meth:`call_route`)."""
        if len(paths) != self.num_paths:
            raise ConfigError(f'{type(self).__name__} has {self.num_paths} paths, '
                              f'got {len(paths)} scan orders')
        route = (route if route is not None else self.call_route(hidden, ctx)).route
        if route == TRITON_TRAIN:
            in_w, stacked, out_cat = stack_mixer_params(
                [self.path_params(k) for k in range(self.num_paths)], self.in_proj.weight,
                self.out_proj.weight)
            return fused_mixer_train(hidden, in_w, *stacked, ctx.path_perms(paths), out_cat)
        if route == TRITON:
            in_w, stacked, out_cat = self.fused_params(autocast_dtype(hidden.device.type))
            return _top_out(ctx, fused_mixer_forward(
                hidden, in_w, self.out_proj.weight, *stacked, ctx.path_perms(paths),
                out_proj_cat=out_cat, **_top_kwargs(ctx, paths)))
        if route == CPU:
            in_w, stacked, _ = self.fused_params()
            return _top_out(ctx, cpu_mixer_forward(hidden, in_w, self.out_proj.weight, stacked,
                                                   ctx.path_perms(paths),
                                                   **_top_kwargs(ctx, paths)))
        return self.forward_torch(hidden, ctx, paths)

    def forward_torch(self, hidden: torch.Tensor, ctx: ScanContext, paths: Sequence
                      ) -> torch.Tensor:
        """The unfused mixer in PyTorch (the reference of the other routes, and ToP's route
        under autograd)."""
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


def _top_kwargs(ctx: ScanContext, paths: Sequence) -> dict:
    """ToP's work for a fused mixer call: the paths' pruned-gap counts (P, B, L) in each path's
    order (hidden-state alignment, ``gap_delta`` as the reducer sets it) and whether the
    importance scores are wanted."""
    kw = dict(importance=True) if ctx.want_importance else {}
    if ctx.align is not None and ctx.reduced:
        kw.update(gaps=ctx.stacked_path_gaps(paths), gap_delta=ctx.align)
    return kw


def _top_out(ctx: ScanContext, out):
    """A fused call's output, the importance scores (when wanted) stored on ``ctx``."""
    if ctx.want_importance:
        out, ctx.importance = out
    return out
