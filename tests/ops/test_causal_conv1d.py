"""Depthwise causal conv1d: F.conv1d path vs a naive loop, backend choice, GPU kernel."""
from __future__ import annotations

import logging
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from amvim_mm.ops import backends
from amvim_mm.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_torch


def naive_causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      activation: Optional[str]) -> torch.Tensor:
    """y[b, e, t] = bias[e] + sum_k w[e, k] * x[b, e, t - (K - 1) + k], zeros before t = 0."""
    weight = weight.reshape(weight.shape[0], -1)
    bsz, dim, length = x.shape
    width = weight.shape[1]
    y = torch.zeros(bsz, dim, length, dtype=torch.float64)
    xd, wd = x.double(), weight.double()
    for t in range(length):
        for k in range(width):
            src = t - (width - 1) + k
            if src >= 0:
                y[:, :, t] += wd[:, k] * xd[:, :, src]
    if bias is not None:
        y += bias.double()[:, None]
    if activation in ('silu', 'swish'):
        y = F.silu(y)
    return y


def _inputs(bsz=2, dim=5, length=13, width=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bsz, dim, length, generator=g).to(dtype)
    w = torch.randn(dim, width, generator=g).to(dtype)
    b = torch.randn(dim, generator=g).to(dtype)
    return x, w, b


@pytest.mark.parametrize('width', [1, 2, 3, 4, 7])
@pytest.mark.parametrize('activation', [None, 'silu', 'swish'])
@pytest.mark.parametrize('use_bias', [True, False])
@pytest.mark.parametrize('weight_3d', [False, True], ids=['w(E,K)', 'w(E,1,K)'])
def test_torch_path_equals_naive_loop(width, activation, use_bias, weight_3d):
    x, w, b = _inputs(width=width, seed=width)
    b = b if use_bias else None
    want = naive_causal_conv(x, w, b, activation)
    wt = w.unsqueeze(1) if weight_3d else w
    got = causal_conv1d_fn(x, wt, b, activation=activation, backend='torch')
    assert got.shape == x.shape and got.dtype == x.dtype
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got, causal_conv1d_torch(x, wt, b, activation))


def test_causality():
    """Changing x at position t changes no output before t."""
    x, w, b = _inputs(length=20)
    y0 = causal_conv1d_fn(x, w, b, 'silu', backend='torch')
    x2 = x.clone()
    x2[..., 10:] += 1.0
    y1 = causal_conv1d_fn(x2, w, b, 'silu', backend='torch')
    assert torch.equal(y0[..., :10], y1[..., :10])
    assert not torch.equal(y0[..., 10:], y1[..., 10:])


def test_short_sequence_and_bf16_and_grad():
    x, w, b = _inputs(length=2, width=4)  # L < K - 1
    want = naive_causal_conv(x, w, b, None)
    assert torch.allclose(causal_conv1d_fn(x, w, b).double(), want, rtol=1e-5, atol=1e-6)
    xb = x.bfloat16()
    yb = causal_conv1d_fn(xb, w, b, 'silu', backend='torch')  # fp32 weight with bf16 x
    assert yb.dtype == torch.bfloat16
    assert torch.allclose(yb.double(), naive_causal_conv(xb, w.bfloat16(), b.bfloat16(), 'silu'),
                          rtol=2e-2, atol=2e-2)
    xg, wg, bg = (t.clone().requires_grad_(True) for t in _inputs(length=9))
    causal_conv1d_fn(xg, wg, bg, 'silu').sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (xg, wg, bg))


def test_shape_and_activation_errors():
    x, w, b = _inputs()
    with pytest.raises(ValueError, match=r'weight must have shape \(E=5, K\).*\(4, 4\)'):
        causal_conv1d_fn(x, w[:4])
    with pytest.raises(ValueError, match=r'bias must have shape \(E=5,\); got \(3,\)'):
        causal_conv1d_fn(x, w, b[:3])
    with pytest.raises(ValueError, match=r'x must have shape \(batch, E, L\)'):
        causal_conv1d_fn(x[0], w)
    with pytest.raises(ValueError, match="'relu'"):
        causal_conv1d_fn(x, w, activation='relu')


def test_backend_choice(monkeypatch, caplog):
    x, w, b = _inputs()
    monkeypatch.setattr(backends, '_logged', set())
    monkeypatch.delenv('AMVIM_CONV_BACKEND', raising=False)
    with caplog.at_level(logging.INFO, logger='amvim_mm'):
        causal_conv1d_fn(x, w, b)  # auto on CPU -> torch
        causal_conv1d_fn(x, w, b)
    logged = [r.getMessage() for r in caplog.records if 'causal_conv1d' in r.getMessage()]
    assert len(logged) == 1 and "'torch'" in logged[0]
    monkeypatch.setenv('AMVIM_CONV_BACKEND', 'torch')
    assert torch.equal(causal_conv1d_fn(x, w, b), causal_conv1d_torch(x, w, b))
    monkeypatch.setenv('AMVIM_CONV_BACKEND', 'bogus')
    with pytest.raises(ValueError, match="'bogus'.*AMVIM_CONV_BACKEND"):
        causal_conv1d_fn(x, w, b)
    with pytest.raises(ValueError, match="'reference'.*argument"):
        causal_conv1d_fn(x, w, b, backend='reference')
    monkeypatch.setenv('AMVIM_CONV_BACKEND', 'cuda')
    with pytest.raises(RuntimeError, match='cuda'):
        causal_conv1d_fn(x, w, b)  # no kernel or CPU tensors: a clear error either way
    monkeypatch.setattr(backends, 'causal_conv1d_kernel', lambda: (lambda *a, **k: None, 'ok'))
    with pytest.raises(RuntimeError, match='needs CUDA tensors'):
        causal_conv1d_fn(x, w, b)


def _conv_reason() -> str:
    if not torch.cuda.is_available():
        return 'CUDA is not available'
    fn, reason = backends.causal_conv1d_kernel()
    return '' if fn is not None else f'causal-conv1d is not importable: {reason}'


_CONV_SKIP = _conv_reason()


@pytest.mark.gpu
@pytest.mark.skipif(bool(_CONV_SKIP), reason=_CONV_SKIP or 'causal-conv1d usable')
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize('activation', [None, 'silu'])
def test_gpu_cuda_kernel_vs_torch(dtype, tol, activation):
    x, w, b = (t.cuda() for t in _inputs(bsz=2, dim=64, length=197, seed=3))
    x = x.to(dtype).requires_grad_(True)
    w, b = w.requires_grad_(True), b.requires_grad_(True)
    outs, grads = {}, {}
    for backend in ('cuda', 'torch'):
        y = causal_conv1d_fn(x, w, b, activation, backend=backend)
        assert y.dtype == dtype
        gx, gw, gb = torch.autograd.grad(y.float().square().sum(), (x, w, b))
        outs[backend], grads[backend] = y.float(), (gx.float(), gw, gb)
    # bf16: the kernel accumulates in fp32, F.conv1d in bf16: compare relative to the max
    # (bf16 rounding is 2^-8 relative; a few ulps apart is the expected gap)
    err = (outs['cuda'] - outs['torch']).abs().max() / outs['torch'].abs().max()
    assert err <= (tol if dtype == torch.float32 else 2e-2)
    for g_c, g_t in zip(grads['cuda'], grads['torch'], strict=True):
        scale = g_t.abs().max()
        assert (g_c - g_t).abs().max() <= 10 * tol * scale
