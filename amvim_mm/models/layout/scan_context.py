"""The token sequence's layout, and the gather indices that turn it into each path's order."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from amvim_mm.ops.cross_scan import DirectionIndex
from amvim_mm.ops.token_merge import extra_kernels_enabled, rank_path_perms
from amvim_mm.token_layout import grid_positions
from .scan_orders import (is_reverse, normalize_order, path_permutation, scan_rank,
                          scan_rank_on)
from .constants import constant_cache
from .sorting import running_max, running_min, search_sorted


class PathIndex:
    """Gather indices of one path over a (B, L, C) sequence, and their inverse.

    The canonical Vim layouts are recognised: the identity (Vim's forward path) costs nothing and
    the full reversal (Vim's backward path) is a ``flip``, exactly as in the official code.
    """

    @classmethod
    def trivial(cls, kind: str) -> 'PathIndex':
        """The identity or the full reversal, for any sequence length."""
        idx = cls.__new__(cls)
        idx.kind, idx.perm, idx.inv = kind, None, None
        return idx

    def __init__(self, perm: torch.Tensor) -> None:
        self.kind = 'gather'
        L = perm.shape[-1]
        if perm.dim() == 1:
            ar = torch.arange(L, device=perm.device)
            if torch.equal(perm, ar):
                self.kind = 'identity'
            elif torch.equal(perm, ar.flip(0)):
                self.kind = 'flip'
        self.perm = perm
        self.inv = torch.argsort(perm, dim=-1) if self.kind == 'gather' else None

    def indices(self, pos: torch.Tensor) -> torch.Tensor:
        """The gather indices as a (B, L) tensor (materialised for identity/flip)."""
        if self.kind == 'gather':
            return self.perm if self.perm.dim() == 2 else self.perm.expand(pos.shape[0], -1)
        ar = torch.arange(pos.shape[-1], device=pos.device)
        ar = ar.flip(0) if self.kind == 'flip' else ar
        return ar.expand(pos.shape[0], -1)

    def _apply(self, x: torch.Tensor, dim: int, inverse: bool) -> torch.Tensor:
        if self.kind == 'identity':
            return x
        if self.kind == 'flip':
            return x.flip(dim)
        idx = self.inv if inverse else self.perm
        if idx.dim() == 1:
            return x.index_select(dim, idx)
        # per-sample indices (B, L): broadcast over the channel dimension
        idx = idx.unsqueeze(3 - dim) if dim == 2 else idx.unsqueeze(-1)
        return torch.gather(x, dim, idx.expand_as(x))

    def to_path(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C) in token order -> (B, L, C) in path order."""
        return self._apply(x, 1, inverse=False)

    def to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C) in path order -> (B, L, C) in token order."""
        return self._apply(x, 1, inverse=True)

    def to_path_cf(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, L) channel-first in token order -> path order."""
        return self._apply(x, 2, inverse=False)

    def to_tokens_cf(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, L) channel-first in path order -> token order."""
        return self._apply(x, 2, inverse=True)


class ScanContext:
    """Where the tokens of the current sequence sit on the patch grid.

    Args:
        grid: (H, W) patch grid of the input.
        pos: (L,) or (B, L) raster position of each token in the sequence; ``-1`` for the class
            token. ``None`` means the full grid in raster order with the class token (if any) at
            ``cls_index``.
        cls_index: index of the class token in the sequence, -1 if none.
    """

    def __init__(self, grid: Tuple[int, int], cls_index: int = -1,
                 pos: Optional[torch.Tensor] = None, device=None,
                 n_patches: Optional[int] = None, has_fused: bool = False) -> None:
        self.grid = (int(grid[0]), int(grid[1]))
        self.cls_index = cls_index
        M = self.grid[0] * self.grid[1]
        # number of patch tokens present (a Python int: no device sync to read it)
        self.n_patches = M if n_patches is None else int(n_patches)
        self.has_fused = has_fused
        if pos is None:
            pos = grid_positions(M, cls_index, device)
            self.full_grid = True
        else:
            self.full_grid = False
        self.pos = pos
        self._cache: Dict[tuple, PathIndex] = {}
        # token-reduction state (see amvim_mm.models.reduction.state); set by successor()
        self.reduced = False
        self.size: Optional[torch.Tensor] = None      # (B, L) patches each token stands for
        self.source: Optional[torch.Tensor] = None    # (B, M) token carrying each patch, -1
        self.frozen: Optional[torch.Tensor] = None    # (B, M, D) features of pruned patches
        #: how each reduction step of this forward ran, oldest first: 'reduce' (PyTorch ops),
        #: 'plan' / 'kernel-plan' (fused path: planned by PyTorch ops / by the matching kernel),
        #: 'cpu-step' (the whole ToMe step in one compiled CPU call),
        #: 'fused-slot' (EViT's fused token appended)
        self.steps: Tuple[str, ...] = ()
        # ToP's exchange between a block's mixer and the next step's reducer
        self.want_importance = False
        self.importance: Optional[torch.Tensor] = None
        self.align: Optional[str] = None
        self._gaps: Dict[tuple, Optional[torch.Tensor]] = {}
        self._perms: Dict[tuple, torch.Tensor] = {}

    def successor(self, cls_index: int, pos: torch.Tensor, n_patches: int, *,
                  size: torch.Tensor, source: torch.Tensor, frozen: Optional[torch.Tensor],
                  step: Optional[str], has_fused: Optional[bool] = None) -> 'ScanContext':
        """The context of the sequence after a reduction step (``step`` None: the first,
        unreduced one with its bookkeeping)."""
        new = ScanContext(self.grid, cls_index, pos=pos, device=pos.device, n_patches=n_patches,
                          has_fused=self.has_fused if has_fused is None else has_fused)
        new.size, new.source, new.frozen = size, source, frozen
        new.reduced = step is not None
        new.steps = self.steps + ((step, ) if step is not None else ())
        return new

    def path_gaps(self, spec) -> Optional[torch.Tensor]:
        """(B, L) pruned-gap counts in the path's order when alignment is on, else None."""
        if self.align is None or not self.reduced:
            return None
        key = normalize_order(spec)
        if key not in self._gaps:
            kind = self._trivial_kind(key) if not self.has_fused and self.pos.dim() == 2 \
                else None
            self._gaps[key] = raster_gaps(self.pos, self.grid[0] * self.grid[1],
                                          kind == 'flip') if kind else \
                path_gaps(self, spec, self.path_index(spec).indices(self.pos))
        return self._gaps[key]

    def stacked_path_gaps(self, paths) -> torch.Tensor:
        """(P, B, L) fp32: :meth:`path_gaps` of every path, stacked once per context (the
        fused mixer's input; every block of the context shares it)."""
        key = ('stacked', ) + tuple(paths)
        gaps = self._gaps.get(key)
        if gaps is None:
            gaps = self._gaps[key] = torch.stack([self.path_gaps(k) for k in paths]).float()
        return gaps

    def path_perms(self, keys: Tuple[tuple, ...]) -> torch.Tensor:
        """(P, 1 or B, L) int32: token at each position of each path (for the fused mixer).

        ``keys`` are normalised scan orders (``normalize_order``), one per path.
        """
        if self.full_grid:
            return _full_grid_perms(self.grid, self.cls_index, tuple(keys), self.pos.device)
        perms = self._perms.get(tuple(keys))
        if perms is None:
            L, device = self.pos.shape[-1], self.pos.device
            kinds = [self._trivial_kind(k) for k in keys]
            if all(kinds):   # identity / flip: cached per length
                perms = _trivial_perms(tuple(kinds), L, device)
            elif (self.has_fused or self.pos.dim() != 2 or not self.pos.is_cuda
                  or not extra_kernels_enabled()):
                perms = _stack_perms([self.path_index(k) for k in keys], L, device)
            else:
                # rank-ordered paths of a reduced sequence: every path in one Triton launch
                ranks, rev = _path_ranks(self.grid, tuple(keys), str(torch.device(device)))
                perms = rank_path_perms(self.pos, ranks, rev, self.cls_index, self.n_patches)
            self._perms[tuple(keys)] = perms
        return perms

    def direction_index(self, paths) -> DirectionIndex:
        """The four paths' token orders of the present sequence as a
        :class:`~amvim_mm.ops.cross_scan.DirectionIndex` (perm (P, B or 1, L)) for the
        cross-scan kernels (cached)."""
        keys = tuple(p if isinstance(p, tuple) else normalize_order(p) for p in paths)
        index = self._perms.get(('direction', ) + keys)
        if index is None:
            if self.pos.is_cuda:   # every path in one launch where the kernels exist
                perm = self.path_perms(keys)
            else:
                pos = self.pos if self.pos.dim() == 2 else self.pos.unsqueeze(0)
                perm = torch.stack([self.path_index(k).indices(pos) for k in keys])
            index = DirectionIndex.from_perm(perm)
            self._perms[('direction', ) + keys] = index
        return index

    def _trivial_kind(self, key) -> Optional[str]:
        """On a reduced sequence: 'identity' / 'flip' when the path needs no gather, else None.

        The reduced sequence keeps raster order with the class token in the middle: the raster
        path is the sequence itself, its reverse a flip (unless an EViT fused token, stored last
        but scanned first in every path, breaks both).
        """
        spec = dict(key)
        if spec['order'] == 'raster' and not self.has_fused:
            return 'flip' if spec['reverse'] else 'identity'
        return None

    def path_index(self, spec) -> PathIndex:
        key = spec if isinstance(spec, tuple) else normalize_order(spec)
        idx = self._cache.get(key)
        if idx is None:
            if self.full_grid:
                idx = _full_grid_index(self.grid, self.cls_index, key, self.pos.device)
            elif self._trivial_kind(key):
                idx = PathIndex.trivial(self._trivial_kind(key))
            else:
                rank = scan_rank_on(*self.grid, spec, self.pos.device)
                idx = PathIndex(path_permutation(rank, self.pos, self.cls_index,
                                                 is_reverse(spec), n_patches=self.n_patches))
            self._cache[key] = idx
        return idx


@constant_cache(512)
def _full_grid_index(grid: Tuple[int, int], cls_index: int, key: tuple, device) -> PathIndex:
    """Path indices for the unreduced sequence, cached per grid, class token and device."""
    M = grid[0] * grid[1]
    pos = grid_positions(M, cls_index)
    spec = dict(key)
    perm = path_permutation(scan_rank(*grid, spec), pos, cls_index, spec['reverse'])
    return PathIndex(perm.to(device))


def _stack_perms(indices, length: int, device) -> torch.Tensor:
    rows = []
    for idx in indices:
        if idx.kind == 'gather':
            rows.append(idx.perm)
        else:
            ar = torch.arange(length, device=device)
            rows.append(ar.flip(0) if idx.kind == 'flip' else ar)
    if any(r.dim() == 2 for r in rows):
        bsz = next(r.shape[0] for r in rows if r.dim() == 2)
        rows = [r if r.dim() == 2 else r.expand(bsz, -1) for r in rows]
    else:
        rows = [r.unsqueeze(0) for r in rows]
    return torch.stack(rows).to(torch.int32).contiguous()


@constant_cache(512)
def _path_ranks(grid: Tuple[int, int], keys: tuple, device: str
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(P, M) int32 forward grid ranks of the paths and (P,) int32 reverse flags, on ``device``
    (cached: no host-to-device copy per forward)."""
    ranks = torch.stack([scan_rank_on(*grid, k, device) for k in keys]).to(torch.int32)
    rev = torch.tensor([int(is_reverse(k)) for k in keys], dtype=torch.int32, device=device)
    return ranks.contiguous(), rev


@constant_cache(512)
def _trivial_perms(kinds: Tuple[str, ...], length: int, device) -> torch.Tensor:
    return _stack_perms([PathIndex.trivial(k) for k in kinds], length, device)


@constant_cache(512)
def _full_grid_perms(grid: Tuple[int, int], cls_index: int, keys: tuple, device) -> torch.Tensor:
    """:meth:`ScanContext.path_perms` of the unreduced sequence, cached per grid and device."""
    M = grid[0] * grid[1] + (1 if cls_index >= 0 else 0)
    return _stack_perms([_full_grid_index(grid, cls_index, k, device) for k in keys], M, device)


def raster_gaps(pos: torch.Tensor, n_cells: int, reverse: bool) -> torch.Tensor:
    """:func:`path_gaps` of the raster path (``reverse``: its flip) on a reduced sequence in
    raster order, ``pos`` (B, L) (-1: a class token), from neighbour differences: a patch's gap
    is the number of grid cells between it and the previous present patch of the path (the
    grid's edge for the first). Five element-wise ops instead of a sort and searches."""
    patch = pos >= 0
    if not reverse:
        prev = running_max(torch.where(patch, pos, torch.full_like(pos, -1)))
        prev = torch.cat([prev.new_full((pos.shape[0], 1), -1), prev[:, :-1]], 1)
        return torch.where(patch, pos - prev - 1, torch.zeros_like(pos))
    nxt = running_min(torch.where(patch, pos, torch.full_like(pos, n_cells)).flip(1))
    nxt = torch.cat([nxt.new_full((pos.shape[0], 1), n_cells), nxt[:, :-1]], 1)
    return torch.where(patch.flip(1), nxt - pos.flip(1) - 1, torch.zeros_like(pos))


def path_gaps(ctx: ScanContext, spec, perm: torch.Tensor) -> torch.Tensor:
    """Number of pruned patches right before each token of a path (ToP hidden-state alignment).

    ``perm`` (B, L) is the path's order of the present tokens. For a token ``k`` of the path, the
    gap counts the pruned grid positions between the previous present patch token and ``k`` in
    the path's order over the full grid (class and fused tokens get 0 and are skipped).
    """
    rank = scan_rank_on(*ctx.grid, spec, perm.device)
    B, L = perm.shape
    pos_path = torch.gather(ctx.pos, 1, perm)                            # (B, L)
    is_patch = pos_path >= 0
    r = torch.where(is_patch, rank[pos_path.clamp(min=0)], torch.zeros_like(pos_path))
    pruned = ctx.source < 0                                              # (B, M)
    big = rank.numel() + 1
    pr = torch.where(pruned, rank.unsqueeze(0).expand(B, -1), torch.full_like(pruned, big,
                                                                             dtype=rank.dtype))
    pr = torch.sort(pr, dim=1).values
    total = pruned.sum(1, keepdim=True)
    if is_reverse(spec):
        cnt = total - search_sorted(pr, r, right=True)   # pruned rank > r
    else:
        cnt = search_sorted(pr, r)                       # pruned rank < r
    # carry the count of the previous patch token over the non-patch tokens
    cnt = torch.where(is_patch, cnt, torch.full_like(cnt, -1))
    idx = torch.where(is_patch, torch.arange(L, device=perm.device).expand(B, -1),
                      torch.zeros_like(cnt))
    last_patch = running_max(idx)
    carried = torch.gather(torch.where(is_patch, cnt, torch.zeros_like(cnt)), 1, last_patch)
    prev = torch.cat([torch.zeros_like(carried[:, :1]), carried[:, :-1]], 1)
    first_patch_seen = running_max(is_patch.long())
    prev = torch.where(torch.cat([torch.zeros_like(first_patch_seen[:, :1]),
                                  first_patch_seen[:, :-1]], 1) > 0, prev,
                       torch.zeros_like(prev))
    return torch.where(is_patch, cnt - prev, torch.zeros_like(cnt))
