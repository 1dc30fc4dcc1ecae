"""One ToMe merge step at inference in two Triton launches (bookkeeping + weighted scatter), and
ToMe's matching in one (:func:`tome_match`) and the path indices of a reduced sequence in one
(:func:`rank_path_perm`); those two are opt-in with ``AMVIM_FUSED_REDUCTION_KERNELS=1`` until they
have been timed (and compiled) on a GPU.

The reference is :func:`amvim_mm.models.reduction.state.reduce_tokens` with ``fold=True``: the
summed stream is merged once (size-weighted average into each removed token's destination),
the survivors keep their order, the class token goes back to the middle, and the per-sample
``pos``/``size``/``source`` bookkeeping follows. Done there with ~40 small PyTorch launches per
step, which at Vim-T's size cost more than the removed tokens save; here one program per sample
does the bookkeeping and one kernel scatters the weighted stream (fp32 atomics; the order of a
merge's additions is not fixed, as with PyTorch's ``scatter_add`` on CUDA).

Only for merges without frozen sources and without EViT's fused token (ToMe at inference).
CPU tensors run in Triton's interpreter when ``TRITON_INTERPRET=1`` is set (tests).
"""
from __future__ import annotations

import functools
import os
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ['fold_merge_step', 'tome_match', 'MAX_MATCH_ROWS', 'extra_kernels_enabled',
           'rank_path_perm']

#: the matching kernel holds an (A x B) score tile in registers: at most 128 rows per set
MAX_MATCH_ROWS = 128
EXTRA_ENV_VAR = 'AMVIM_FUSED_REDUCTION_KERNELS'


def extra_kernels_enabled() -> bool:
    """:func:`tome_match` and :func:`rank_path_perm` are opt-in
    (``AMVIM_FUSED_REDUCTION_KERNELS=1``) until timed on a GPU; off, ToMe matches and reduced
    paths are ordered with PyTorch ops (what the published GPU numbers ran)."""
    value = os.environ.get(EXTRA_ENV_VAR, '0').strip().lower()
    if value in ('1', 'true', 'on', 'yes'):
        return True
    if value in ('', '0', 'false', 'off', 'no'):
        return False
    raise ValueError(f'{EXTRA_ENV_VAR}={value!r}: use 1 (on) or 0 (off)')


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton

    from . import _token_merge_kernels as k
    return (triton.jit(k.merge_bookkeeping_kernel), triton.jit(k.merge_scatter_kernel),
            triton.jit(k.tome_match_kernel), triton.jit(k.rank_perm_kernel))


def fold_merge_step(stream: Tensor, pos: Tensor, size: Tensor, source: Tensor, removed: Tensor,
                    dst: Tensor, n_keep_patch: int, new_cls: int
                    ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Merge ``removed`` tokens into ``dst`` and compact.

    Args:
        stream: (B, L, D) summed stream (any float dtype; merged in fp32).
        pos: (B, L) grid positions (-1: class token); size: (B, L) token sizes (the weights);
        source: (B, M) token carrying each grid patch; removed, dst: (B, r) sequence indices
        (distinct removed tokens, never the class token; every dst a survivor).
        n_keep_patch: patch tokens left; new_cls: the class token's new index (-1: none).

    Returns:
        (new stream fp32 (B, L', D), new pos, new size, new source) with L' = L - r.
    """
    import triton
    book_k, scatter_k, _, _ = _kernels()
    B, L, D = stream.shape
    r = removed.shape[1]
    M = source.shape[1]
    L_new = L - r
    dev = stream.device
    removed = removed.contiguous()
    dst = dst.contiguous()
    pos = pos.contiguous()
    size = size.float().contiguous()
    source = source.contiguous()
    i32 = dict(device=dev, dtype=torch.int32)
    keep, dest, nidx, tgt = (torch.empty(B, L, **i32) for _ in range(4))
    wnew = torch.empty(B, L, device=dev, dtype=torch.float32)
    coef = torch.empty(B, L, device=dev, dtype=torch.float32)
    npos = torch.empty(B, L_new, device=dev, dtype=pos.dtype)
    nsize = torch.empty(B, L_new, device=dev, dtype=torch.float32)
    nsrc = torch.empty(B, M, device=dev, dtype=source.dtype)
    book_k[(B, )](removed, dst, pos, size, source, keep, dest, wnew, nidx, tgt, coef, npos, nsize,
                  nsrc, L, r, M, L_new, new_cls, BLOCK_L=triton.next_power_of_2(L),
                  BLOCK_R=max(triton.next_power_of_2(r), 2),
                  BLOCK_M=triton.next_power_of_2(M), num_warps=4)
    x = stream.float().contiguous()
    out = torch.zeros(B, L_new, D, device=dev, dtype=torch.float32)
    bt, bd = 32, min(128, triton.next_power_of_2(D))
    n_tb = triton.cdiv(L, bt)
    scatter_k[(B * n_tb, triton.cdiv(D, bd))](x, tgt, coef, out, L, D, L_new, n_tb,
                                              BLOCK_T=bt, BLOCK_D=bd, num_warps=4)
    return out, npos, nsize, nsrc


def tome_match(stream: Tensor, weight: Optional[Tensor], n_patches: int, cls_index: int,
               k: int) -> Tuple[Tensor, Tensor]:
    """ToMe's order-preserving bipartite matching in one launch (one program per sample).

    The reference is :meth:`amvim_mm.models.reduction.reducers.ToMe.select`: patch tokens
    alternate into sets A and B, cosine similarity of ``stream * weight`` (``weight=None``: the
    raw stream), each A token's best B token, the ``k`` strongest edges. Needs the canonical
    layout (every token but the class token is a patch) and at most ``MAX_MATCH_ROWS`` tokens
    per set. Ties between edges go to the lower index (PyTorch's argsort leaves them open).

    Returns:
        (removed, dst): (B, k) sequence indices.
    """
    import triton
    B, L, D = stream.shape
    n_a, n_b = (n_patches + 1) // 2, n_patches // 2
    if n_a > MAX_MATCH_ROWS:
        raise ValueError(f'tome_match handles at most {MAX_MATCH_ROWS} tokens per set; got '
                         f'{n_a} ({n_patches} patch tokens)')
    if not 0 < k <= n_a:
        raise ValueError(f'tome_match: cannot merge {k} of {n_a} tokens of set A')
    _, _, match_k, _ = _kernels()
    x = stream.contiguous()
    removed = torch.empty(B, k, device=x.device, dtype=torch.long)
    dst = torch.empty(B, k, device=x.device, dtype=torch.long)
    w = weight.contiguous() if weight is not None else x
    match_k[(B, )](x, w, removed, dst, L, D, n_a, n_b, cls_index, k, HAS_W=weight is not None,
                   BLOCK_A=max(triton.next_power_of_2(n_a), 16), BLOCK_D=32, num_warps=8)
    return removed, dst


def rank_path_perm(pos: Tensor, rank: Tensor, cls_index: int, reverse: bool,
                   n_patches: int) -> Tensor:
    """:func:`~amvim_mm.models.backbones.scan_orders.path_permutation` in one launch, as int32.

    For sequences in the canonical layout (every token but the class token is a patch with a
    grid position): ``pos`` (B, L) grid positions (-1: class token), ``rank`` (M,) the path's
    forward rank of every grid position. Returns (B, L) int32, the token at each path position.
    """
    import triton
    *_, perm_k = _kernels()
    B, L = pos.shape
    M = rank.numel()
    out = torch.empty(B, L, device=pos.device, dtype=torch.int32)
    buf = torch.empty(B, M, device=pos.device, dtype=torch.int32)
    perm_k[(B, )](pos.contiguous(), rank.to(device=pos.device, dtype=torch.int32).contiguous(),
                  buf, out, L, M, cls_index, n_patches, REVERSE=bool(reverse),
                  BLOCK_L=triton.next_power_of_2(L), BLOCK_M=triton.next_power_of_2(M),
                  num_warps=4)
    return out
