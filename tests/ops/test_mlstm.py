"""The mLSTM cell op: parallel and chunkwise forms against each other and against a step-by-step
recurrent reference written here, the dispatcher, dtypes, extreme gates, bad shapes."""
import math

import pytest
import torch
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from amvim_mm.ops import mlstm as mlstm_mod
from amvim_mm.ops.mlstm import mlstm, mlstm_chunkwise, mlstm_parallel


def _inputs(S, B=2, NH=3, DH=8, dtype=torch.float64, i_scale=1.0, f_scale=1.0, f_shift=3.0,
            seed=0, DHV=None):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, NH, S, DH, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, NH, S, DHV or DH, generator=g, dtype=dtype)
    ig = torch.randn(B, NH, S, 1, generator=g, dtype=dtype) * i_scale
    fg = torch.randn(B, NH, S, 1, generator=g, dtype=dtype) * f_scale + f_shift
    return q, k, v, ig, fg


def _recurrent(q, k, v, ig, fg, eps=1e-6):
    """Step by step, fp64: m_t = max(log f_t + m_{t-1}, i_t) (the largest log weight of any step
    so far), C_t = exp(log f_t + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T / sqrt(DH),
    n_t likewise with k_t, h_t = q_t C_t / (max(|q_t . n_t|, exp(-m_t)) + eps). Unrolled, C_t is
    sum_{j<=t} exp(F_t - F_j + i_j - m_t) k_j v_j^T: the parallel form's row t."""
    q, k, v, ig, fg = (t.double() for t in (q, k, v, ig, fg))
    B, NH, S, DH = q.shape
    logf = F.logsigmoid(fg[..., 0])
    c = torch.zeros(B, NH, DH, v.shape[-1], dtype=torch.float64)
    n = torch.zeros(B, NH, DH, dtype=torch.float64)
    m = torch.full((B, NH), -math.inf, dtype=torch.float64)
    out = []
    for t in range(S):
        m_new = torch.maximum(logf[:, :, t] + m, ig[:, :, t, 0])
        decay = torch.exp(logf[:, :, t] + m - m_new)
        gain = torch.exp(ig[:, :, t, 0] - m_new)
        kt = k[:, :, t] / math.sqrt(DH)
        c = decay[..., None, None] * c + gain[..., None, None] * kt[..., :, None] * v[:, :, t, None]
        n = decay[..., None] * n + gain[..., None] * kt
        m = m_new
        num = torch.einsum('bhd,bhde->bhe', q[:, :, t], c)
        den = torch.maximum((q[:, :, t] * n).sum(-1).abs(), torch.exp(-m)) + eps
        out.append(num / den[..., None])
    return torch.stack(out, dim=2)


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize('S,chunk', [(100, 32), (20, 64), (37, 1), (64, 64), (65, 16),
                                     (1, 8)])
def test_chunkwise_equals_parallel_fp64(S, chunk):
    x = _inputs(S)
    ref = mlstm_parallel(*x)
    out = mlstm_chunkwise(*x, chunk=chunk)
    assert out.shape == ref.shape == (2, 3, S, 8) and out.dtype == torch.float64
    assert _rel(out, ref) < 1e-10


@pytest.mark.parametrize('S,chunk', [(100, 32), (20, 64), (50, 1)])
def test_chunkwise_equals_parallel_fp32(S, chunk):
    x = _inputs(S, dtype=torch.float32, seed=1)
    out, ref = mlstm_chunkwise(*x, chunk=chunk), mlstm_parallel(*x)
    assert out.dtype == ref.dtype == torch.float32
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize('S,chunk', [(45, 8), (23, 1), (30, 64)])
def test_recurrent_reference_agrees(S, chunk):
    x = _inputs(S, i_scale=3.0, f_scale=3.0, f_shift=1.0, seed=2, DHV=5)
    ref = _recurrent(*x)
    assert _rel(mlstm_parallel(*x), ref) < 1e-10
    assert _rel(mlstm_chunkwise(*x, chunk=chunk), ref) < 1e-10


@pytest.mark.parametrize('i_scale,f_shift', [(30.0, -20.0), (30.0, 3.0), (10.0, -60.0)])
def test_large_gates_finite_and_equal(i_scale, f_shift):
    """Input gates up to ~30 (exp(30) unstabilised), strongly negative forget pre-activations."""
    x = _inputs(70, i_scale=i_scale / 2.5, f_scale=10.0, f_shift=f_shift, seed=3)
    assert x[3].abs().max() > 0.8 * i_scale
    ref = _recurrent(*x)
    for out in (mlstm_parallel(*x), mlstm_chunkwise(*x, chunk=16), mlstm_chunkwise(*x, chunk=1)):
        assert torch.isfinite(out).all() and _rel(out, ref) < 1e-10
    x32 = [t.float() for t in x]
    for out in (mlstm_parallel(*x32), mlstm_chunkwise(*x32, chunk=16)):
        assert torch.isfinite(out).all() and _rel(out, ref) < 1e-3


def test_very_negative_input_gates_stay_finite():
    """m_t near -60: the normaliser exp(-m_t) is huge, h tiny but finite (fp32 and fp64)."""
    x = list(_inputs(40, seed=4))
    x[3] = x[3] - 60.0
    ref = _recurrent(*x)
    for dt in (torch.float64, torch.float32):
        xd = [t.to(dt) for t in x]
        for out in (mlstm_parallel(*xd), mlstm_chunkwise(*xd, chunk=8)):
            assert torch.isfinite(out).all()
            assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-30


def test_bf16_in_bf16_out_fp32_accumulation():
    x64 = _inputs(96, DH=16, seed=5)
    xb = [t.bfloat16() for t in x64]
    ref = mlstm_parallel(*[t.double() for t in xb])       # the bf16 inputs, exactly
    for out in (mlstm_parallel(*xb), mlstm_chunkwise(*xb, chunk=32), mlstm(*xb)):
        assert out.dtype == torch.bfloat16
        assert _rel(out, ref) < 1e-2                        # bf16 rounding of the output only


def test_dispatcher(monkeypatch):
    x = _inputs(40, seed=6)
    assert torch.equal(mlstm(*x), mlstm_parallel(*x))
    assert torch.equal(mlstm(*x, chunk=8), mlstm_chunkwise(*x, chunk=8))
    monkeypatch.setattr(mlstm_mod, 'PARALLEL_MAX_LEN', 30)
    monkeypatch.setattr(mlstm_mod, 'DEFAULT_CHUNK', 16)
    assert torch.equal(mlstm(*x), mlstm_chunkwise(*x, chunk=16))
    assert _rel(mlstm(*x), mlstm_parallel(*x)) < 1e-10


def test_gradients_agree():
    x = [t.requires_grad_() for t in _inputs(33, B=1, NH=2, DH=4, seed=7)]
    w = torch.randn(1, 2, 33, 4, dtype=torch.float64)
    grads = []
    for fn in (mlstm_parallel, lambda *a: mlstm_chunkwise(*a, chunk=8)):
        grads.append(torch.autograd.grad((fn(*x) * w).sum(), x))
    for a, b in zip(*grads, strict=True):
        assert _rel(b, a) < 1e-9


def test_eps_is_added_to_the_normaliser():
    x = list(_inputs(12, seed=8))
    ref = _recurrent(*x, eps=0.5)
    assert _rel(mlstm_parallel(*x, eps=0.5), ref) < 1e-12
    assert _rel(mlstm_chunkwise(*x, eps=0.5, chunk=5), ref) < 1e-12
    assert _rel(mlstm_parallel(*x), ref) > 1e-3


@pytest.mark.parametrize('fn', [mlstm_parallel, mlstm_chunkwise, mlstm])
@pytest.mark.parametrize('which,shape,msg', [
    (0, (2, 3, 10), 'q must be a 4-D floating tensor'),
    (1, (2, 3, 10, 4), 'disagree'),
    (2, (2, 3, 11, 8), 'disagree'),
    (3, (2, 3, 10), 'igate_preact must be a 4-D'),
    (4, (2, 3, 10, 8), r'fgate_preact must be \(B, NH, S, 1\)'),
])
def test_bad_shapes(fn, which, shape, msg):
    x = list(_inputs(10))
    x[which] = torch.zeros(shape, dtype=torch.float64)
    with pytest.raises(ConfigError, match=msg) as e:
        fn(*x)
    assert '\n' not in str(e.value)


def test_bad_chunk_and_dtype():
    x = list(_inputs(10))
    for chunk in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match='chunk must be a positive int'):
            mlstm_chunkwise(*x, chunk=chunk)
    x[2] = x[2].long()
    with pytest.raises(ConfigError, match='v must be a 4-D floating tensor'):
        mlstm(*x)


def test_dispatcher_default_rule():
    """Parallel up to PARALLEL_MAX_LEN (two chunks) steps, chunkwise with DEFAULT_CHUNK beyond."""
    assert mlstm_mod.PARALLEL_MAX_LEN == 2 * mlstm_mod.DEFAULT_CHUNK
    n = mlstm_mod.PARALLEL_MAX_LEN
    short, long = _inputs(n, B=1, NH=1, DH=4), _inputs(n + 1, B=1, NH=1, DH=4)
    assert torch.equal(mlstm(*short), mlstm_parallel(*short))
    assert torch.equal(mlstm(*long), mlstm_chunkwise(*long, chunk=mlstm_mod.DEFAULT_CHUNK))


def test_long_sequence_linear_memory():
    """S = 40000: one S x S fp32 matrix alone would be 6.4 GB; the chunkwise form needs a few
    MB. Causality: the first steps equal the parallel form on the prefix."""
    x = _inputs(40000, B=1, NH=1, DH=4, dtype=torch.float32, seed=9)
    out = mlstm(*x)
    assert out.shape == (1, 1, 40000, 4) and torch.isfinite(out).all()
    prefix = mlstm_parallel(*[t[:, :, :300] for t in x])
    assert _rel(out[:, :, :300], prefix) < 1e-5
