"""Learned token reducers: a reducer with parameters, trained with a masked forward.

A learned reducer is a :class:`~.reducers.TokenReducer` and an ``nn.Module``: the backbone keeps
it as its ``token_reducer`` submodule (its parameters are saved, loaded and optimised with the
backbone's, under ``backbone.token_reducer.*``). It has two forwards:

* **training** (``backbone.training``): the sequence is never shortened. Before each block of
  its schedule the reducer updates a per-sample keep mask (B, L) (:meth:`LearnedReducer.decide`,
  0 / 1 with a straight-through gradient, the class token always 1), and every later block runs
  its mixer's masked forward (``BiMambaMixer.forward_masked``): each path scans a sample's kept
  tokens first, in the order inference scans the survivors, so the kept tokens get exactly
  what physically pruned inference gives them (removal semantics, DyVM's reordering); a
  dropped token's mixer output is zero, so its residual stream keeps the value it had when it
  was dropped, which is what the dense restore of inference gives it.
* **inference**: a :class:`~.reducers.TokenReducer` like the training-free ones: before the
  same blocks it picks the tokens that leave (:meth:`~.reducers.TokenReducer.select`) and the
  :class:`~.session.ReductionSession` prunes them, survivors in their original order.

Only the Vim family (Vim, AMVim, LocalVim) has the masked forward so far (the 2D convs of
PlainMamba and VMamba have no exact mask yet); other backbones refuse a learned reducer at
build time.
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError
from amvim_mm.token_layout import drop_cls, insert_cls
from .keep_predictor import KeepPredictor, gumbel_keep
from .learned_losses import keep_ratio_loss
from .reducers import TOKEN_REDUCERS, TokenReducer, _patch_indices
from .settings import check_number
from ..layout.sorting import stable_argsort


def with_class_token(patch_keep: torch.Tensor, cls_index: int) -> torch.Tensor:
    """(B, M) keep mask of the patch tokens -> (B, L) of the sequence (the class token, when
    ``cls_index >= 0``, inserted at its index with 1)."""
    return insert_cls(patch_keep, patch_keep.new_ones(patch_keep.shape[0], 1), cls_index)


def patch_tokens(stream: torch.Tensor, cls_index: int) -> torch.Tensor:
    """(B, L, D) full sequence -> (B, M, D) its patch tokens (raster order)."""
    return drop_cls(stream, cls_index)


class Decision(NamedTuple):
    """A training-time decision before a block: the new (B, L) keep mask of the sequence and,
    for merging reducers, ``mix``: the in-place merge to apply to both streams ((B, L, D) ->
    (B, L, D), linear), or None."""

    keep: torch.Tensor
    mix: Optional[Callable[[torch.Tensor], torch.Tensor]] = None


class LearnedReducer(nn.Module, TokenReducer):
    """Base of learned reducers (see the module docstring).

    Subclasses build their parameters in :meth:`bind` (they need the backbone's width), make
    the training decisions in :meth:`decide` and the inference choice in :meth:`select`, and
    give their training objective's own terms in :meth:`loss_terms`.
    """

    learned = True
    #: dynamic reducers: the session asks :meth:`step` before every block of
    #: :meth:`decision_blocks` (inference image by image, see ``VimFamilyBackbone.forward``)
    dynamic = False

    def __init__(self, **schedule) -> None:
        nn.Module.__init__(self)
        TokenReducer.__init__(self, **schedule)
        self.bound_dims: Optional[int] = None
        #: per decision of the last training forward: the patch tokens' cumulative keep (B, M)
        self.decisions: List[torch.Tensor] = []

    def bind(self, backbone) -> None:
        """Build the parameters for ``backbone`` (called by its ``set_token_reduction``); a
        reducer bound to one width cannot move to another."""
        dims = backbone.reduction_width()
        if self.bound_dims is not None and self.bound_dims != dims:
            raise ConfigError(f'{type(self).__name__} was built for width {self.bound_dims}, '
                              f'not {dims}')
        if self.bound_dims is None:
            self.build(dims, backbone.reduction_domain()[1])
            self.bound_dims = dims
            p = next(backbone.parameters(), None)
            if p is not None:
                self.to(p.device)

    def build(self, embed_dims: int, depth: int) -> None:
        raise NotImplementedError

    def decision_blocks(self, num_patches: int, depth: int) -> List[int]:
        """The blocks before which a decision is taken (where the schedule removes tokens)."""
        return [i for i, k in enumerate(self.removals(num_patches, depth)) if k]

    def begin(self, batch: int, num_patches: int, depth: int, device) -> None:
        """Start a training forward: all patch tokens kept."""
        self.decisions = []
        self._blocks = self.decision_blocks(num_patches, depth)
        self._policy = torch.ones(batch, num_patches, device=device)

    def decide(self, block: int, stream: torch.Tensor, ctx, layer) -> Optional[Decision]:
        """Before block ``block`` of a training forward: the :class:`Decision` (the new (B, L)
        keep mask of the sequence), or None when no decision is taken here. ``stream``: the
        block's input ``residual + hidden`` (B, L, D); ``layer``: the block."""
        raise NotImplementedError

    def loss_terms(self) -> Dict[str, torch.Tensor]:
        """The reducer's own training terms for the last training forward (weighted)."""
        return {}


@TOKEN_REDUCERS.register_module(name='DynamicViT')
class DynamicViTReducer(LearnedReducer):
    """DynamicViT for scans: keep predictors before chosen blocks, Gumbel decisions in training.

    Before the block after each of ``locations`` a :class:`~.keep_predictor.KeepPredictor`
    (DynamicViT's ``PredictorLG``) scores the patch tokens of the stream ``residual + hidden``
    (DyVM's input), the class token excluded; its global half is pooled over the tokens still
    kept. Schedule as the official code: after location ``s`` (0-based) ``int(M * rho^(s+1))``
    of the ``M`` patch tokens remain (Vim-S: ``keep_rate=0.7, locations=(5, 11, 17)``, i.e.
    before blocks 6, 12 and 18 as in DyVM, keeping 137 / 96 / 67 of 196).

    Training: a hard Gumbel-softmax sample per token (``tau``), straight-through, multiplied
    into the previous decision; the masks enter the scan exactly (module docstring).
    :meth:`loss_terms` gives the keep-ratio loss ``ratio_weight / S * sum_s mean_b (mean_n D_s -
    rho^(s+1))^2``; classification and distillation terms belong to the model wrapper
    (:class:`~amvim_mm.models.reducer_finetuner.ReducerFineTuner`).

    Inference: the ``k`` tokens with the lowest keep log-probability leave (``k`` from the
    schedule); the survivors stay in their original order (DynamicViT itself keeps score order,
    which would scramble a scan), the class token at their middle.

    Args:
        keep_rate: rho, in (0, 1] (1: every token kept).
        locations: the blocks after which tokens are dropped (distinct ints >= 0).
        tau: Gumbel-softmax temperature, in (0, inf) (at inf the hard sample ignores the
            scores and keeps every token).
        ratio_weight: weight of the keep-ratio loss (DynamicViT's ``--ratio_weight``, 2.0), in
            [0, inf) (0: the predictors learn from the other terms alone).
    """

    def __init__(self, keep_rate: float = 0.7, locations: Sequence[int] = (5, 11, 17),
                 tau: float = 1.0, ratio_weight: float = 2.0) -> None:
        super().__init__(keep_rate=keep_rate, locations=locations)
        locs = list(self.schedule.locations)
        if len(set(locs)) != len(locs):
            raise ConfigError(f'DynamicViT: locations must be distinct, got {locs}')
        self.tau = check_number('DynamicViT', 'tau', tau, low=0, low_open=True)
        self.ratio_weight = check_number('DynamicViT', 'ratio_weight', ratio_weight, low=0)
        self.predictors = nn.ModuleList()

    def build(self, embed_dims: int, depth: int) -> None:
        self.predictors.extend(KeepPredictor(embed_dims) for _ in self.schedule.locations)

    def keep_ratios(self) -> List[float]:
        """The target kept fractions rho, rho^2, ... (one per location)."""
        rho = self.schedule.keep_rate
        return [rho ** (s + 1) for s in range(len(self.schedule.locations))]

    def removals(self, num_patches: int, depth: int):
        """``int(M * rho^(s+1))`` patch tokens kept after location ``s`` (DynamicViT's count,
        relative to the initial tokens; ToP chains ``int(n * rate)`` instead)."""
        locs = sorted(self.schedule.locations)
        out, n = [0] * depth, num_patches
        for loc, ratio in zip(locs, self.keep_ratios()):
            if loc >= depth - 1:
                raise ConfigError(f'DynamicViT: location {loc} has no block after it (depth '
                                  f'{depth})')
            keep = int(num_patches * ratio)
            if keep < 1:
                raise ConfigError(f'DynamicViT: keep_rate {self.schedule.keep_rate} leaves no '
                                  f'token after block {loc} ({num_patches} patches)')
            out[loc + 1] = n - keep
            n = keep
        return out

    def config(self) -> dict:
        """The config dict that builds this reducer (for result files)."""
        return dict(type='DynamicViT', keep_rate=self.schedule.keep_rate,
                    locations=list(self.schedule.locations), tau=self.tau,
                    ratio_weight=self.ratio_weight)

    def extra_flops(self, num_patches: int, depth: int) -> float:
        """Multiply-adds of the keep predictors for one image (their linear layers, on the
        tokens present at each decision)."""
        C = self.bound_dims or 0
        per_token = C * C + C * (C // 2) + (C // 2) * (C // 4) + (C // 4) * 2
        n, total = num_patches, 0
        for k in self.removals(num_patches, depth):
            if k:
                total += n * per_token
                n -= k
        return float(total)

    def _stage(self, block: int) -> int:
        return sorted(self.schedule.locations).index(block - 1)

    def decide(self, block, stream, ctx, layer):
        if block not in self._blocks:
            return None
        s = self._stage(block)
        x = patch_tokens(stream, ctx.cls_index)
        policy = self._policy.unsqueeze(-1)
        logp = self.predictors[s](x, policy.to(x.dtype))
        keep = gumbel_keep(logp.float(), policy, self.tau).squeeze(-1)       # (B, M)
        self._policy = keep
        self.decisions.append(keep)
        return Decision(with_class_token(keep, ctx.cls_index))

    def loss_terms(self):
        if not self.decisions:
            return {}
        ratio = keep_ratio_loss(self.decisions, self.keep_ratios()[:len(self.decisions)])
        return dict(loss_keep_ratio=self.ratio_weight * ratio / len(self.decisions))

    def select(self, block, k, stream, ctx, layer):
        idx = _patch_indices(ctx)
        x = torch.gather(stream.total(), 1,
                         idx.unsqueeze(-1).expand(-1, -1, stream.hidden.shape[-1]))
        policy = x.new_ones(x.shape[0], x.shape[1], 1)
        score = self.predictors[self._stage(block)](x, policy)[..., 0]
        pick = stable_argsort(score.float(), dim=1)[:, :k]     # lowest keep score first
        removed = torch.gather(idx, 1, pick)
        return removed, torch.full_like(removed, -1), None
