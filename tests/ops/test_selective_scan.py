"""Selective scan backends: torch vs the sequential reference, gap folding, backend choice."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import pytest
import torch
import torch.nn.functional as F

from amvim_mm.ops import backends
from amvim_mm.ops import selective_scan as ss
from amvim_mm.ops.selective_scan import (aligned_selective_scan, gap_deltas_from_mask,
                                         kept_indices, selective_scan_fn, selective_scan_ref,
                                         selective_scan_torch)

NAMES = ('u', 'delta', 'A', 'B', 'C', 'D', 'z', 'delta_bias')


def make_inputs(bsz: int = 2,
                dim: int = 6,
                dstate: int = 4,
                length: int = 37,
                *,
                dtype: torch.dtype = torch.float32,
                seed: int = 0,
                groups: Optional[int] = None,
                a_scale: float = 1.0,
                delta_shift: float = 0.0,
                device: str = 'cpu') -> Dict[str, torch.Tensor]:
    """Random inputs shaped like mamba-ssm's (A = -exp(A_log), as in the models)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    bc_shape = (bsz, dstate, length) if groups is None else (bsz, groups, dstate, length)
    x = dict(u=rnd(bsz, dim, length), delta=rnd(bsz, dim, length) * 0.5 + delta_shift,
             A=-torch.exp(rnd(dim, dstate) * 0.5) * a_scale, B=rnd(*bc_shape), C=rnd(*bc_shape),
             D=rnd(dim), z=rnd(bsz, dim, length), delta_bias=rnd(dim) * 0.5)
    return {k: v.to(device=device, dtype=dtype) for k, v in x.items()}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| in float64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def call(fn, x: Dict[str, torch.Tensor], *, use_D=True, use_z=True, use_bias=True,
         softplus=True, **kw):
    return fn(x['u'], x['delta'], x['A'], x['B'], x['C'], D=x['D'] if use_D else None,
              z=x['z'] if use_z else None, delta_bias=x['delta_bias'] if use_bias else None,
              delta_softplus=softplus, **kw)


# ----------------------------------------------------------------------------------------------
# forward: torch == reference
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('use_D', [True, False])
@pytest.mark.parametrize('use_z', [True, False])
@pytest.mark.parametrize('use_bias', [True, False])
@pytest.mark.parametrize('softplus', [True, False])
def test_forward_options_match_reference(use_D, use_z, use_bias, softplus):
    x = make_inputs(length=45, seed=1)
    if not softplus:  # raw delta must be a positive step size without the softplus
        x['delta'] = F.softplus(x['delta'])
        x['delta_bias'] = x['delta_bias'].abs()
    kw = dict(use_D=use_D, use_z=use_z, use_bias=use_bias, softplus=softplus)
    ref = call(selective_scan_ref, x, **kw)
    assert ref.dtype == torch.float32 and ref.shape == x['u'].shape
    for method, chunk in (('chunked', None), ('chunked', 4), ('chunked', 45), ('logstep', None)):
        out = call(selective_scan_torch, x, method=method, chunk_size=chunk, **kw)
        assert out.dtype == torch.float32
        assert rel_err(out, ref) < 1e-5, (method, chunk)


@pytest.mark.parametrize('length', [1, 2, 7, 8, 9, 64, 65, 197])
@pytest.mark.parametrize('method', ['chunked', 'logstep'])
def test_forward_lengths(length, method):
    """Lengths around the chunk and power-of-two boundaries (padding, single chunk, L = 1)."""
    x = make_inputs(length=length, seed=length)
    ref = call(selective_scan_ref, x)
    assert rel_err(call(selective_scan_torch, x, method=method), ref) < 1e-5


def test_grouped_bc_matches_per_group():
    """B, C of shape (batch, G, N, L): group g serves channels g*E/G .. (g+1)*E/G - 1."""
    x = make_inputs(dim=6, groups=2, seed=3)
    ref = call(selective_scan_ref, x)
    parts = []
    for g, sl in enumerate((slice(0, 3), slice(3, 6))):
        parts.append(
            selective_scan_ref(x['u'][:, sl], x['delta'][:, sl], x['A'][sl], x['B'][:, g],
                               x['C'][:, g], D=x['D'][sl], z=x['z'][:, sl],
                               delta_bias=x['delta_bias'][sl], delta_softplus=True))
    assert rel_err(torch.cat(parts, 1), ref) < 1e-6
    for method in ('chunked', 'logstep'):
        assert rel_err(call(selective_scan_torch, x, method=method), ref) < 1e-5


def test_long_sequence_4096():
    x = make_inputs(bsz=1, dim=3, dstate=4, length=4096, seed=4)
    ref = call(selective_scan_ref, x)
    out = call(selective_scan_torch, x)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-5


def test_strong_decay_no_overflow():
    """Large |A| and large delta: exp(-cumsum(delta * A)) overflows, the scans must not."""
    x = make_inputs(bsz=1, dim=4, dstate=4, length=512, seed=5, a_scale=50.0, delta_shift=3.0)
    dt = F.softplus(x['delta'] + x['delta_bias'][:, None])
    naive = torch.exp(-torch.cumsum(dt.unsqueeze(-1) * x['A'][:, None, :], dim=-2))
    assert torch.isinf(naive).any()  # the closed form would blow up on these inputs
    ref = call(selective_scan_ref, x)
    for method in ('chunked', 'logstep'):
        out = call(selective_scan_torch, x, method=method)
        assert torch.isfinite(out).all()
        assert rel_err(out, ref) < 1e-5


def test_bf16_inputs_computed_in_fp32():
    x = make_inputs(length=60, seed=6, dtype=torch.bfloat16)
    ref = call(selective_scan_ref, x)
    out = call(selective_scan_torch, x)
    assert out.dtype == torch.bfloat16 and ref.dtype == torch.bfloat16
    # fp32 result of the same (bf16-rounded) inputs, rounded once to bf16 at the end
    ref32 = call(selective_scan_ref, {k: v.float() for k, v in x.items()})
    assert rel_err(ref, ref32) < 2**-7
    assert rel_err(out, ref32) < 2**-7
    assert rel_err(out, ref) < 2**-7
    # a scan computed in bf16 throughout would be far off; ours equal up to final rounding
    assert (out.float() - ref32.bfloat16().float()).abs().max() <= 2**-7 * ref32.abs().max()


def test_return_last_state():
    x = make_inputs(length=50, seed=7)
    y_ref, h_ref = call(selective_scan_ref, x, return_last_state=True)
    assert h_ref.shape == (2, 6, 4) and h_ref.dtype == torch.float32
    # the last state is the recurrence itself: y_L = <C_L, h_L> + D u_L (no z)
    y_noz = call(selective_scan_ref, x, use_z=False)
    y_last = (h_ref * x['C'][:, None, :, -1]).sum(-1) + x['D'] * x['u'][..., -1]
    assert rel_err(y_last, y_noz[..., -1]) < 1e-6
    for method, chunk in (('chunked', None), ('chunked', 16), ('chunked', 7), ('logstep', None)):
        y, h = call(selective_scan_torch, x, return_last_state=True, method=method,
                    chunk_size=chunk)
        assert h.dtype == torch.float32 and h.shape == h_ref.shape
        assert rel_err(y, y_ref) < 1e-5 and rel_err(h, h_ref) < 1e-5
    xb = {k: v.bfloat16() for k, v in x.items()}
    y, h = call(selective_scan_torch, xb, return_last_state=True)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------
def _grads(fn, x, **kw):
    x = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    out = call(fn, x, **kw)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * w).sum().backward()
    return out.detach(), {k: x[k].grad for k in NAMES}


@pytest.mark.parametrize('method,chunk', [('chunked', None), ('chunked', 5), ('logstep', None)])
def test_gradients_float64(method, chunk):
    x = make_inputs(length=23, seed=8, dtype=torch.float64)
    _, g_ref = _grads(selective_scan_ref, x)
    _, g = _grads(selective_scan_torch, x, method=method, chunk_size=chunk)
    for k in NAMES:
        assert g[k] is not None, k
        assert rel_err(g[k], g_ref[k]) < 1e-10, k


def test_gradients_float32_strong_decay():
    x = make_inputs(length=96, seed=9, a_scale=20.0, delta_shift=1.0)
    _, g_ref = _grads(selective_scan_ref, x)
    _, g = _grads(selective_scan_torch, x)
    for k in NAMES:
        assert torch.isfinite(g[k]).all(), k
        assert rel_err(g[k], g_ref[k]) < 1e-4, k


def test_gradcheck_torch_scan():
    x = make_inputs(bsz=1, dim=2, dstate=2, length=5, seed=10, dtype=torch.float64)
    inputs = tuple(x[k].requires_grad_(True) for k in NAMES)

    def f(*args):
        kw = dict(zip(NAMES, args, strict=True))
        return selective_scan_torch(kw['u'], kw['delta'], kw['A'], kw['B'], kw['C'], kw['D'],
                                    kw['z'], kw['delta_bias'], delta_softplus=True,
                                    chunk_size=2)

    assert torch.autograd.gradcheck(f, inputs)


# ----------------------------------------------------------------------------------------------
# shape errors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('fn', [selective_scan_ref, selective_scan_torch])
def test_shape_errors_name_the_shapes(fn):
    x = make_inputs(length=10)
    bad = dict(x, B=x['B'][..., :9])
    with pytest.raises(ValueError, match=r'B must have shape .*\(2, 4, 9\)'):
        call(fn, bad)
    with pytest.raises(ValueError, match=r'delta must have the shape of u \(2, 6, 10\)'):
        call(fn, dict(x, delta=x['delta'][:, :5]))
    with pytest.raises(ValueError, match=r'A must have shape \(E=6, N\); got \(5, 4\)'):
        call(fn, dict(x, A=x['A'][:5]))
    with pytest.raises(ValueError, match=r'D must have shape \(E=6,\); got \(7,\)'):
        call(fn, dict(x, D=torch.zeros(7)))
    with pytest.raises(ValueError, match=r'divisible by G'):
        call(fn, dict(x, B=torch.zeros(2, 4, 4, 10)))


# ----------------------------------------------------------------------------------------------
# ToP alignment by gap folding
# ----------------------------------------------------------------------------------------------
def _masks(length: int, bsz: int, keep: int, seed: int) -> Dict[str, torch.Tensor]:
    """Keep masks (batch, L), same kept count per sample, with the interesting layouts."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    rand = torch.zeros(bsz, length, dtype=torch.bool)
    for i in range(bsz):
        rand[i, torch.randperm(length, generator=g)[:keep]] = True
    out['random'] = rand
    m = torch.zeros(bsz, length, dtype=torch.bool)  # gap at the start, then kept
    m[:, length - keep:] = True
    out['gap_at_start'] = m
    m = torch.zeros(bsz, length, dtype=torch.bool)  # kept at both ends, one long gap
    m[:, :keep // 2] = True
    m[:, length - (keep - keep // 2):] = True
    out['long_gap'] = m
    m = torch.zeros(bsz, length, dtype=torch.bool)  # gap at the end (trailing pruned)
    m[:, :keep] = True
    out['gap_at_end'] = m
    out['all_kept'] = torch.ones(bsz, length, dtype=torch.bool)
    return out


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (batch, X, L) at positions idx (batch, K) -> (batch, X, K)."""
    return x.gather(-1, idx[:, None, :].expand(-1, x.shape[1], -1))


def _aligned_case(mask: torch.Tensor, x: Dict[str, torch.Tensor], pruned_delta: torch.Tensor,
                  reverse: bool, backend: str) -> float:
    """Relative error of the gap-folded scan against the full-length scan with zero input."""
    if reverse:  # this path scans the grid backwards: everything in the path's order
        x = {k: (v.flip(-1) if v.dim() >= 3 else v) for k, v in x.items()}
        mask = mask.flip(-1)
        if pruned_delta.dim() == 3:
            pruned_delta = pruned_delta.flip(-1)
    dt_kept = F.softplus(x['delta'] + x['delta_bias'][:, None])
    full_pd = pruned_delta.expand_as(x['u']) if pruned_delta.dim() == 3 else \
        pruned_delta[:, None].expand_as(x['u'])
    d_full = torch.where(mask[:, None], dt_kept, full_pd)
    u_full = torch.where(mask[:, None], x['u'], torch.zeros_like(x['u']))
    want = selective_scan_ref(u_full, d_full, x['A'], x['B'], x['C'], D=x['D'], z=x['z'],
                              delta_softplus=False)
    idx = kept_indices(mask)
    want = _gather(want, idx)
    gap = gap_deltas_from_mask(mask, pruned_delta)
    got = aligned_selective_scan(_gather(x['u'], idx), _gather(x['delta'], idx), x['A'],
                                 _gather(x['B'], idx), _gather(x['C'], idx), x['D'],
                                 _gather(x['z'], idx), x['delta_bias'], gap, backend=backend)
    assert got.shape == want.shape and got.dtype == x['u'].dtype
    return rel_err(got, want)


@pytest.mark.parametrize('layout', ['random', 'gap_at_start', 'long_gap', 'gap_at_end',
                                    'all_kept'])
@pytest.mark.parametrize('reverse', [False, True], ids=['forward', 'reversed'])
@pytest.mark.parametrize('backend', ['torch', 'reference'])
def test_aligned_scan_equals_full_scan_with_zero_input(layout, reverse, backend):
    length, keep = 40, 29
    x64 = make_inputs(bsz=2, dim=5, dstate=4, length=length, seed=11, dtype=torch.float64)
    mask = _masks(length, 2, keep, seed=12)[layout]
    pd_bias = F.softplus(x64['delta_bias'])  # the project's default: softplus(dt_bias), (E,)
    pd_full = F.softplus(torch.randn(2, 5, length, dtype=torch.float64,
                                     generator=torch.Generator().manual_seed(13)))
    for pd in (pd_bias, pd_full):
        assert _aligned_case(mask, x64, pd, reverse, backend) < 1e-12
        x32 = {k: v.float() for k, v in x64.items()}
        assert _aligned_case(mask, x32, pd.float(), reverse, backend) < 1e-5


def test_aligned_scan_long_gaps_long_sequence():
    """L = 1024 with 3/4 pruned in runs, strong decay: still exact to fp32 rounding."""
    length = 1024
    x = make_inputs(bsz=2, dim=3, dstate=4, length=length, seed=14, a_scale=5.0)
    g = torch.Generator().manual_seed(15)
    mask = torch.zeros(2, length, dtype=torch.bool)
    for i in range(2):
        mask[i, torch.randperm(length // 16, generator=g)[:64] * 16] = True  # gaps of 15+
    for reverse in (False, True):
        pd = F.softplus(x['delta_bias'])
        assert _aligned_case(mask, x, pd, reverse, 'torch') < 1e-5


def test_aligned_scan_no_gap_is_plain_scan():
    x = make_inputs(length=30, seed=16)
    ref = call(selective_scan_ref, x)
    out = aligned_selective_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], x['D'], x['z'],
                                 x['delta_bias'], gap_delta=torch.zeros_like(x['u']))
    assert rel_err(out, ref) < 1e-5
    out = aligned_selective_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], x['D'], x['z'],
                                 x['delta_bias'], gap_delta=None)
    assert rel_err(out, ref) < 1e-5


def test_aligned_scan_bf16_and_grad():
    x = make_inputs(length=20, seed=17)
    mask = _masks(20, 2, 12, seed=18)['random']
    idx = kept_indices(mask)
    gap = gap_deltas_from_mask(mask, F.softplus(x['delta_bias']))
    kept = {k: (_gather(v, idx) if v.dim() == 3 else v) for k, v in x.items()}
    args = lambda d: (d['u'], d['delta'], d['A'], d['B'], d['C'], d['D'], d['z'],  # noqa: E731
                      d['delta_bias'])
    y32 = aligned_selective_scan(*args(kept), gap)
    kb = {k: v.bfloat16() for k, v in kept.items()}
    yb = aligned_selective_scan(*args(kb), gap)
    assert yb.dtype == torch.bfloat16
    y32b = aligned_selective_scan(*args({k: v.float() for k, v in kb.items()}), gap)
    assert rel_err(yb, y32b) < 2**-7
    # gradients flow to every input, the gap included
    leaves = {k: v.clone().requires_grad_(True) for k, v in kept.items()}
    gap_l = gap.clone().requires_grad_(True)
    aligned_selective_scan(*args(leaves), gap_l).square().sum().backward()
    for k, v in leaves.items():
        assert v.grad is not None and torch.isfinite(v.grad).all(), k
    assert gap_l.grad is not None and torch.isfinite(gap_l.grad).all()
    assert y32.shape == (2, 6, 12)


def test_gap_deltas_from_mask_hand_example():
    mask = torch.tensor([[False, False, True, False, True, True, False],
                         [True, False, False, False, True, False, True]])
    pd = torch.arange(1., 8.).expand(2, 1, 7)  # value = position + 1, one channel
    gap = gap_deltas_from_mask(mask, pd)
    # sample 0: kept at 2, 4, 5 -> gaps {0, 1}, {3}, {} (trailing 6 dropped)
    # sample 1: kept at 0, 4, 6 -> gaps {}, {1, 2, 3}, {5}
    assert gap.shape == (2, 1, 3)
    assert gap[0, 0].tolist() == [1. + 2., 4., 0.]
    assert gap[1, 0].tolist() == [0., 2. + 3. + 4., 6.]
    # (E,) pruned delta broadcasts over batch and positions
    gap_e = gap_deltas_from_mask(mask, torch.tensor([0.5, 2.0]))
    assert gap_e.shape == (2, 2, 3)
    assert gap_e[1, 1].tolist() == [0., 6., 2.]
    assert kept_indices(mask).tolist() == [[2, 4, 5], [0, 4, 6]]


def test_gap_deltas_from_mask_errors():
    mask = torch.tensor([[True, False, True], [True, True, True]])
    with pytest.raises(ValueError, match='same number of tokens.*\\[2, 3\\]'):
        gap_deltas_from_mask(mask, torch.ones(3))
    with pytest.raises(ValueError, match='bool'):
        gap_deltas_from_mask(mask.long(), torch.ones(3))
    with pytest.raises(ValueError, match='does not broadcast'):
        gap_deltas_from_mask(mask[:1], torch.ones(1, 2, 4))


# ----------------------------------------------------------------------------------------------
# backend selection
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def spies(monkeypatch):
    """Count calls of the torch and reference implementations behind selective_scan_fn."""
    calls = {'torch': 0, 'reference': 0}

    def wrap(name, fn):
        def spy(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return spy

    monkeypatch.setattr(ss, 'selective_scan_torch', wrap('torch', ss.selective_scan_torch))
    monkeypatch.setattr(ss, 'selective_scan_ref', wrap('reference', ss.selective_scan_ref))
    monkeypatch.setattr(backends, '_logged', set())  # see the once-only log again
    return calls


def test_env_var_picks_reference(monkeypatch, spies, caplog):
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'reference')
    x = make_inputs(length=8)
    with caplog.at_level(logging.INFO, logger='amvim_mm'):
        call(selective_scan_fn, x)
        call(selective_scan_fn, x)
    assert spies == {'torch': 0, 'reference': 2}
    logged = [r.getMessage() for r in caplog.records if 'selective_scan' in r.getMessage()]
    assert len(logged) == 1 and "'reference'" in logged[0]  # logged once
    # an explicit argument wins over the environment
    call(selective_scan_fn, x, backend='torch')
    assert spies == {'torch': 1, 'reference': 2}


def test_auto_on_cpu_is_torch(monkeypatch, spies):
    """Without the compiled CPU kernels (AMVIM_CPU_KERNELS=0) the automatic choice on a CPU is
    the PyTorch scan (with them: tests/ops/test_cpu_ops.py)."""
    monkeypatch.delenv('AMVIM_SCAN_BACKEND', raising=False)
    monkeypatch.setenv('AMVIM_CPU_KERNELS', '0')
    x = make_inputs(length=8)
    out = call(selective_scan_fn, x)
    assert spies == {'torch': 1, 'reference': 0}
    assert rel_err(out, call(selective_scan_ref, x)) < 1e-5
    aligned_selective_scan(x['u'], x['delta'], x['A'], x['B'], x['C'], x['D'], x['z'],
                           x['delta_bias'], torch.zeros_like(x['u']))
    assert spies['torch'] == 2


def test_invalid_backend_names_the_value(monkeypatch):
    x = make_inputs(length=8)
    with pytest.raises(ValueError, match="'fastest'"):
        call(selective_scan_fn, x, backend='fastest')
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'triton')
    with pytest.raises(ValueError, match="'triton'.*AMVIM_SCAN_BACKEND"):
        call(selective_scan_fn, x)


def test_cuda_backend_on_cpu_tensors_raises(monkeypatch):
    x = make_inputs(length=8)
    with pytest.raises(RuntimeError, match='cuda'):
        call(selective_scan_fn, x, backend='cuda')
    # even with the kernel importable, CPU tensors are refused with a clear message

    def fake_kernel(*a, **k):
        raise AssertionError('must not be called with CPU tensors')

    monkeypatch.setattr(backends, 'mamba_selective_scan', lambda: (fake_kernel, 'ok'))
    with pytest.raises(RuntimeError, match='needs CUDA tensors'):
        call(selective_scan_fn, x, backend='cuda')


# ----------------------------------------------------------------------------------------------
# GPU: mamba-ssm's kernel vs the torch backend
# ----------------------------------------------------------------------------------------------
def _mamba_reason() -> str:
    if not torch.cuda.is_available():
        return 'CUDA is not available'
    fn, reason = backends.mamba_selective_scan()
    return '' if fn is not None else f'mamba-ssm selective_scan_fn is not importable: {reason}'


_MAMBA_SKIP = _mamba_reason()
requires_mamba = pytest.mark.skipif(bool(_MAMBA_SKIP), reason=_MAMBA_SKIP or 'mamba-ssm usable')


def _cuda_inputs(dtype, **kw):
    x = make_inputs(bsz=2, dim=64, dstate=16, length=197, device='cuda', **kw)
    # like the models: activations in ``dtype``, A / D / delta_bias parameters in fp32
    return {k: (v if k in ('A', 'D', 'delta_bias') else v.to(dtype)) for k, v in x.items()}


@pytest.mark.gpu
@requires_mamba
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 2**-6)])
@pytest.mark.parametrize('groups', [None, 2])
def test_gpu_forward_cuda_vs_torch(dtype, tol, groups):
    x = _cuda_inputs(dtype, seed=20, groups=groups)
    y_cuda, h_cuda = call(selective_scan_fn, x, backend='cuda', return_last_state=True)
    y_t, h_t = call(selective_scan_fn, x, backend='torch', return_last_state=True)
    assert y_cuda.dtype == dtype == y_t.dtype
    assert rel_err(y_cuda, y_t) < tol
    assert rel_err(h_cuda, h_t) < tol


@pytest.mark.gpu
@requires_mamba
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-4), (torch.bfloat16, 2**-5)])
def test_gpu_backward_cuda_vs_torch(dtype, tol):
    x = _cuda_inputs(dtype, seed=21)
    g = {}
    for backend in ('cuda', 'torch'):
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
        out = call(selective_scan_fn, leaves, backend=backend)
        w = torch.linspace(-1, 1, out.numel(), device='cuda').view_as(out).to(out.dtype)
        (out * w).sum().backward()
        g[backend] = {k: leaves[k].grad for k in NAMES}
    for k in NAMES:
        assert rel_err(g['cuda'][k], g['torch'][k]) < tol, k


@pytest.mark.gpu
@requires_mamba
@pytest.mark.parametrize('reverse', [False, True], ids=['forward', 'reversed'])
def test_gpu_aligned_scan_cuda(reverse):
    x = {k: v.float() for k, v in _cuda_inputs(torch.float32, seed=22).items()}
    length = x['u'].shape[-1]
    mask = _masks(length, 2, 150, seed=23)['random'].cuda()
    pd = F.softplus(x['delta_bias'])
    assert _aligned_case(mask, x, pd, reverse, 'cuda') < 1e-5
    # and the cuda and torch backends agree on the folded inputs
    if reverse:
        mask = mask.flip(-1)
    idx = kept_indices(mask)
    gap = gap_deltas_from_mask(mask, pd)
    kept = [(_gather(x[k], idx) if x[k].dim() == 3 else x[k]) for k in NAMES]
    y_c = aligned_selective_scan(*kept, gap, backend='cuda')
    y_t = aligned_selective_scan(*kept, gap, backend='torch')
    assert rel_err(y_c, y_t) < 1e-5


# ----------------------------------------------------------------------------------------------
# mamba-ssm's even-length path: the sequences padded to the kernel's chunk length
# ----------------------------------------------------------------------------------------------
def _recording_kernel(seen):
    """A stand-in for mamba-ssm's selective_scan_fn (positional arguments as it takes them):
    records the length it is called with and scans with the reference."""
    def fn(u, delta, A, B, C, D, z, delta_bias, softplus, last):
        seen.append(u.shape[-1])
        return selective_scan_ref(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
                                  delta_softplus=softplus, return_last_state=last)
    return fn


@pytest.mark.parametrize('length,padded', [(42, 128), (117, 128), (128, 128), (196, 256),
                                           (600, 1024), (1100, 1100)])
@pytest.mark.parametrize('groups', [None, 2])
def test_mamba_even_length_pads_to_the_chunk_and_cuts_back(length, padded, groups):
    from amvim_mm.ops.mamba_scan import mamba_even_length
    x = make_inputs(bsz=1, dim=4, dstate=16, length=length, groups=groups, seed=5)
    seen = []
    y = mamba_even_length(_recording_kernel(seen), x['u'], x['delta'], x['A'], x['B'], x['C'],
                          x['D'], x['z'], x['delta_bias'], True, False)
    assert seen == [padded] and y.shape == x['u'].shape and y.is_contiguous()
    ref = call(selective_scan_ref, x)
    assert torch.equal(y, ref) if padded == length else rel_err(y, ref) < 1e-6


def test_mamba_even_length_leaves_last_state_autograd_and_small_states_alone():
    from amvim_mm.ops.mamba_scan import mamba_even_length
    x = make_inputs(bsz=1, dim=4, dstate=16, length=50, seed=6)
    args = [x[k] for k in ('u', 'delta', 'A', 'B', 'C', 'D', 'z', 'delta_bias')]
    seen = []
    y, h = mamba_even_length(_recording_kernel(seen), *args, True, True)   # last state asked
    u = x['u'].clone().requires_grad_(True)
    mamba_even_length(_recording_kernel(seen), u, *args[1:], True, False)
    with torch.no_grad():
        mamba_even_length(_recording_kernel(seen), u, *args[1:], True, False)
    one = make_inputs(bsz=1, dim=4, dstate=1, length=50, seed=6)   # VMamba's single state
    mamba_even_length(_recording_kernel(seen), *[one[k] for k in (
        'u', 'delta', 'A', 'B', 'C', 'D', 'z', 'delta_bias')], True, False)
    assert seen == [50, 50, 128, 50]


@pytest.mark.gpu
@requires_mamba
@pytest.mark.parametrize('length', [42, 117, 196])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_gpu_mamba_even_length_is_bit_identical(length, dtype):
    """The padded call (selective_scan_fn, backend cuda) gives the unpadded kernel's outputs
    bit for bit: the same launch configuration, the same arithmetic before L."""
    fn = backends.mamba_selective_scan()[0]
    x = {k: (v if k in ('A', 'D', 'delta_bias') else v.to(dtype)) for k, v in make_inputs(
        bsz=2, dim=64, dstate=16, length=length, groups=4, device='cuda', seed=7).items()}
    with torch.no_grad():
        padded = call(selective_scan_fn, x, backend='cuda')
        direct = fn(x['u'], x['delta'], x['A'], x['B'], x['C'], x['D'], x['z'],
                    x['delta_bias'], True, False)
    assert torch.equal(padded, direct)
