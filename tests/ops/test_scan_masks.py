"""The exact masks of a selective scan (learned reducers' training masks), float64 on CPU.

(a) removal mask == the scan of the sequence with the removed tokens deleted;
(b) alignment (zero features before x_proj: step softplus(dt_bias), B = C = 0, no input) ==
    the gap-folded scan of the kept tokens;
(c) removed steps as pads anywhere, in both scan directions, leave the valid outputs unchanged;
and the straight-through gradient reaches the mask.
"""
import pytest
import torch
import torch.nn.functional as F

from amvim_mm.ops.selective_scan import (aligned_selective_scan, removal_masked_scan,
                                         selective_scan_ref)

TOL = 1e-10


def _inputs(b=2, E=3, L=11, N=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)   # noqa: E731
    return dict(u=r(b, E, L), delta=r(b, E, L), A=-torch.rand(E, N, generator=g,
                                                               dtype=dtype) * 2 - 0.1,
                B=r(b, N, L), C=r(b, N, L), D=r(E), z=r(b, E, L), delta_bias=r(E) * 0.5)


def _mask(b, L, keep, seed=1):
    """(b, L) float mask keeping ``keep`` random positions per sample."""
    g = torch.Generator().manual_seed(seed)
    m = torch.zeros(b, L, dtype=torch.float64)
    for i in range(b):
        m[i, torch.randperm(L, generator=g)[:keep]] = 1
    return m


def _gather(t, idx):
    """(b, X, L) at (b, K) positions along the last axis."""
    return torch.gather(t, 2, idx.unsqueeze(1).expand(-1, t.shape[1], -1))


def test_a_removal_mask_equals_the_deleted_sequence():
    x = _inputs()
    m = _mask(2, 11, 6)
    idx = torch.stack([r.nonzero().flatten() for r in m])               # (b, 6) kept, in order
    y = removal_masked_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], m, D=x['D'], z=x['z'],
                            delta_bias=x['delta_bias'], backend='reference')
    ref = selective_scan_ref(*(_gather(x[k], idx) for k in ('u', 'delta')), x['A'],
                             _gather(x['B'], idx), _gather(x['C'], idx), D=x['D'],
                             z=_gather(x['z'], idx), delta_bias=x['delta_bias'],
                             delta_softplus=True)
    assert (_gather(y, idx) - ref).abs().max() <= TOL
    # the torch backend (parallel scan) agrees
    yt = removal_masked_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], m, D=x['D'],
                             z=x['z'], delta_bias=x['delta_bias'], backend='torch')
    assert (_gather(yt, idx) - ref).abs().max() <= 1e-9
    # without the mask the kept outputs differ: the test can fail
    full = selective_scan_ref(x['u'], x['delta'], x['A'], x['B'], x['C'], D=x['D'], z=x['z'],
                              delta_bias=x['delta_bias'], delta_softplus=True)
    assert (_gather(full, idx) - ref).abs().max() > 1e-3


def test_b_alignment_mask_equals_gap_folding():
    """Zero features before x_proj at the removed steps: u = 0, raw delta = 0 (the step is
    softplus(dt_bias)), B = C = 0; the full-length scan read at the kept steps equals the
    aligned scan of the kept tokens with gap sums of softplus(dt_bias)."""
    x = _inputs(L=13)
    m = _mask(2, 13, 7, seed=3)
    keep = m.bool()
    zero = {k: x[k] * m[:, None, :] for k in ('u', 'delta', 'B', 'C')}
    full = selective_scan_ref(zero['u'], zero['delta'], x['A'], zero['B'], zero['C'], D=x['D'],
                              z=x['z'], delta_bias=x['delta_bias'], delta_softplus=True)
    idx = torch.stack([r.nonzero().flatten() for r in keep])
    prev = torch.cat([torch.full_like(idx[:, :1], -1), idx[:, :-1]], 1)
    gaps = (idx - prev - 1).to(torch.float64)                            # (b, K) removed before
    gap_delta = gaps[:, None, :] * F.softplus(x['delta_bias'])[None, :, None]
    got = aligned_selective_scan(_gather(x['u'], idx), _gather(x['delta'], idx), x['A'],
                                 _gather(x['B'], idx), _gather(x['C'], idx), D=x['D'],
                                 z=_gather(x['z'], idx), delta_bias=x['delta_bias'],
                                 gap_delta=gap_delta, backend='reference')
    assert (got - _gather(full, idx)).abs().max() <= TOL
    # removal semantics differ from alignment (the state does not decay over a removed step)
    rem = removal_masked_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], m, D=x['D'],
                              z=x['z'], delta_bias=x['delta_bias'], backend='reference')
    assert (_gather(rem, idx) - got).abs().max() > 1e-3


@pytest.mark.parametrize('where', ['start', 'middle', 'end'])
@pytest.mark.parametrize('reverse', [False, True], ids=['forward', 'backward'])
def test_c_removed_pads_leave_valid_outputs_unchanged(where, reverse):
    """A shorter sequence padded with removed steps (arbitrary values) gives the same outputs
    at its own positions, scanned forwards or backwards (flipped)."""
    x = _inputs(L=8)
    pad = 5
    g = torch.Generator().manual_seed(7)
    at = {'start': 0, 'middle': 4, 'end': 8}[where]

    def padded(t):
        junk = torch.randn(*t.shape[:-1], pad, generator=g, dtype=t.dtype) * 3
        return torch.cat([t[..., :at], junk, t[..., at:]], -1)

    m = torch.ones(2, 8 + pad, dtype=torch.float64)
    m[:, at:at + pad] = 0
    flip = (lambda t: t.flip(-1)) if reverse else (lambda t: t)          # noqa: E731
    keys = ('u', 'delta', 'B', 'C', 'z')
    ref = flip(selective_scan_ref(*(flip(x[k]) for k in ('u', 'delta')), x['A'], flip(x['B']),
                                  flip(x['C']), D=x['D'], z=flip(x['z']),
                                  delta_bias=x['delta_bias'], delta_softplus=True))
    p = {k: flip(padded(x[k])) for k in keys}
    y = flip(removal_masked_scan(p['u'], p['delta'], x['A'], p['B'], p['C'], flip(m), D=x['D'],
                                 z=p['z'], delta_bias=x['delta_bias'], backend='reference'))
    valid = torch.cat([y[..., :at], y[..., at + pad:]], -1)
    assert (valid - ref).abs().max() <= TOL


def test_straight_through_gradient_reaches_the_mask():
    x = _inputs(L=9)
    m = _mask(2, 9, 5).requires_grad_(True)
    y = removal_masked_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], m, D=x['D'],
                            delta_bias=x['delta_bias'], backend='torch')
    y.square().sum().backward()
    assert m.grad is not None and torch.isfinite(m.grad).all() and m.grad.abs().sum() > 0


def test_bad_mask_shape_is_named():
    x = _inputs()
    with pytest.raises(Exception, match=r'mask must be \(batch, L\)'):
        removal_masked_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], torch.ones(2, 5))
