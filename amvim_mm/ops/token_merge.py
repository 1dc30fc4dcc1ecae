"""A merge / prune step at inference: ToMe's matching in one Triton launch (:func:`tome_match`),
the bookkeeping in one (:func:`plan_merge`), and the merge itself inside the next block's fused
add + RMSNorm (:func:`amvim_mm.ops.fused_mixer.fused_add_rmsnorm` with ``merge=``); plus the
path indices of a reduced sequence in one launch (:func:`rank_path_perms`).

The reference is :func:`amvim_mm.models.reduction.state.reduce_tokens` with ``fold=True``: the
summed stream is merged once (size-weighted average into each removed token's destination),
the survivors keep their order, the class token goes back to the middle, and the per-sample
``pos``/``size``/``source`` bookkeeping follows. Done there with ~40 small PyTorch launches per
step (and ToMe's matching with ~13 more), which at Vim-T's size cost more than the removed
tokens save. Here no merged stream is ever written: the plan says, per new token, which old
token it keeps (with its weight) and where each removed token adds (with its weight), and the
block's add + RMSNorm reads the old streams through it.

Every reducer's step at inference: ToMe's merges, pruning (ToP, DynamicViT, random pruning:
``dst = -1``), both (LTMP), EViT's importance-weighted merge into its fused token.
``AMVIM_FUSED_REDUCTION_KERNELS=0`` matches and orders reduced paths with PyTorch ops instead
(for comparison; the merge step stays fused). CPU tensors run in Triton's interpreter when
``TRITON_INTERPRET=1`` is set (tests).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.token_layout import cls_index_for
from .triton_loader import jit_kernels

__all__ = ['MergePlan', 'plan_merge', 'apply_merge_plan', 'tome_match', 'MAX_MATCH_ROWS',
           'MATCH_CONFIG', 'match_config',
           'extra_kernels_enabled', 'rank_path_perms']

#: the one-launch matching kernel holds an (A x B) score tile in registers: at most 128 rows
#: per set; longer sequences (dense tasks) take the blocked route (:func:`tome_match`)
MAX_MATCH_ROWS = 128
#: the blocked route's best-match kernel: (BLOCK_A, BLOCK_B, BLOCK_D, num_warps), the fastest
#: of eight measured at a 512 crop on an H200 (benchmarks/README.md)
BLOCKED_MATCH_CONFIG = (64, 64, 64, 4)
EXTRA_ENV_VAR = runtime.variable_of('reduction_kernels')


def extra_kernels_enabled() -> bool:
    """:func:`tome_match` and :func:`rank_path_perms` on the fused path (default); with
    ``AMVIM_FUSED_REDUCTION_KERNELS=0`` ToMe matches and reduced paths are ordered with PyTorch
    ops (slower; benchmarks/README.md)."""
    return runtime.settings().reduction_kernels


def _kernels():
    """The kernels by role (compiled on CUDA; on CPU tensors Triton's interpreter, when Python
    started with it, runs them)."""
    roles = ('plan', 'match', 'perm', 'best', 'rank_plan')
    names = ('merge_plan_kernel', 'tome_match_kernel', 'rank_perm_kernel', 'tome_best_kernel',
             'tome_rank_plan_kernel')
    return SimpleNamespace(**dict(zip(roles, jit_kernels('_token_merge_kernels', names,
                                                         "ToMe's matching", False),
                                      strict=True)))


class MergePlan(NamedTuple):
    """Where each token of a (B, L, D) stream lands after a merge step (new length L').

    ``rows`` (B, L') int32: the old index of the token kept at each new index, with weight
    ``row_coef`` (B, L') fp32; ``removed`` (B, r) int64 old indices of the removed tokens, each
    added to new row ``rem_tgt`` (B, r) int32 with weight ``rem_coef`` (B, r) fp32, or pruned
    (``rem_tgt`` -1, weight 0: added nowhere).
    """
    rows: Tensor
    row_coef: Tensor
    removed: Tensor
    rem_tgt: Tensor
    rem_coef: Tensor


def plan_merge(pos: Tensor, size: Tensor, source: Tensor, removed: Tensor, dst: Tensor,
               new_cls: int, weight: Optional[Tensor] = None, freeze: bool = False
               ) -> Tuple[MergePlan, Tensor, Tensor, Tensor]:
    """Plan merging ``removed`` tokens into ``dst`` and compacting (one launch).

    Args:
        pos: (B, L) grid positions (-1: class token, -2: EViT's fused token, kept last);
        size: (B, L) token sizes (the weights unless ``weight`` is given; summed into ``dst``);
        source: (B, M) token carrying each grid patch; removed, dst: (B, r) sequence indices
        (distinct removed tokens, never the class token; every dst a survivor, or -1: the
        token is pruned and its patches lose their carrier, source -1).
        new_cls: the class token's new index (-1: none).
        weight: (B, L) merge weights other than the sizes (EViT's importance); a token whose
            weights are all zero keeps its value.
        freeze: merged tokens' patches lose their carrier too (EViT's fused token stands for
            no patch).

    Returns:
        (plan, new pos, new size, new source) with L' = L - r tokens.
    """
    plan_k = _kernels().plan
    removed, dst = removed.contiguous(), dst.contiguous()
    bufs, (L, r, M, L_new), meta, out = _plan_args(pos, size, source, removed, weight)
    plan_k[(pos.shape[0], )](removed, dst, *bufs, L, r, M, L_new, new_cls, **meta,
                             SEP_W=weight is not None, FREEZE=bool(freeze), num_warps=4)
    return out


def _plan_args(pos: Tensor, size: Tensor, source: Tensor, removed: Tensor,
               weight: Optional[Tensor] = None):
    """The plan step's launch arguments after ``removed, dst``: (the 13 tensors: state in,
    weights, two scratch rows, plan and new state out; sizes (L, r, M, L'); block sizes; (plan,
    npos, nsize, nsrc))."""
    import triton
    B, L = pos.shape
    r = removed.shape[1]
    M = source.shape[1]
    L_new = L - r
    dev = pos.device
    i32 = dict(device=dev, dtype=torch.int32)
    f32 = dict(device=dev, dtype=torch.float32)
    scratch = torch.empty(B, L, **i32)
    scratch_w = torch.empty(B, L, **f32)
    plan = MergePlan(torch.empty(B, L_new, **i32), torch.empty(B, L_new, **f32), removed,
                     torch.empty(B, r, **i32), torch.empty(B, r, **f32))
    npos = torch.empty(B, L_new, device=dev, dtype=pos.dtype)
    nsize = torch.empty(B, L_new, **f32)
    nsrc = torch.empty(B, M, device=dev, dtype=source.dtype)
    size = size.float().contiguous()
    wt = size if weight is None else weight.float().contiguous()
    bufs = (pos.contiguous(), size, wt, source.contiguous(), scratch, scratch_w, plan.rows,
            plan.row_coef, plan.rem_tgt, plan.rem_coef, npos, nsize, nsrc)
    meta = dict(BLOCK_L=triton.next_power_of_2(L), BLOCK_R=max(triton.next_power_of_2(r), 2),
                BLOCK_M=triton.next_power_of_2(M))
    return bufs, (L, r, M, L_new), meta, (plan, npos, nsize, nsrc)


def apply_merge_plan(hidden: Tensor, residual: Optional[Tensor], plan: MergePlan) -> Tensor:
    """The merged fp32 stream ``residual + hidden`` (B, L', D) of a plan, in PyTorch (what the
    fused add + RMSNorm computes in its pass)."""
    x = (hidden if residual is None else residual + hidden).float()
    D = x.shape[-1]
    out = torch.gather(x, 1, plan.rows.long().unsqueeze(-1).expand(-1, -1, D))
    out = out * plan.row_coef.unsqueeze(-1)
    add = torch.gather(x, 1, plan.removed.unsqueeze(-1).expand(-1, -1, D))
    add = torch.where((plan.rem_tgt >= 0).unsqueeze(-1), add * plan.rem_coef.unsqueeze(-1), 0.)
    return out.scatter_add(1, plan.rem_tgt.clamp(min=0).long().unsqueeze(-1).expand(-1, -1, D),
                           add)


# Launch configuration of the matching kernel: (BLOCK_D, num_warps, num_stages).
# `tools/benchmark.py --suite gpu --parts tune-match` times the candidates as CUDA-graph replays
# of matching + plan at Vim-T's step shape and uses the best for the rest of its run (the
# tuning history is in benchmarks/README.md). Override: AMVIM_TOME_MATCH_CONFIG="32,8,1".
MATCH_CONFIG = (64, 8, 1)


def match_config() -> Tuple[int, int, int]:
    """The matching kernel's launch configuration (``AMVIM_TOME_MATCH_CONFIG`` overrides)."""
    return runtime.settings().match_config or MATCH_CONFIG


#: dot-product precisions of the matching kernel (Triton's ``input_precision``)
DOT_PRECISIONS = ('tf32x3', 'ieee', 'tf32')


def tome_match(hidden: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
               n_patches: int, cls_index: int, k: int, precision: str = 'tf32x3',
               plan_state: Optional[Tuple[Tensor, Tensor, Tensor]] = None):
    """ToMe's order-preserving bipartite matching in one launch (one program per sample).

    The reference is :meth:`amvim_mm.models.reduction.reducers.ToMe.select`: patch tokens
    alternate into sets A and B, cosine similarity of ``(residual + hidden) * weight``
    (``residual=None``: ``hidden`` alone; ``weight=None``: no weight), each A token's best B
    token, the ``k`` strongest edges. ``precision``: how the dot products run: ``'tf32x3'``
    (default: three tf32 tensor-core products per fp32 product, fp32 accuracy at about a third
    of ``'ieee'``'s cost on an H200), ``'ieee'`` (fp32 FMAs) or ``'tf32'`` (one tensor-core
    product: 10 mantissa bits). The default is what the backbone uses under any autocast dtype:
    the gap between the last merged and the first kept edge is often below tf32's / bf16's
    resolution and a lower precision changes which tokens merge. Needs the canonical layout
    (every token but the class token is a patch). Ties between edges go to the lower index, as
    in ``ToMe.select``. Beyond ``MAX_MATCH_ROWS`` tokens per set (dense tasks) two launches
    make the same decisions: each A row's best B row per block of B rows from a program per
    (sample, block of A rows, block of B rows) (:data:`BLOCKED_MATCH_CONFIG`), then a program
    per sample combines the blocks, sorts the edges and plans the merge.

    ``plan_state``: the sequence's ``(pos, size, source)``; the (last) launch then also makes
    the merge plan of the edges (what :func:`plan_merge` does, one launch less per step).

    Returns:
        (removed, dst): (B, k) sequence indices; with ``plan_state``, (removed, dst, planned)
        where ``planned`` is :func:`plan_merge`'s result.
    """
    import triton
    if precision not in DOT_PRECISIONS:
        raise ConfigError(f'tome_match: precision must be one of {", ".join(DOT_PRECISIONS)}, '
                          f'got {precision!r}')
    B, L, D = hidden.shape
    n_a, n_b = (n_patches + 1) // 2, n_patches // 2
    if not 0 < k <= n_a:
        raise ConfigError(f'tome_match: cannot merge {k} of {n_a} tokens of set A')
    kernels = _kernels()
    match_k, best_k, rank_k = kernels.match, kernels.best, kernels.rank_plan
    h = hidden.contiguous()
    r = residual.contiguous() if residual is not None else h
    w = weight.contiguous() if weight is not None else h
    removed = torch.empty(B, k, device=h.device, dtype=torch.long)
    dst = torch.empty(B, k, device=h.device, dtype=torch.long)
    if plan_state is not None:
        new_cls = cls_index_for(n_patches - k, cls_index >= 0)
        bufs, (_, _, M, _), meta, planned = _plan_args(*plan_state, removed)
        plan_args = bufs + (M, new_cls)
    else:
        plan_args = (h, ) * 13 + (0, -1)                     # unused (PLAN=False)
        meta = dict(BLOCK_L=2, BLOCK_R=2, BLOCK_M=2)
    if n_a > MAX_MATCH_ROWS:
        block_a, block_b, block_d, warps = BLOCKED_MATCH_CONFIG
        n_split = triton.cdiv(n_b, block_b)
        best = torch.empty(B, n_split, n_a, device=h.device, dtype=torch.float32)
        bidx = torch.empty(B, n_split, n_a, device=h.device, dtype=torch.int32)
        best_k[(B, triton.cdiv(n_a, block_a), n_split)](
            h, r, w, best, bidx, L, D, n_a, n_b, cls_index, n_split,
            HAS_RES=residual is not None, HAS_W=weight is not None, DOT=precision,
            BLOCK_A=block_a, BLOCK_B=block_b, BLOCK_D=block_d, num_warps=warps)
        rank_k[(B, )](best, bidx, removed, dst, n_a, cls_index, k, n_split, *plan_args[:13],
                      L, *plan_args[13:], PLAN=plan_state is not None,
                      BLOCK_A=triton.next_power_of_2(n_a), **meta, num_warps=8)
        return (removed, dst) if plan_state is None else (removed, dst, planned)
    block_d, warps, stages = match_config()
    match_k[(B, )](h, r, w, removed, dst, L, D, n_a, n_b, cls_index, k, *plan_args,
                   HAS_RES=residual is not None, HAS_W=weight is not None,
                   DOT=precision, BLOCK_A=max(triton.next_power_of_2(n_a), 16),
                   BLOCK_D=block_d, STAGES=stages, PLAN=plan_state is not None, **meta,
                   num_warps=warps)
    if plan_state is not None:
        return removed, dst, planned
    return removed, dst


def rank_path_perms(pos: Tensor, ranks: Tensor, reverse: Tensor, cls_index: int,
                    n_patches: int) -> Tensor:
    """:func:`~amvim_mm.models.layout.scan_orders.path_permutation` of every path in one
    launch, as int32.

    For sequences in the canonical layout (every token but the class token is a patch with a
    grid position): ``pos`` (B, L) grid positions (-1: class token), ``ranks`` (P, M) int32 each
    path's forward rank of every grid position, ``reverse`` (P,) int32 (1: the path runs
    backwards). Returns (P, B, L) int32, the token at each path position.
    """
    import triton
    perm_k = _kernels().perm
    B, L = pos.shape
    P, M = ranks.shape
    out = torch.empty(P, B, L, device=pos.device, dtype=torch.int32)
    buf = torch.empty(P, B, M, device=pos.device, dtype=torch.int32)
    perm_k[(B, P)](pos.contiguous(), ranks, reverse, buf, out, B, L, M, cls_index, n_patches,
                   BLOCK_L=triton.next_power_of_2(L), BLOCK_M=triton.next_power_of_2(M),
                   num_warps=4)
    return out
