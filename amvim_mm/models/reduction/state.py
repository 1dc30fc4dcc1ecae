"""The reduced token sequence: what survives, where it came from, and how to give the grid back.

The sequence always keeps the canonical layout of the Vim family: patch tokens in their original
(raster) order, each with its original grid position, and the class token at the middle index of
the patch tokens (``n // 2``). A reduction step removes patch tokens; a removed token is either
**merged** into a surviving one (size-weighted average, ToMe) or **pruned** (its last feature is
frozen in a full-grid buffer for dense restore). Both streams of a Vim block (``hidden`` and the
fp32 ``residual``) are reduced with the same assignment.

Per sample the state tracks (``M`` patches on the grid, ``L`` present tokens):

* ``pos`` (B, L): grid position of each token (-1: class token, -2: an EViT fused token);
* ``size`` (B, L): how many original patches each token stands for;
* ``source`` (B, M): index of the token that carries each original patch, -1 if pruned;
* ``frozen`` (B, M, D): the stream value of pruned patches at the time they were pruned.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch

from amvim_mm.ops import cpu_ops
from amvim_mm.ops.token_merge import plan_merge
from amvim_mm.token_layout import FUSED_POS, NO_CLS, cls_index_for, cls_slot
from ..layout.scan_context import ScanContext
from ..layout.sorting import stable_argsort


def _gather_tokens(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def init_reduction_state(ctx: ScanContext, batch: int, device) -> ScanContext:
    """Give a full-grid context the per-sample bookkeeping of a reduced one."""
    M = ctx.grid[0] * ctx.grid[1]
    pos = ctx.pos.to(device).unsqueeze(0).expand(batch, -1)
    # sequence index of each grid patch: raster order with the class token at cls_index
    seq_of_patch = torch.arange(M, device=device)
    if ctx.cls_index >= 0:
        seq_of_patch = seq_of_patch + (seq_of_patch >= ctx.cls_index).long()
    return ctx.successor(ctx.cls_index, pos.contiguous(), ctx.n_patches,
                         size=torch.ones(batch, pos.shape[1], device=device),
                         source=seq_of_patch.unsqueeze(0).expand(batch, -1).clone(),   # (B, M)
                         frozen=None, step=None)


class Streams(NamedTuple):
    """The two streams at the start of a block: ``hidden`` (the previous mixer's output) and
    the fp32 ``residual`` (None before block 0, and in families with one stream). Their sum,
    the stream a reducer looks at, is formed on the first :meth:`total` call only (the fused
    path's kernels read both) and kept in ``kept`` when given (the reduction session passes an
    empty list, so the step's selection and merge share one sum)."""

    hidden: torch.Tensor
    residual: Optional[torch.Tensor]
    kept: Optional[list] = None

    def total(self) -> torch.Tensor:
        if self.kept:
            return self.kept[0]
        t = self.hidden if self.residual is None else self.residual + self.hidden
        if self.kept is not None:
            self.kept.append(t)
        return t


def reduce_tokens(ctx: ScanContext, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                  removed: torch.Tensor, dst: torch.Tensor,
                  weight: Optional[torch.Tensor] = None, freeze_sources: bool = False,
                  merges: bool = True, fold: bool = False, prunes: Optional[bool] = None,
                  stream: Union[torch.Tensor, Streams, None] = None,
                  kernel: Optional[bool] = None
                  ) -> Tuple[torch.Tensor, Optional[torch.Tensor], ScanContext]:
    """Remove patch tokens from both streams.

    Args:
        ctx: context with reduction state (:func:`init_reduction_state`).
        hidden, residual: (B, L, D) streams (``residual`` may be None before block 0).
        removed: (B, r) sequence indices of the removed tokens (distinct, never the class
            token).
        dst: (B, r) sequence index of the surviving token each removed token merges into, or -1
            to prune it.
        weight: optional (B, L) merge weights (default: the token sizes, i.e. ToMe's
            size-weighted average).
        freeze_sources: the patches of merged tokens are frozen as if pruned instead of being
            handed to the destination (EViT: the fused token stands for no grid position).
        merges: ``False`` when every ``dst`` is -1 (pure pruning): skips the merge arithmetic.
        prunes: some ``dst`` may be -1 (None: ``not merges``); pruned patches keep their last
            feature in ``frozen`` for the dense restore only when this (or ``freeze_sources``)
            is set.
        fold: merge the summed stream ``residual + hidden`` once and return it as ``hidden``
            with ``residual=None`` (the averaging is linear, so this equals merging both
            streams, in fp32). Only valid when the next block's drop-path is the identity
            (inference); the backbone passes ``fold=not self.training``.
        stream: ``residual + hidden`` (or the :class:`Streams` that keep it), if at hand.
        kernel: a folded plain merge on :func:`~amvim_mm.ops.cpu_ops.fold_merge` (same
            bits), the plan's choice; None: where ``fold_merge_misfit`` finds nothing.

    No value is read back from the device (no host sync: a CUDA graph can capture the step);
    the Triton inference route plans the steps with :func:`plan_merge_step` instead.

    Returns:
        The reduced (hidden, residual, ctx). Survivors keep their original order and grid
        positions; the class token is put back at the middle of the patch tokens.
    """
    r = removed.shape[1]
    if r == 0:
        return hidden, residual, ctx
    if not isinstance(stream, torch.Tensor):      # None, or the Streams that keep the sum
        stream = (Streams(hidden, residual) if stream is None else stream).total()
    if fold and merges and not freeze_sources and not prunes and weight is None \
            and not ctx.has_fused \
            and (cpu_ops.fold_merge_misfit(stream) is None if kernel is None else kernel):
        # a ToMe step at CPU inference: this function's fold, compiled (same bits, one call)
        hidden, pos, size, source = cpu_ops.fold_merge(stream, ctx.size, ctx.pos, ctx.source,
                                                       removed, dst, ctx.n_patches,
                                                       ctx.cls_index)
        return hidden, None, folded_successor(ctx, r, pos, size, source)
    merged = dst >= 0
    safe_dst = dst.clamp(min=0)
    # --- merge: size-weighted average into the destination tokens, in both streams
    w = ctx.size if weight is None else weight
    w_rem = torch.gather(w, 1, removed) * merged
    w_new = w.scatter_add(1, safe_dst, w_rem)
    fold = fold and merges and not freeze_sources
    if not fold and merges:
        hidden = _merge_stream(hidden, w, w_rem, w_new, removed, safe_dst)
        residual = None if residual is None else \
            _merge_stream(residual, w, w_rem, w_new, removed, safe_dst)
    size = ctx.size.scatter_add(1, safe_dst, torch.gather(ctx.size, 1, removed) * merged)
    new_src, frozen = _hand_over(ctx, removed, dst, merged, stream, freeze_sources,
                                 (not merges if prunes is None else prunes) or freeze_sources)
    new_order, new_cls, new_index = _compact(ctx, removed)
    new_src = torch.where(new_src >= 0, torch.gather(new_index, 1, new_src.clamp(min=0)),
                          new_src)
    if fold:
        hidden = _fold_scatter(stream, w, w_new, removed, safe_dst, merged, new_index,
                               new_order.shape[1])
        residual = None
    else:
        hidden = _gather_tokens(hidden, new_order)
        residual = _gather_tokens(residual, new_order) if residual is not None else None
    new = ctx.successor(new_cls, torch.gather(ctx.pos, 1, new_order), ctx.n_patches - r,
                        size=torch.gather(size, 1, new_order), source=new_src, frozen=frozen,
                        step='reduce')
    return hidden, residual, new


def _merge_stream(t: torch.Tensor, w: torch.Tensor, w_rem: torch.Tensor, w_new: torch.Tensor,
                  removed: torch.Tensor, safe_dst: torch.Tensor) -> torch.Tensor:
    """One stream with each removed token's weighted value added into its destination
    (weighted average, in fp32, back in the stream's dtype; a token whose weights are all
    zero, e.g. an EViT survivor of importance 0, keeps its value)."""
    D = t.shape[-1]
    tf = t.float()
    acc = tf * w.unsqueeze(-1)
    add = _gather_tokens(tf, removed) * w_rem.unsqueeze(-1)
    acc = acc.scatter_add(1, safe_dst.unsqueeze(-1).expand(-1, -1, D), add)
    out = acc / w_new.clamp_min(1e-12).unsqueeze(-1)
    return torch.where((w_new > 0).unsqueeze(-1), out, tf).to(t.dtype)


def _hand_over(ctx: ScanContext, removed: torch.Tensor, dst: torch.Tensor,
               merged: torch.Tensor, stream: torch.Tensor, freeze_sources: bool, keep_frozen: bool
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The source map after the step (removed tokens hand their patches to ``dst``, or their
    patches become pruned), in old sequence indices, and the frozen features (the pruned
    patches' last stream value, kept when ``keep_frozen``)."""
    src = ctx.source                                                    # (B, M)
    B, L = ctx.pos.shape
    fate = torch.arange(L, device=src.device).unsqueeze(0).expand(B, -1).clone()
    # branch on the Python bool (a bool & tensor breaks torch.jit.trace)
    handed = torch.full_like(dst, -1) if freeze_sources else \
        torch.where(merged, dst, torch.full_like(dst, -1))
    fate.scatter_(1, removed, handed)
    new_src = torch.where(src >= 0, torch.gather(fate, 1, src.clamp(min=0)), src)
    frozen = freeze_pruned(ctx, new_src, stream) if keep_frozen else ctx.frozen
    return new_src, frozen


def freeze_pruned(ctx: ScanContext, new_src: torch.Tensor, stream: torch.Tensor
                  ) -> torch.Tensor:
    """``ctx.frozen`` with the patches a step pruned (``new_src`` -1 where ``ctx.source`` had a
    carrier) set to their carrier's value in ``stream`` (B, L, D), the step's input: the
    features the dense restore gives them (:func:`restore_grid`)."""
    src, frozen = ctx.source, ctx.frozen
    pruned_now = (new_src < 0) & (src >= 0)                              # (B, M)
    if frozen is None:
        frozen = stream.new_zeros(src.shape[0], src.shape[1], stream.shape[-1])
    last = _gather_tokens(stream, src.clamp(min=0))
    return torch.where(pruned_now.unsqueeze(-1), last.to(frozen.dtype), frozen)


def _compact(ctx: ScanContext, removed: torch.Tensor
             ) -> Tuple[torch.Tensor, int, torch.Tensor]:
    """``(new_order, new_cls, new_index)``: the old index of each kept token in the new order
    (survivors in their original order, the class token back at the middle, an EViT fused
    token last), the class token's new index, and each old token's new index (-1: removed)."""
    pos = ctx.pos
    B, L = pos.shape
    device = pos.device
    keep = torch.ones(B, L, dtype=torch.bool, device=device)
    # a tensor source, not the Python scalar False (no bool-Scalar overload under jit.trace)
    keep.scatter_(1, removed, torch.zeros_like(removed, dtype=torch.bool))
    n_keep_patch = ctx.n_patches - removed.shape[1]
    order = stable_argsort((~(keep & (pos >= 0))).to(torch.int8), dim=1)
    patches = order[:, :n_keep_patch]                                   # kept patches, in order
    extras = []
    if ctx.cls_index >= 0:
        extras.append(torch.full((B, 1), ctx.cls_index, device=device, dtype=torch.long))
    if ctx.has_fused:   # the fused token is always the last one of the sequence
        extras.append(torch.full((B, 1), L - 1, device=device, dtype=torch.long))
    mid = cls_slot(n_keep_patch)
    if ctx.cls_index >= 0:
        new_order = torch.cat([patches[:, :mid], extras[0], patches[:, mid:]] + extras[1:], 1)
        new_cls = mid
    else:
        new_order = torch.cat([patches] + extras, 1)
        new_cls = NO_CLS
    new_index = torch.full((B, L), -1, dtype=torch.long, device=device)
    new_index.scatter_(1, new_order, torch.arange(new_order.shape[1], device=device)
                       .unsqueeze(0).expand(B, -1))
    return new_order, new_cls, new_index


def _fold_scatter(stream: torch.Tensor, w: torch.Tensor, w_new: torch.Tensor,
                  removed: torch.Tensor, safe_dst: torch.Tensor, merged: torch.Tensor,
                  new_index: torch.Tensor, length: int) -> torch.Tensor:
    """The folded merge: one scatter of the weighted stream, token i landing on the new index
    of the token that carries it (itself, or its merge destination) with weight
    ``w_i / w_new[dest]``; fp32 (B, length, D)."""
    B, L, D = stream.shape
    device = stream.device
    dest_old = torch.arange(L, device=device).unsqueeze(0).expand(B, -1).clone()
    dest_old.scatter_(1, removed, safe_dst)
    alive = torch.ones(B, L, dtype=torch.bool, device=device)
    alive.scatter_(1, removed, merged)
    coef = torch.where(alive, w / torch.gather(w_new, 1, dest_old).clamp_min(1e-12),
                       torch.zeros_like(w))
    target = torch.gather(new_index, 1, dest_old).clamp(min=0)
    return stream.float().new_zeros(B, length, D).scatter_add_(
        1, target.unsqueeze(-1).expand(-1, -1, D), stream.float() * coef.unsqueeze(-1))


def folded_successor(ctx: ScanContext, r: int, pos: torch.Tensor, size: torch.Tensor,
                     source: torch.Tensor, step: str = 'reduce') -> ScanContext:
    """The context after a folded ToMe step that removed ``r`` patch tokens, from the reduced
    sequence's ``pos``, ``size`` and ``source`` (what the compiled merge step returns)."""
    n_keep = ctx.n_patches - r
    return ctx.successor(cls_index_for(n_keep, ctx.cls_index >= 0), pos, n_keep, size=size,
                         source=source, frozen=ctx.frozen, step=step)


def plan_merge_step(ctx: ScanContext, removed: torch.Tensor, dst: torch.Tensor,
                    planned: Optional[tuple] = None, stream: Optional[torch.Tensor] = None,
                    weight: Optional[torch.Tensor] = None, freeze_sources: bool = False):
    """The fused path's step (ToMe's merges, pruning's ``dst = -1``, both, or EViT's merge
    into its fused token): the new context now, the merge itself later.

    Returns ``(plan, new_ctx)``: a :class:`~amvim_mm.ops.token_merge.MergePlan` that the block
    applies inside its fused add + RMSNorm (``VimBlock.forward(..., merge=plan)``) to the
    unchanged streams, and the context of the reduced sequence. Equal to
    :func:`reduce_tokens` with ``fold=True`` (tests). ``planned``: the plan the selecting
    kernel made in the same launch (:attr:`~.reducers.Selection.plan`); else it is made here.
    ``stream``: the step's input ``residual + hidden`` when pruned patches keep their last
    features for a dense restore (:func:`freeze_pruned`); None: they are not kept (outputs
    without a grid, e.g. the class token). ``weight``, ``freeze_sources``: as in
    :func:`reduce_tokens`.
    """
    r = removed.shape[1]
    n_keep = ctx.n_patches - r
    new_cls = cls_index_for(n_keep, ctx.cls_index >= 0)
    if planned is not None:
        plan, npos, nsize, nsrc = planned       # made by ToMe's matching kernel, same launch
        step = 'kernel-plan'
    else:
        plan, npos, nsize, nsrc = plan_merge(ctx.pos, ctx.size, ctx.source, removed, dst,
                                             new_cls, weight, freeze_sources)
        step = 'plan'
    frozen = ctx.frozen if stream is None else freeze_pruned(ctx, nsrc, stream)
    return plan, ctx.successor(new_cls, npos, n_keep, size=nsize, source=nsrc,
                               frozen=frozen, step=step, has_fused=ctx.has_fused)


def restore_grid(ctx: ScanContext, feat: torch.Tensor) -> torch.Tensor:
    """(B, L, D) reduced tokens -> (B, M, D) full grid in raster order.

    Every original patch receives the token that carries it (merged tokens are copied to all
    their sources); pruned patches receive their frozen last feature.
    """
    full = _gather_tokens(feat, ctx.source.clamp(min=0))
    if ctx.frozen is not None:
        full = torch.where((ctx.source >= 0).unsqueeze(-1), full, ctx.frozen.to(full.dtype))
    return full


def append_fused_slot(ctx: ScanContext, hidden: torch.Tensor, residual: Optional[torch.Tensor]
                      ) -> Tuple[torch.Tensor, Optional[torch.Tensor], ScanContext]:
    """Append an empty token without grid position (EViT's fused token) if there is none."""
    if ctx.has_fused:
        return hidden, residual, ctx
    B = hidden.shape[0]
    hidden = torch.cat([hidden, hidden.new_zeros(B, 1, hidden.shape[-1])], 1)
    if residual is not None:
        residual = torch.cat([residual, residual.new_zeros(B, 1, residual.shape[-1])], 1)
    pos = torch.cat([ctx.pos, ctx.pos.new_full((B, 1), FUSED_POS)], 1)
    new = ctx.successor(ctx.cls_index, pos, ctx.n_patches,
                        size=torch.cat([ctx.size, ctx.size.new_zeros(B, 1)], 1),
                        source=ctx.source, frozen=ctx.frozen, step='fused-slot', has_fused=True)
    imp = ctx.importance
    new.importance = None if imp is None else torch.cat([imp, imp.new_zeros(B, 1)], 1)
    return hidden, residual, new
