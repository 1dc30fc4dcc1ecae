"""Scan orders as ranks: hand-written expectations, permutations, inverses, class token."""
import pytest
import torch

from amvim_mm.models.layout.scan_context import PathIndex, ScanContext
from amvim_mm.models.layout.scan_orders import (normalize_order, path_permutation,
                                                scan_rank)


def order_of(H, W, spec):
    """The raster positions in visiting order (reverse applied), as (row, col) pairs."""
    rank = scan_rank(H, W, spec)
    seq = torch.argsort(rank).tolist()
    if normalize_order(spec) and dict(normalize_order(spec))['reverse']:
        seq = seq[::-1]
    return [(p // W, p % W) for p in seq]


def windows_reference(H, W, k, inner, outer='row'):
    """Independent loop: top-left anchored k x k windows, partial at the border."""
    out = []
    wins = [(wr, wc) for wr in range(0, H, k) for wc in range(0, W, k)]
    if outer == 'col':
        wins = [(wr, wc) for wc in range(0, W, k) for wr in range(0, H, k)]
    for wr, wc in wins:
        rows = range(wr, min(wr + k, H))
        cols = range(wc, min(wc + k, W))
        if inner == 'row':
            out += [(r, c) for r in rows for c in cols]
        else:
            out += [(r, c) for c in cols for r in rows]
    return out


def test_amvim_d2_d4_first_tokens_14x14():
    spec = dict(order='window', size=3, inner='col', reverse=True)
    assert order_of(14, 14, spec)[:5] == [(13, 13), (12, 13), (13, 12), (12, 12), (13, 11)]


@pytest.mark.parametrize('H,W', [(14, 14), (7, 5), (4, 9), (1, 1), (3, 3), (10, 4)])
@pytest.mark.parametrize('k', [1, 2, 3, 7])
@pytest.mark.parametrize('inner', ['row', 'col'])
@pytest.mark.parametrize('outer', ['row', 'col'])
def test_windows_match_loop(H, W, k, inner, outer):
    spec = dict(order='window', size=k, inner=inner, outer=outer)
    assert order_of(H, W, spec) == windows_reference(H, W, k, inner, outer)
    rev = dict(spec, reverse=True)
    assert order_of(H, W, rev) == windows_reference(H, W, k, inner, outer)[::-1]


def test_basic_orders_small_grid():
    assert order_of(2, 3, 'raster') == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert order_of(2, 3, dict(order='raster', reverse=True)) == \
        [(1, 2), (1, 1), (1, 0), (0, 2), (0, 1), (0, 0)]
    assert order_of(2, 3, 'column') == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert order_of(2, 3, dict(order='column', reverse=True)) == \
        [(1, 2), (0, 2), (1, 1), (0, 1), (1, 0), (0, 0)]


def test_window_size_one_is_raster_and_full_window_is_column():
    assert torch.equal(scan_rank(5, 6, dict(order='window', size=1)), scan_rank(5, 6, 'raster'))
    assert torch.equal(scan_rank(5, 6, dict(order='window', size=6, inner='col')),
                       scan_rank(5, 6, 'column'))


def test_random_orders_reproducible():
    a = scan_rank(6, 6, dict(order='random', seed=1))
    assert torch.equal(a, scan_rank(6, 6, dict(order='random', seed=1)))
    assert not torch.equal(a, scan_rank(6, 6, dict(order='random', seed=2)))
    assert sorted(a.tolist()) == list(range(36))
    w = scan_rank(6, 6, dict(order='window', size=3, inner='random', seed=5))
    # windows stay contiguous: the first 9 visited cells are the top-left window
    first = torch.argsort(w)[:9].tolist()
    assert sorted(first) == sorted(r * 6 + c for r in range(3) for c in range(3))
    # the same random inner order in every full window
    inner0 = [(p // 6 % 3, p % 6 % 3) for p in torch.argsort(w)[:9].tolist()]
    inner1 = [(p // 6 % 3, p % 6 % 3) for p in torch.argsort(w)[9:18].tolist()]
    assert inner0 == inner1 and inner0 != [(r, c) for r in range(3) for c in range(3)]


def test_shifted_windows():
    # shift 1 on a 4x4 grid with 2x2 windows: cell (1,1) starts the first window
    spec = dict(order='window', size=2, shift=1)
    seq = order_of(4, 4, spec)
    assert seq[:4] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert sorted(seq) == [(r, c) for r in range(4) for c in range(4)]


@pytest.mark.parametrize('H,W', [(14, 14), (7, 5), (5, 8), (2, 2)])
@pytest.mark.parametrize('spec', [dict(order='raster'), dict(order='raster', reverse=True),
                                  dict(order='column'), dict(order='window', size=3,
                                                             inner='col', reverse=True),
                                  dict(order='window', size=2, shift=1),
                                  dict(order='random', seed=3)])
@pytest.mark.parametrize('with_cls', [True, False])
def test_permutation_and_inverse_with_reduction(H, W, spec, with_cls):
    M = H * W
    g = torch.Generator().manual_seed(H * 100 + W)
    # a reduced set of survivors per sample (same count), in original order
    n_keep = max(1, M - M // 3)
    pos = torch.stack([torch.sort(torch.randperm(M, generator=g)[:n_keep]).values
                       for _ in range(3)])
    cls_index = -1
    if with_cls:
        cls_index = n_keep // 2
        pos = torch.cat([pos[:, :cls_index], torch.full((3, 1), -1), pos[:, cls_index:]], 1)
    rank = scan_rank(H, W, spec)
    reverse = dict(normalize_order(spec))['reverse']
    perm = path_permutation(rank, pos, cls_index, reverse)
    L = pos.shape[1]
    for b in range(3):
        assert sorted(perm[b].tolist()) == list(range(L))  # a permutation of present tokens
        seq = pos[b, perm[b]]
        patches = seq[seq >= 0]
        r = rank[patches]
        expect_sorted = torch.sort(r, descending=reverse).values
        assert torch.equal(r, expect_sorted)  # survivors in this path's rank order
        if with_cls:
            fwd = seq.flip(0) if reverse else seq
            assert fwd[n_keep // 2] == -1   # class token at the middle of the forward path
    x = torch.randn(3, L, 4)
    idx = PathIndex(perm)
    assert torch.equal(idx.to_tokens(idx.to_path(x)), x)


def test_vim_paths_are_identity_and_flip():
    ctx = ScanContext((14, 14), cls_index=98)
    assert ctx.path_index(dict(order='raster')).kind == 'identity'
    assert ctx.path_index(dict(order='raster', reverse=True)).kind == 'flip'
    ctx_odd = ScanContext((7, 7), cls_index=24)  # Vim's flip for odd M: cls at 25 in path 2
    idx = ctx_odd.path_index(dict(order='raster', reverse=True))
    assert idx.kind == 'flip'


def test_order_spec_errors():
    with pytest.raises(ValueError, match="unknown scan order 'zigzag'"):
        normalize_order(dict(order='zigzag'))
    with pytest.raises(ValueError, match=r"does not take \['size'\]"):
        normalize_order(dict(order='raster', size=3))
    with pytest.raises(ValueError, match='window size must be a positive int'):
        normalize_order(dict(order='window', size=0))
    with pytest.raises(ValueError, match='inner order must be row, col or random'):
        normalize_order(dict(order='window', inner='diag'))


def test_a_new_order_is_one_class():
    """docs/how_to_add_a_scan_order.md: one registered class, and every path, reducer and
    output works with it."""
    import amvim_mm.models.layout.scan_orders as so
    from amvim_mm.registry import MODELS

    @so.register_scan_order
    class Diagonal(so.ScanOrder):
        name = 'test_diagonal'

        def rank(self, H, W):
            pos = torch.arange(H * W)
            r, c = pos // W, pos % W
            return so._dense_rank((r + c) * H + r)

    try:
        assert scan_rank(3, 4, dict(order='test_diagonal')).view(3, 4).tolist() == \
            [[0, 1, 3, 6], [2, 4, 7, 9], [5, 8, 10, 11]]
        with pytest.raises(ValueError, match=r"does not take \['size'\]"):
            normalize_order(dict(order='test_diagonal', size=2))
        torch.manual_seed(0)
        m = MODELS.build(dict(type='AMVim', arch='test', img_size=64, out_type='featmap',
                              paths=[dict(order='raster'),
                                     dict(order='test_diagonal', reverse=True)],
                              token_reduction=dict(type='ToP', keep_rate=0.7,
                                                   locations=(1, )))).eval()
        with torch.no_grad():
            out = m(torch.randn(1, 3, 64, 48))
        assert out[-1].shape == (1, 32, 4, 3) and torch.isfinite(out[-1]).all()
    finally:
        so.SCAN_ORDERS.pop('test_diagonal', None)


def test_a_broken_order_is_refused():
    import amvim_mm.models.layout.scan_orders as so

    @so.register_scan_order
    class Broken(so.ScanOrder):
        name = 'test_broken'

        def rank(self, H, W):
            return torch.zeros(H * W, dtype=torch.long)

    try:
        with pytest.raises(ValueError, match='no permutation'):
            scan_rank(2, 2, dict(order='test_broken'))
    finally:
        so.SCAN_ORDERS.pop('test_broken', None)
    with pytest.raises(ValueError, match='reserved'):
        @so.register_scan_order
        class Bad(so.ScanOrder):
            name = 'test_bad'
            params = dict(reverse=False)
