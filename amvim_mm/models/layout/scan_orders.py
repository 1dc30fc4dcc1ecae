"""Scan orders as ranks over the original patch grid.

A scan order of an ``H x W`` grid is a rank tensor ``rank`` of shape ``(H * W,)``: the patch at
raster position ``p = row * W + col`` is visited ``rank[p]``-th. A path orders whatever patch
tokens are present (all of them, or the survivors of token reduction) by sorting their ranks, so
every order composes with every reducer. The class token is not part of the rank: it is put at the
middle index of the path's forward sequence (see :func:`path_permutation`).

A path is described by a small dict (``ScanOrder``), for example::

    dict(order='raster')                                   # D1
    dict(order='raster', reverse=True)                     # D2 (Vim's backward path)
    dict(order='window', size=3, inner='col', reverse=True)  # AMVim's D2_D4
    dict(order='window', size=3, inner='random', seed=0)   # D1-D2_rand
    dict(order='window', size=3, shift=1)                  # Swin-style shifted grid
    dict(order='column'), dict(order='random', seed=0)

Orders:

* ``raster``: row-major.
* ``column``: column-major.
* ``window``: non-overlapping ``size x size`` windows anchored at the top-left, visited in
  row-major order (``outer='row'``) or column-major (``outer='col'``); inside each window
  row-major (``inner='row'``), column-major (``inner='col'``) or a fixed random order of the
  ``size*size`` cells (``inner='random'``, ``seed``). Border windows of a grid that is not a
  multiple of ``size`` are partial (no padding tokens). ``shift`` moves the window grid
  cyclically by ``shift`` cells (Swin-style).
* ``random``: a fixed random permutation of the grid (``seed``).
* ``snake``: PlainMamba's continuous order, rows (``axis='row'``) or columns (``'col'``)
  traversed alternately forwards and backwards.

``reverse=True`` runs the whole path backwards. Ranks are cached per grid size.

Each order is a :class:`ScanOrder` subclass registered in :data:`SCAN_ORDERS` with
:func:`register_scan_order`: a new order is one class (docs/how_to_add_a_scan_order.md).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from amvim_mm.errors import ConfigError
from amvim_mm.token_layout import cls_slot
from .constants import constant_cache
from .sorting import stable_argsort

class ScanOrder:
    """One kind of scan order: a rank for every cell of an ``H x W`` grid.

    To add an order, subclass, set ``name`` and ``params`` (argument name -> default), implement
    :meth:`rank` and decorate the class with :func:`register_scan_order`; every path, reducer and
    kernel then works with it (``dict(order=name, ...)`` in ``paths`` or ``layer_paths``).
    Override :meth:`check` to validate the arguments (the default accepts any value).
    """

    name: str = ''
    #: argument name -> default value (``reverse`` is common to all orders)
    params: Dict[str, object] = {}

    def check(self, values: Dict[str, object]) -> Dict[str, object]:
        """Validate (and normalise) the arguments; a :class:`ConfigError` names a bad one."""
        return values

    def rank(self, H: int, W: int, **params) -> torch.Tensor:
        """(H*W,) int64: the step at which each raster position is visited (a permutation)."""
        raise NotImplementedError


#: registered scan orders by name
SCAN_ORDERS: Dict[str, ScanOrder] = {}


def register_scan_order(cls):
    """Class decorator: register a :class:`ScanOrder` subclass under its ``name``."""
    if not (isinstance(cls, type) and issubclass(cls, ScanOrder)) or not cls.name:
        raise ConfigError(f'register_scan_order takes a ScanOrder subclass with a name, got '
                          f'{cls!r}')
    if 'reverse' in cls.params or 'order' in cls.params:
        raise ConfigError(f'scan order {cls.name!r}: "order" and "reverse" are reserved')
    SCAN_ORDERS[cls.name] = cls()
    return cls


@register_scan_order
class Raster(ScanOrder):
    """Row-major."""

    name = 'raster'

    def rank(self, H, W):
        return torch.arange(H * W)


@register_scan_order
class Column(ScanOrder):
    """Column-major."""

    name = 'column'

    def rank(self, H, W):
        pos = torch.arange(H * W)
        return (pos % W) * H + pos // W


@register_scan_order
class Snake(ScanOrder):
    """Continuous ("snake", boustrophedon) order of PlainMamba: ``axis='row'`` runs row 0 left
    to right, row 1 right to left, ...; ``axis='col'`` runs column 0 top to bottom, column 1
    bottom to top, ... Every step moves to a neighbouring cell."""

    name = 'snake'
    params = dict(axis='row')

    def check(self, v):
        if v['axis'] not in ('row', 'col'):
            raise ConfigError(f"snake axis must be 'row' or 'col', got {v['axis']!r}")
        return v

    def rank(self, H, W, axis):
        pos = torch.arange(H * W)
        i, j = pos // W, pos % W
        if axis == 'row':
            return i * W + torch.where(i % 2 == 0, j, W - 1 - j)
        return j * H + torch.where(j % 2 == 0, i, H - 1 - i)


@register_scan_order
class Window(ScanOrder):
    """``size x size`` windows (see the module docstring)."""

    name = 'window'
    params = dict(size=3, inner='row', outer='row', shift=0, seed=0)

    def check(self, v):
        if not isinstance(v['size'], int) or v['size'] < 1:
            raise ConfigError(f'window size must be a positive int, got {v["size"]!r}')
        if v['inner'] not in ('row', 'col', 'random'):
            raise ConfigError(f'window inner order must be row, col or random, got '
                              f'{v["inner"]!r}')
        if v['outer'] not in ('row', 'col'):
            raise ConfigError(f'window outer order must be row or col, got {v["outer"]!r}')
        if not isinstance(v['shift'], int) or v['shift'] < 0:
            raise ConfigError(f'window shift must be a non-negative int, got {v["shift"]!r}')
        return dict(v, seed=int(v['seed']))

    def rank(self, H, W, size, inner, outer, shift, seed):
        return _window_rank(H, W, size, inner, outer, shift, seed)


@register_scan_order
class Random(ScanOrder):
    """A fixed random permutation of the grid."""

    name = 'random'
    params = dict(seed=0)

    def check(self, v):
        return dict(v, seed=int(v['seed']))

    def rank(self, H, W, seed):
        g = torch.Generator().manual_seed(seed)
        return _dense_rank(torch.randperm(H * W, generator=g))


def normalize_order(spec) -> Tuple[Tuple[str, object], ...]:
    """Validate a scan-order dict and return a hashable, canonical form.

    An already canonical form (the tuple this returns) is passed through unchecked, so hot
    paths can normalise once and reuse the key.
    """
    if isinstance(spec, tuple):
        return spec
    if isinstance(spec, str):
        spec = dict(order=spec)
    if not isinstance(spec, dict) or 'order' not in spec:
        raise ConfigError(f'a scan order is a dict with an "order" key, got {spec!r}')
    order = SCAN_ORDERS.get(spec['order'])
    if order is None:
        raise ConfigError(f'unknown scan order {spec["order"]!r}; choose one of '
                          f'{", ".join(SCAN_ORDERS)}')
    keys = {'order', 'reverse'} | set(order.params)
    unknown = set(spec) - keys
    if unknown:
        raise ConfigError(f'scan order {order.name!r} does not take {sorted(unknown)}; '
                          f'valid keys: {sorted(keys)}')
    values = order.check({k: spec.get(k, d) for k, d in order.params.items()})
    out: Dict[str, object] = dict(values, order=order.name,
                                  reverse=bool(spec.get('reverse', False)))
    return tuple(sorted(out.items()))


def _window_rank(H: int, W: int, size: int, inner: str, outer: str, shift: int,
                 seed: int) -> torch.Tensor:
    rows = torch.arange(H).view(H, 1).expand(H, W)
    cols = torch.arange(W).view(1, W).expand(H, W)
    # Swin-style cyclic shift of the window grid: cell (r, c) sits at (r - s, c - s) mod (H, W).
    r = (rows - shift) % H
    c = (cols - shift) % W
    wr, wc = r // size, c // size                     # window index
    ir, ic = r % size, c % size                       # position inside the window
    n_wr, n_wc = -(-H // size), -(-W // size)
    win = wr * n_wc + wc if outer == 'row' else wc * n_wr + wr
    if inner == 'row':
        cell = ir * size + ic
    elif inner == 'col':
        cell = ic * size + ir
    else:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(size * size, generator=g)
        cell = perm[ir * size + ic]
    key = win * (size * size) + cell                  # unique, sparse for partial windows
    return _dense_rank(key.reshape(-1))


def _dense_rank(key: torch.Tensor) -> torch.Tensor:
    rank = torch.empty_like(key)
    rank[torch.argsort(key, stable=True)] = torch.arange(key.numel())
    return rank


@constant_cache(256)
def _rank_cached(H: int, W: int, spec: Tuple[Tuple[str, object], ...]) -> torch.Tensor:
    s = dict(spec)
    order = SCAN_ORDERS[s.pop('order')]
    rank = order.rank(H, W, **s)
    if rank.shape != (H * W, ) or not torch.equal(torch.sort(rank).values,
                                                  torch.arange(H * W)):
        raise ConfigError(f'scan order {order.name!r} gave no permutation of the {H}x{W} grid')
    return rank.long()


def scan_rank(H: int, W: int, spec) -> torch.Tensor:
    """Rank (H*W,) of each raster position along the *forward* order of ``spec`` (cached, CPU).

    ``reverse`` is not applied here (see :func:`path_permutation`), because the class token is
    placed on the forward sequence before the path is flipped.
    """
    if H < 1 or W < 1:
        raise ConfigError(f'grid must be at least 1x1, got {H}x{W}')
    key = tuple(kv for kv in normalize_order(spec) if kv[0] != 'reverse')
    return _rank_cached(int(H), int(W), key)


@constant_cache(256)
def _rank_on(H: int, W: int, key: tuple, device: str) -> torch.Tensor:
    return _rank_cached(H, W, key).to(device)


def scan_rank_on(H: int, W: int, spec, device) -> torch.Tensor:
    """:func:`scan_rank` on ``device``, cached there (no host-to-device copy per forward,
    which also keeps the forward pass capturable in a CUDA graph)."""
    if H < 1 or W < 1:
        raise ConfigError(f'grid must be at least 1x1, got {H}x{W}')
    key = tuple(kv for kv in normalize_order(spec) if kv[0] != 'reverse')
    return _rank_on(int(H), int(W), key, str(torch.device(device)))


def is_reverse(spec) -> bool:
    return dict(normalize_order(spec))['reverse']


def path_permutation(rank: torch.Tensor, pos: torch.Tensor, cls_index: int = -1,
                     reverse: bool = False, n_patches: Optional[int] = None) -> torch.Tensor:
    """Order of the present tokens along one path.

    Args:
        rank: (H*W,) rank of the path (for a reversed path, the rank of the *forward* order).
        pos: (L,) or (B, L) raster grid position of every token of the sequence; the class token
            (if any) has position ``-1`` and sits at ``cls_index``; other tokens without a
            position (``-2``, EViT's fused token) open every path (see below).
        cls_index: index of the class token in the sequence, or -1 if there is none.
        reverse: run the path backwards (after placing the class token).
        n_patches: the number of patch tokens per sample, if known (saves a device sync).

    Returns:
        Index tensor, same shape as ``pos``: ``seq[..., perm]`` is the path's sequence. The patch
        tokens are sorted by ``rank``, the class token is inserted at the middle index
        ``n // 2`` of the forward sequence (``n`` patch tokens), and the whole sequence is flipped
        when ``reverse``. For Vim's backward path this is exactly ``seq.flip(1)``.

    EViT's fused token is scanned first in every path, reversed ones included: a scan is
    causal, so a token is read only by the tokens after it, and EViT's rule is that every kept
    token (the class token too) reads the fused token, as every token attends to it in a ViT.
    Scanned last, nothing would read it and EViT would equal pruning.
    """
    batched = pos.dim() == 2
    p = pos if batched else pos.unsqueeze(0)
    rank = rank.to(p.device)
    is_patch = p >= 0
    n = int(is_patch[0].sum()) if n_patches is None else n_patches
    big = rank.numel()
    key = torch.where(is_patch, rank[p.clamp(min=0)], torch.full_like(p, big))
    order = stable_argsort(key, dim=1)
    patches = order[:, :n]
    if cls_index >= 0:
        cls = torch.full((p.shape[0], 1), cls_index, dtype=order.dtype, device=p.device)
        perm = torch.cat([patches[:, :cls_slot(n)], cls, patches[:, cls_slot(n):]], dim=1)
    else:
        perm = patches
    if reverse:
        perm = perm.flip(1)
    extra = p.shape[1] - perm.shape[1]
    if extra:  # tokens without a grid position (EViT's fused token) open every path
        fused = (p < 0) & (torch.arange(p.shape[1], device=p.device) != cls_index)
        fused_idx = stable_argsort((~fused).to(torch.int8), dim=1)[:, :extra]
        perm = torch.cat([fused_idx, perm], dim=1)
    return perm if batched else perm[0]


def masked_path_permutation(rank: torch.Tensor, pos: torch.Tensor, kept: torch.Tensor,
                            cls_index: int = -1, reverse: bool = False) -> torch.Tensor:
    """Per-sample order of a full sequence along one path for a masked training forward: the
    kept tokens first, exactly as :func:`path_permutation` orders them after the dropped ones
    are removed (patches by ``rank``, the class token at the middle slot ``n_b // 2`` of the
    sample's ``n_b`` kept patches, flipped when ``reverse``), then the dropped tokens.

    A causal conv and a forward scan over this order give the kept tokens exactly what
    physically pruned inference gives them (their prefix never sees the dropped suffix), with a
    different number of kept tokens in every sample (DyVM's reordering, for any rank order).

    Args:
        rank: (H*W,) the path's forward rank; pos: (L,) grid position per token (-1: class
            token at ``cls_index``); kept: (B, L) bool (the class token must be kept).

    Returns:
        (B, L) long: ``seq[b, perm[b]]`` is sample b's sequence in this path's order.
    """
    B, L = kept.shape
    p = pos.to(kept.device)
    is_patch = p >= 0
    kp = kept & is_patch
    r = torch.where(is_patch, rank.to(p.device)[p.clamp(min=0)], torch.zeros_like(p))
    big = float(2 * L + 2)
    # forward index of each kept patch among the sample's kept patches (0 .. n_b - 1)
    fkey = torch.where(kp, r.expand(B, -1), torch.full_like(kp, L, dtype=r.dtype) + r)
    j = torch.argsort(torch.argsort(fkey, dim=1, stable=True), dim=1).to(torch.float64)
    key = torch.where(kp, j, torch.full_like(j, big))
    if cls_index >= 0:
        n = kp.sum(1).to(torch.float64)
        key[:, cls_index] = torch.div(n, 2, rounding_mode='floor') - 0.5
    if reverse:
        key = torch.where(key < big, -key, key)
    # dropped tokens after every kept one, in sequence order
    key = torch.where(key < big, key, big + torch.arange(L, device=p.device, dtype=key.dtype))
    return torch.argsort(key, dim=1, stable=True)

