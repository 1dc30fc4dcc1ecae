"""The fused mLSTM kernel (amvim_mm.ops.mlstm.mlstm_triton) against the parallel form
(``mlstm_parallel``, the official ``parallel_stabilized_simple``) in Triton's interpreter on CPU
(in a subprocess) and compiled on the GPU, its errors, and the dispatcher's route to it."""
import os
import textwrap

import pytest
import torch

from amvim_mm.errors import BackendUnavailableError, ConfigError
from amvim_mm.ops import mlstm as mlstm_mod
from amvim_mm.ops.mlstm import mlstm, mlstm_parallel, mlstm_triton
from tests.ops.triton_support import HAS_TRITON, needs_triton, run_in_interpreter

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')


def make(B, NH, S, DH, DHV=None, i_scale=1.0, i_shift=0.0, f_scale=1.0, f_shift=3.0, seed=0,
         dtype=torch.float32, device='cpu', masked=None, view=False):
    """q, k, v (B, NH, S, DH / DHV) and fp32 gates (B, NH, S, 1). ``masked``: token positions
    given the backbone's gates of a skipped token (input -1e4, forget 1e4); ``view``: q, k, v
    as the strided head views of one (B, S, 3, NH, DH) tensor and bf16 transposed gates, as
    ViL's cell passes them."""
    g = torch.Generator().manual_seed(seed)
    if view:
        qkv = torch.randn(B, S, 3, NH, DH, generator=g).to(dtype).to(device)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        gates = (torch.randn(B, S, 2 * NH, generator=g) * 3).to(device).bfloat16()
        ig, fg = gates.transpose(1, 2).unsqueeze(-1).split(NH, dim=1)   # (B, NH, S, 1) views
        return q, k, v, ig, fg + f_shift
    q, k = (torch.randn(B, NH, S, DH, generator=g) for _ in range(2))
    v = torch.randn(B, NH, S, DHV or DH, generator=g)
    ig = torch.randn(B, NH, S, 1, generator=g) * i_scale + i_shift
    fg = torch.randn(B, NH, S, 1, generator=g) * f_scale + f_shift
    if masked is not None:
        ig[:, :, masked], fg[:, :, masked] = -1e4, 1e4
    q, k, v = (t.to(dtype).to(device) for t in (q, k, v))
    return q, k, v, ig.to(device), fg.to(device)


def compare(x, block=None, tf32=False):
    """The kernel against ``mlstm_parallel`` on the same (16-bit: upcast) inputs: max error
    relative to the reference's max, whether all finite, dtype and shape as expected."""
    out = mlstm_triton(*x, block=block)
    ref = mlstm_parallel(*[t.float() if i < 3 else t for i, t in enumerate(x)])
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    ok = out.dtype == x[0].dtype and out.shape == ref.shape and bool(torch.isfinite(out).all())
    return dict(err=err, ok=ok)


# (name, make(...) arguments, block, tolerance relative to the reference's max)
CASES = [
    ('S 37, DH 96 (padded to 128), 3 row blocks', dict(B=2, NH=2, S=37, DH=96), 16, 1e-5),
    ('S 48, DH 64, blocks exactly full', dict(B=1, NH=3, S=48, DH=64, seed=1), 16, 1e-5),
    ('S 1', dict(B=2, NH=2, S=1, DH=64, seed=2), 16, 1e-5),
    ('S 70, DH 96, fp32 default block (32)', dict(B=1, NH=1, S=70, DH=96, seed=3), None, 1e-5),
    ('S 70, DH 96, the block of 64', dict(B=1, NH=1, S=70, DH=96, seed=3), 64, 1e-5),
    ('DHV 5 != DH 8', dict(B=1, NH=2, S=33, DH=8, DHV=5, seed=4), 16, 1e-5),
    ('input gates to ~30, forget pre-activations ~ -20',
     dict(B=1, NH=2, S=40, DH=64, i_scale=12.0, f_scale=10.0, f_shift=-20.0, seed=5), 16, 1e-5),
    ('input gates near -60 (m ~ -60, huge normaliser)',
     dict(B=1, NH=2, S=40, DH=32, i_shift=-60.0, seed=6), 16, 1e-5),
    ('forget gates near 0 (long memory)', dict(B=1, NH=2, S=40, DH=32, f_shift=-1.0, f_scale=
                                               0.2, i_scale=3.0, seed=7), 16, 1e-5),
    ('skipped tokens (first, middle, last)',
     dict(B=2, NH=1, S=36, DH=32, masked=[0, 1, 2, 17, 18, 35], seed=8), 16, 1e-5),
    ('strided head views of one qkv tensor, bf16 transposed gates',
     dict(B=2, NH=2, S=35, DH=32, view=True, seed=9), 16, 1e-5),
    ('fp16 inputs', dict(B=1, NH=2, S=40, DH=96, dtype=torch.float16, seed=10), 16, 2e-3),
]

SCRIPT = textwrap.dedent('''
    import json
    from tests.ops.test_mlstm_triton import CASES, compare, make
    print('RESULT' + json.dumps([compare(make(**kw), block) for _, kw, block, _ in CASES]))
''')


@needs_triton
def test_kernel_equals_the_parallel_form_in_the_interpreter():
    """fp32 to 1e-5 of the reference's max (the log weights are formed as the parallel form
    forms them; the row maximum from the prefix max differs by rounding only, which scales
    numerator and row sum alike), fp16 to its rounding; any S, padded head dims, extreme and
    skipped-token gates, strided inputs."""
    res = run_in_interpreter(SCRIPT)
    assert len(res) == len(CASES)
    for (name, _, _, tol), r in zip(CASES, res, strict=True):
        assert r['ok'] and r['err'] <= tol, (name, r)


def test_errors_are_named():
    x = make(1, 1, 5, 16)
    with pytest.raises(ConfigError, match='q must be fp16, bf16 or fp32'):
        mlstm_triton(*[t.double() for t in x])
    with pytest.raises(ConfigError, match='has no backward'):
        mlstm_triton(x[0].requires_grad_(), *x[1:])
    with pytest.raises(ConfigError, match='power of two >= 16'):
        mlstm_triton(x[0].detach(), *x[1:], block=24)
    with pytest.raises(ConfigError, match='disagree'):
        mlstm_triton(x[0].detach(), x[1][..., :8], *x[2:])
    if HAS_TRITON and not os.environ.get('TRITON_INTERPRET') and not x[0].is_cuda:
        with pytest.raises(BackendUnavailableError, match="Triton.s interpreter only") as e:
            mlstm_triton(x[0].detach(), *x[1:])
        assert '\n' not in str(e.value)


def test_cpu_keeps_the_pytorch_route():
    """CPU tensors never take the Triton kernel; with the compiled CPU cell switched off the
    CPU rule (parallel up to PARALLEL_MAX_LEN steps) is unchanged (the cell itself:
    tests/ops/test_cpu_ops.py)."""
    from amvim_mm import runtime
    x = make(1, 2, 40, 8)
    assert mlstm_mod.kernel_misfit('cpu', torch.float32, 8, False, False) == 'not CUDA'
    with torch.no_grad(), runtime.override(cpu_kernels=False):
        assert torch.equal(mlstm(*x), mlstm_parallel(*x))
    assert mlstm_mod.CUDA_PARALLEL_MAX_LEN >= mlstm_mod.PARALLEL_MAX_LEN


@pytest.mark.gpu
@GPU
def test_kernel_at_vil_t_sizes_on_the_gpu():
    """ViL-T at 224 (batch 128, 4 heads, 196 steps, DH 96): bf16 against the fp32 reference on
    the same inputs (bf16 output rounding), fp32 (IEEE products) against fp64 as close as the
    fp32 PyTorch form (or 1e-5); odd sizes, the ViL
    layout's strided views, skipped tokens and the default block."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            r = compare(make(128, 4, 196, 96, dtype=torch.bfloat16, f_shift=2.0, i_scale=2.0,
                             device='cuda'))
            assert r['ok'] and r['err'] <= 1e-2, r
            for kw in (dict(B=16, NH=4, S=196, DH=96), dict(B=3, NH=2, S=197, DH=64, DHV=40),
                       dict(B=4, NH=4, S=196, DH=96, view=True),
                       dict(B=2, NH=4, S=130, DH=96, masked=[0, 5, 64, 129]),
                       dict(B=2, NH=2, S=300, DH=32, i_scale=12.0, f_scale=10.0,
                            f_shift=-20.0)):
                x = make(**kw, device='cuda')
                r = compare(x)
                # fp32 against fp64: the kernel within 1e-5 or 4x the fp32 reference's own
                # error (both sum the same terms in fp32, in other orders)
                out, ref32 = mlstm_triton(*x).double(), mlstm_parallel(*x).double()
                ref64 = mlstm_parallel(*[t.double() for t in x])
                scale = ref64.abs().max()
                e_kernel = float((out - ref64).abs().max() / scale)
                e_ref = float((ref32 - ref64).abs().max() / scale)
                assert r['ok'] and e_kernel <= max(1e-5, 4 * e_ref), (kw, e_kernel, e_ref)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.gpu
@GPU
def test_dispatcher_and_vil_take_the_kernel_on_the_gpu(monkeypatch):
    """Without an autograd graph :func:`mlstm` (and so ViL's cell) runs the kernel; inputs that
    need gradients take the parallel form (S 196 <= CUDA_PARALLEL_MAX_LEN)."""
    from amvim_mm.registry import MODELS
    x = make(2, 4, 196, 96, dtype=torch.bfloat16, device='cuda')
    with torch.no_grad():
        assert torch.equal(mlstm(*x), mlstm_triton(*x))
    xg = [t.clone().requires_grad_() for t in x]
    assert torch.equal(mlstm(*xg), mlstm_parallel(*xg))
    calls = []

    def spy(*a, **kw):
        calls.append(a[0].shape)
        return mlstm_triton(*a, **kw)
    monkeypatch.setattr(mlstm_mod, 'mlstm_triton', spy)
    m = MODELS.build(dict(type='ViL', arch='tiny', img_size=(64, 96), out_type='featmap',
                          out_indices=(11, ))).cuda().eval()
    with torch.no_grad():
        out = m(torch.randn(2, 3, 64, 96, device='cuda'))[0]
    assert torch.isfinite(out).all() and len(calls) >= 12
    assert all(s[0] == 2 and s[2] == 24 for s in calls), calls[:3]      # 4 x 6 patches
