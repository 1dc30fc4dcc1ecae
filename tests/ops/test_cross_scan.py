"""VMamba's cross-scan / cross-merge (amvim_mm.ops.cross_scan): the PyTorch reference against
the official definition (flip / transpose), adjointness, and the Triton kernels against the
reference (in Triton's interpreter on CPU, in a subprocess; compiled on the GPU)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from amvim_mm.ops.cross_scan import (DirectionIndex, cross_merge, cross_merge_ref, cross_scan,
                                     cross_scan_ref)
from amvim_mm.testing.triton_interpreter import PREAMBLE as FAST_INTERPRETER

try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def official_scan(x, H, W):
    """The official CrossScan on a channel-first map: row-major, column-major (transpose then
    flatten), and both flipped."""
    B, L, E = x.shape
    m = x.transpose(1, 2).reshape(B, E, H, W)
    row = m.flatten(2)
    col = m.transpose(2, 3).flatten(2)
    return torch.stack([row, col, row.flip(-1), col.flip(-1)], 1)


def official_merge(ys, H, W):
    """y = y0 + flip(y2) + T(y1 + flip(y3)), back to channel-last."""
    B, _, E, L = ys.shape
    rc = ys[:, 0] + ys[:, 2].flip(-1)
    cc = ys[:, 1] + ys[:, 3].flip(-1)
    cc = cc.reshape(B, E, W, H).transpose(2, 3).reshape(B, E, L)
    return (rc + cc).transpose(1, 2)


@pytest.mark.parametrize('H,W', [(5, 7), (1, 6), (4, 4), (14, 14)])
def test_reference_equals_the_official_definition(H, W):
    x = torch.randn(2, H * W, 3, dtype=torch.float64)
    xs = cross_scan(x, H, W)
    assert torch.equal(xs, official_scan(x, H, W))
    ys = torch.randn(2, 4, 3, H * W, dtype=torch.float64)
    torch.testing.assert_close(cross_merge(ys, H, W), official_merge(ys, H, W), rtol=0,
                               atol=1e-12)


def test_merge_is_the_adjoint_of_scan_and_gradients_flow():
    H, W = 3, 5
    x = torch.randn(2, H * W, 4, dtype=torch.float64, requires_grad=True)
    ys = torch.randn(2, 4, 4, H * W, dtype=torch.float64)
    lhs = (cross_scan_ref(x, H, W) * ys).sum()
    rhs = (x * cross_merge_ref(ys, H, W)).sum()
    assert abs(float(lhs - rhs)) < 1e-10
    lhs.backward()
    torch.testing.assert_close(x.grad, cross_merge_ref(ys, H, W), rtol=0, atol=1e-12)


def test_a_direction_index_is_the_general_case():
    """Given as an index (a reduced sequence's route), the official directions of a full
    grid give the same; per-sample permutations scatter and gather per sample."""
    from amvim_mm.ops.cross_scan import direction_indices
    H, W = 4, 6
    x = torch.randn(3, H * W, 5, dtype=torch.float64)
    full = DirectionIndex.from_perm(direction_indices(H, W, 'cpu')[:, None])
    assert torch.equal(cross_scan(x, H, W, full), cross_scan(x, H, W))
    ys = torch.randn(3, 4, 5, H * W, dtype=torch.float64)
    torch.testing.assert_close(cross_merge(ys, H, W, full), cross_merge(ys, H, W), rtol=0,
                               atol=1e-12)
    perm = torch.stack([torch.stack([torch.randperm(9) for _ in range(3)]) for _ in range(4)])
    idx = DirectionIndex.from_perm(perm)                    # (4, 3, 9): 9 present tokens
    x = torch.randn(3, 9, 5, dtype=torch.float64)
    xs = cross_scan(x, H, W, idx)
    for k in range(4):
        for b in range(3):
            assert torch.equal(xs[b, k], x[b, perm[k, b]].t())
    ys = torch.randn(3, 4, 5, 9, dtype=torch.float64)
    want = sum(ys[:, k].gather(2, idx.inv[k].long()[:, None].expand(3, 5, 9))
               for k in range(4)).transpose(1, 2)
    torch.testing.assert_close(cross_merge(ys, H, W, idx), want, rtol=0, atol=1e-12)


def test_bad_shapes_are_named():
    from amvim_mm.errors import ConfigError
    with pytest.raises(ConfigError, match='do not fill a 3 x 4 grid'):
        cross_scan(torch.randn(1, 11, 2), 3, 4)
    with pytest.raises(ConfigError, match=r'takes \(B, 4, E, L\)'):
        cross_merge(torch.randn(1, 3, 2, 12), 3, 4)


INTERPRETER_SCRIPT = textwrap.dedent('''
    import json, torch
    from amvim_mm.ops.cross_scan import (cross_merge, cross_merge_ref, cross_scan,
                                         cross_scan_ref)
    from amvim_mm.ops.cross_scan import DirectionIndex
    res = []
    for (B, H, W, E, dtype, n) in [(2, 5, 7, 3, torch.float32, None),
                                   (1, 8, 8, 40, torch.float32, None),
                                   (3, 3, 11, 33, torch.bfloat16, None),
                                   (1, 1, 70, 5, torch.float32, None),
                                   (3, 5, 7, 6, torch.float32, 20),     # per-sample routes
                                   (2, 4, 4, 70, torch.bfloat16, -9)]:  # one shared route
        L = H * W if n is None else abs(n)
        idx = None
        if n is not None:
            rows = B if n > 0 else 1
            idx = DirectionIndex.from_perm(torch.stack([torch.stack(
                [torch.randperm(L) for _ in range(rows)]) for _ in range(4)]))
        x = torch.randn(B, L, E).to(dtype).requires_grad_(True)
        xs = cross_scan(x, H, W, idx, kernels=True)
        ys = torch.randn(B, 4, E, L).to(dtype).requires_grad_(True)
        y = cross_merge(ys, H, W, idx, kernels=True)
        g = torch.randn_like(xs)
        xs.backward(g)
        h = torch.randn_like(y)
        y.backward(h)
        def rel(a, b):   # bf16: the fp32 sums may round to neighbouring bf16 values
            return float((a.float() - b.float()).abs().max() / b.float().abs().max())
        res.append(dict(
            scan=torch.equal(xs, cross_scan_ref(x.detach(), H, W, idx)),
            merge=rel(y, cross_merge_ref(ys.detach(), H, W, idx)),
            scan_grad=rel(x.grad, cross_merge_ref(g, H, W, idx)),
            merge_grad=torch.equal(ys.grad, cross_scan_ref(h, H, W, idx)),
            dtype=str(y.dtype)))
    print(json.dumps(res))
''')


@pytest.mark.skipif(not HAS_TRITON, reason='triton is not installed')
def test_kernels_equal_the_reference_in_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    p = subprocess.run([sys.executable, '-c', FAST_INTERPRETER + INTERPRETER_SCRIPT], env=env,
                       text=True,
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in json.loads(p.stdout.strip().splitlines()[-1]):
        assert r['scan'] and r['merge_grad'], r
        tol = 2 ** -7 if r['dtype'] == 'torch.bfloat16' else 1e-6   # relative
        assert r['merge'] <= tol and r['scan_grad'] <= tol, r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')
def test_kernels_equal_the_reference_on_the_gpu():
    for H, W, E in [(56, 56, 96), (7, 9, 768), (1, 33, 5)]:
        x = torch.randn(3, H * W, E, device='cuda', dtype=torch.bfloat16)
        assert torch.equal(cross_scan(x, H, W), cross_scan_ref(x, H, W))
        ys = torch.randn(3, 4, E, H * W, device='cuda')
        torch.testing.assert_close(cross_merge(ys, H, W), cross_merge_ref(ys, H, W),
                                   rtol=1e-6, atol=1e-6)
        L = H * W // 2 + 1
        idx = DirectionIndex.from_perm(torch.stack([torch.stack(
            [torch.randperm(L) for _ in range(3)]) for _ in range(4)]).cuda())
        x = torch.randn(3, L, E, device='cuda')
        assert torch.equal(cross_scan(x, H, W, idx), cross_scan_ref(x, H, W, idx))
        ys = torch.randn(3, 4, E, L, device='cuda')
        torch.testing.assert_close(cross_merge(ys, H, W, idx), cross_merge_ref(ys, H, W, idx),
                                   rtol=1e-6, atol=1e-6)
