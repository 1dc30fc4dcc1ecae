"""PlainMamba's ToP-aligned scan inputs (amvim_mm.ops.plain_aligned): the Triton kernel's folded
``d'``, ``u'`` against the PyTorch reference (``aligned_inputs_torch`` folded as
``aligned_selective_scan`` folds it) for both gap modes and several kept-step patterns, and the
whole reduced PlainMamba forward on the kernel path against the PyTorch path (in Triton's
interpreter on CPU, in a subprocess; compiled on the GPU)."""
import os
import textwrap

import pytest
import torch
import torch.nn.functional as F

from amvim_mm.models.plain_mamba.scan import snake_cell_tables
from amvim_mm.ops.plain_aligned import (aligned_inputs, aligned_inputs_torch, override_kernels,
                                        step_lookup, use_kernels)
from tests.ops.triton_support import needs_triton, run_in_interpreter


def directions(pos, H, W):
    """(B, K, L) full-grid steps of each direction's kept steps, in its order."""
    tab, _ = snake_cell_tables(H, W, pos.device)
    return tab[:, pos].sort(-1).values.permute(1, 0, 2).contiguous()


def patterns(H, W, L, g):
    """Kept raster cells (B = 2, different per sample): random; one sample keeping only an
    inner band of cells (gaps at the start and end of every direction); every cell."""
    M = H * W

    def pick(n, lo=0):
        return (lo + torch.randperm(n, generator=g)[:L]).sort().values
    yield torch.stack([pick(M), pick(M)])
    if L <= M - 9:
        yield torch.stack([pick(M - 9, 4), pick(M)])
    if L == M:
        yield torch.arange(M).expand(2, M).contiguous()


def fold(u, delta, bias, gap):
    """What aligned_selective_scan feeds its backend: (d', u')."""
    d = F.softplus(delta + bias[:, None])
    d2 = d + gap
    return d2, u * (d / d2.clamp_min(torch.finfo(torch.float32).tiny))


def compare(H, W, L, E, g, dev, udtype=torch.float32, block_t=None):
    """The kernel's (d', u') against the folded PyTorch reference on every pattern and both
    gap modes: one dict per case with the max errors relative to the reference's max."""
    out = []
    for pos in patterns(H, W, L, g):
        pos = pos.to(dev)
        steps = directions(pos, H, W)
        B, K = pos.shape[0], 4
        dt = (torch.randn(B, L, E, generator=g) * 2 - 1).to(dev)
        b1 = torch.empty(E).uniform_(-6, 0.5, generator=g).to(dev)
        u = torch.randn(B, K, E, L, generator=g).to(udtype).to(dev)
        idx, here = step_lookup(pos, steps)
        for align in ('bias', 'token'):
            bias = b1.repeat(K)
            delta, gap = aligned_inputs_torch(dt, bias, steps, pos, idx, here, align)
            want = fold(u.reshape(B, K * E, L).float(), delta, bias, gap)
            got = aligned_inputs(u, dt, b1, steps, pos, H * W, align, block_t=block_t)
            rel = [float((a - b).abs().max() / b.abs().max())
                   for a, b in zip(got, want, strict=True)]
            out.append(dict(case=[H, W, L, E, str(udtype), block_t, align], d=rel[0], u=rel[1]))
    return out


KERNEL_SCRIPT = textwrap.dedent('''
    import json, torch
    from tests.ops.test_plain_aligned import compare
    g = torch.Generator().manual_seed(0)
    res = []
    for H, W, L, E, udtype, block_t in [(6, 5, 17, 7, torch.float32, None),
                                        (6, 5, 30, 7, torch.float32, None),    # nothing pruned
                                        (6, 5, 1, 40, torch.float32, None),    # one survivor
                                        (6, 5, 12, 40, torch.bfloat16, 8),     # gaps cross blocks
                                        (9, 8, 25, 33, torch.float32, None)]:  # two blocks
        res += compare(H, W, L, E, g, 'cpu', udtype, block_t)
    print('RESULT' + json.dumps(res))
''')

MODEL_SCRIPT = textwrap.dedent('''
    import json, torch
    import amvim_mm
    from amvim_mm.ops.plain_aligned import override_kernels
    from amvim_mm.registry import MODELS
    out = []
    for gap_delta in ('bias', 'token'):
        torch.manual_seed(0)
        red = dict(type='ToP', keep_rate=0.6, locations=(0, 2), gap_delta=gap_delta)
        m = MODELS.build(dict(type='PlainMamba', arch='test', img_size=(96, 80),
                              out_indices=(3, ), token_reduction=red)).eval()
        with torch.no_grad():              # spread the step sizes the gaps fold
            for layer in m.layers:
                layer.mamba.dt_proj.bias.uniform_(-4, 0.5)
        x = torch.randn(2, 3, 96, 80)
        res = {}
        for on in (True, False):
            with override_kernels(on), torch.no_grad():
                res[on] = (m(x)[0], m.last_context.source.clone())
        (a, sa), (b, sb) = res[True], res[False]
        out.append(dict(gap_delta=gap_delta, err=float((a - b).abs().max() / b.abs().max()),
                        same=torch.equal(sa, sb), shape=list(a.shape)))
    print('RESULT' + json.dumps(out))
''')


def test_the_pytorch_path_stays_the_cpu_path():
    """Without the interpreter CPU tensors take the PyTorch ops; fp64 and inputs recording an
    autograd graph never take the kernel, even when forced."""
    u, dt = torch.zeros(1, 4, 2, 3), torch.zeros(1, 3, 2)
    if not os.environ.get('TRITON_INTERPRET'):
        assert not use_kernels(u, dt)
    with override_kernels(True):
        assert use_kernels(u, dt)
        assert not use_kernels(u.double(), dt.double())
        assert not use_kernels(u.requires_grad_(), dt)
    with override_kernels(False):
        assert not use_kernels(u.detach(), dt)


@needs_triton
def test_kernel_inputs_equal_the_pytorch_reference_in_the_interpreter():
    """d' and u' of the kernel equal the PyTorch reference to 1e-6 (fp32) in both gap modes:
    per-sample different pruning, gaps at the start and end of the directions, nothing
    pruned, one survivor, bf16 u, gaps crossing the walk's blocks, a channel tail."""
    res = run_in_interpreter(KERNEL_SCRIPT)
    assert len(res) == 2 * 2 * 5
    for r in res:
        assert r['d'] <= 1e-6 and r['u'] <= 1e-6, r


@needs_triton
def test_reduced_plainmamba_forward_equals_the_pytorch_path_in_the_interpreter():
    """The whole backbone with ToP aligned (pruning after layers 0 and 2 of four), kernel path
    against PyTorch path: same survivors, features equal to float rounding."""
    for r in run_in_interpreter(MODEL_SCRIPT):
        assert r['same'] and r['err'] <= 1e-6 and r['shape'] == [2, 32, 6, 5], r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')
def test_kernel_inputs_equal_the_pytorch_reference_on_the_gpu():
    """The compiled kernel at PlainMamba-L3's widths (E 896, 117 and 41 of 196 cells kept) and
    on a large grid (several blocks of the walk)."""
    g = torch.Generator().manual_seed(0)
    for H, W, L, E in [(14, 14, 117, 896), (14, 14, 41, 200), (32, 40, 700, 64)]:
        for r in compare(H, W, L, E, g, 'cuda'):
            assert r['d'] <= 1e-6 and r['u'] <= 1e-6, r
