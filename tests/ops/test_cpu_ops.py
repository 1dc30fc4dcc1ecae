"""The compiled CPU kernels (amvim_mm.ops.cpu_ops, csrc/cpu_mixer.cpp) and the fused CPU mixer
(amvim_mm.ops.cpu_mixer) against the ``reference`` scan (a float64 sequential loop), the causal
conv of PyTorch, and the unfused mixer; the automatic choice; the fallback when the library is
missing; the build tool.

The library is built by the set-up script; where it is missing here it is built once for the
session (about 15 s), and only a machine without a C++ compiler skips these tests (named).
"""
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from amvim_mm import runtime
from amvim_mm.errors import BackendUnavailableError
from amvim_mm.models.vim.norm import RMSNorm
from amvim_mm.ops import cpu_ops
from amvim_mm.ops.causal_conv1d import causal_conv1d_torch
from amvim_mm.ops.selective_scan import (aligned_selective_scan, selective_scan_fn,
                                         selective_scan_ref)
from amvim_mm.registry import MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='module', autouse=True)
def built():
    if not os.path.exists(cpu_ops.library_path()):
        if shutil.which(os.environ.get('CXX', 'g++')) is None:
            pytest.skip('no C++ compiler on this machine: the compiled CPU kernels cannot be '
                        'built (the PyTorch scan runs instead)')
        cpu_ops.build()
    ok, reason = cpu_ops.available()
    assert ok, reason


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def _inputs(bsz, E, L, N, seed=0, grouped=False):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    u, delta, z = r(bsz, E, L), r(bsz, E, L) * 0.7, r(bsz, E, L)
    A = -torch.exp(r(E, N) * 0.5 + 0.5)
    B, C = (r(bsz, 1, N, L), r(bsz, 1, N, L)) if grouped else (r(bsz, N, L), r(bsz, N, L))
    return u, delta, A, B, C, r(E), z, r(E) * 0.5


@pytest.mark.parametrize('bsz,E,L,N', [(2, 32, 37, 16), (1, 13, 9, 16), (3, 24, 50, 5),
                                       (1, 8, 1, 1), (2, 40, 197, 16)])
@pytest.mark.parametrize('softplus,gate,skip', [(True, True, True), (False, False, False)])
def test_scan_equals_reference(bsz, E, L, N, softplus, gate, skip):
    """Every combination of the optional terms, a channel tail (E % 8 != 0), the generic and
    the compiled-in state size, L = 1: 1e-6 of the float64 reference (fp32 inputs)."""
    u, delta, A, B, C, D, z, bias = _inputs(bsz, E, L, N)
    D, z = (D if skip else None), (z if gate else None)
    if not softplus:     # step sizes as the caller gives them: positive
        delta, bias = delta.abs() * 0.3, bias.abs()
    ref, h_ref = selective_scan_ref(*(t.double() if t is not None else None for t in
                                      (u, delta, A, B, C, D, z, bias)), delta_softplus=softplus,
                                    return_last_state=True)
    y, h = cpu_ops.selective_scan_cpu(u, delta, A, B, C, D, z, bias, softplus, True)
    assert y.dtype == torch.float32 and y.shape == u.shape and h.shape == (bsz, E, N)
    assert _rel(y, ref) < 1e-6
    assert _rel(h, h_ref) < 1e-6


def test_scan_long_slow_decay_equals_reference():
    """Slowly decaying channels over a long sequence (L = 400, several of the kernel's chunks
    of steps): exp(dt A) near 1 multiplies the state at every step, so a bias of the kernel's
    2^x near 2^0 would compound over L; 1e-6 of the float64 reference."""
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    bsz, E, L, N = 2, 40, 400, 16
    u, delta, z = r(bsz, E, L), r(bsz, E, L) * 0.7 - 2, r(bsz, E, L)
    A = -torch.exp(r(E, N) * 1.5 - 1)
    B, C, D, bias = r(bsz, N, L), r(bsz, N, L), r(E), r(E) * 0.5
    ref = selective_scan_ref(*(t.double() for t in (u, delta, A, B, C, D, z, bias)),
                             delta_softplus=True)
    assert _rel(cpu_ops.selective_scan_cpu(u, delta, A, B, C, D, z, bias, True), ref) < 1e-6


@pytest.mark.parametrize('a', [-200.0, -1e30, float('-inf'), -1e-3, 0.0, 2.0])
def test_scan_decay_under_and_overflow_equal_reference(a):
    """exp(dt A) where it underflows float32, is exactly 1, or grows (A > 0, which Mamba's
    A = -exp(A_log) never has; the kernel's A log2(e), rounded to float32, costs about
    |dt A| 6e-8 of relative error there): two steps of h_t = exp(dt A) h_{t-1} + dt B u with
    dt = B = C = u = 1, against the float64 reference."""
    u = torch.ones(1, 16, 2)
    A = torch.full((16, 1), a)
    B = C = torch.ones(1, 1, 2)
    ref = selective_scan_ref(u.double(), u.double(), A.double(), B.double(), C.double(),
                             delta_softplus=False)
    y = cpu_ops.selective_scan_cpu(u, u, A, B, C, None, None, None, False)
    assert torch.isfinite(y).all()
    assert _rel(y, ref) < 1e-6


def test_scan_bf16_and_grouped_single_group():
    u, delta, A, B, C, D, z, bias = _inputs(2, 16, 20, 16, grouped=True)
    ref = selective_scan_ref(u, delta, A, B, C, D, z, bias, True)
    y = cpu_ops.selective_scan_cpu(u.bfloat16(), delta, A, B, C, D, z, bias, True)
    assert y.dtype == torch.bfloat16
    y32 = cpu_ops.selective_scan_cpu(u, delta, A, B, C, D, z, bias, True)
    assert _rel(y32, ref) < 1e-6


def test_grouped_scan_equals_reference_and_misfit_groups_fall_back():
    """B / C in groups (PlainMamba's directions): groups of whole vectors of channels run on
    the kernel; other groupings take the PyTorch scan automatically (and are refused when the
    kernel is forced)."""
    bsz, G, L, N = 2, 4, 19, 8
    E = G * cpu_ops.vector_width()
    u, delta, A, _, _, D, z, bias = _inputs(bsz, E, L, N, seed=5)
    B, C = torch.randn(bsz, G, N, L), torch.randn(bsz, G, N, L)
    ref = selective_scan_ref(u.double(), delta.double(), A.double(), B.double(), C.double(),
                             D.double(), z.double(), bias.double(), True)
    assert _rel(cpu_ops.selective_scan_cpu(u, delta, A, B, C, D, z, bias, True), ref) < 1e-6
    E2 = G * 3                                       # 3 channels a group: not a vector
    u2, d2, A2, _, _, D2, z2, b2 = _inputs(bsz, E2, L, N, seed=6)
    with torch.no_grad():
        y2 = selective_scan_fn(u2, d2, A2, B, C, D2, z2, b2, True)     # automatic: torch
        with pytest.raises(BackendUnavailableError, match='groups'):
            selective_scan_fn(u2, d2, A2, B, C, D2, z2, b2, True, backend='cpu')
    ref2 = selective_scan_ref(u2.double(), d2, A2, B, C, D2, z2, b2, True)
    assert _rel(y2, ref2) < 1e-6


def test_plainmamba_on_the_kernels_equals_the_pytorch_scan():
    """PlainMamba's four directions as B / C groups, with and without a reduced sequence."""
    torch.manual_seed(0)
    for red in (None, dict(type='ToMe', ratio=0.3)):
        kw = {} if red is None else dict(token_reduction=red)
        m = MODELS.build(dict(type='PlainMamba', arch='test', img_size=64, **kw)).eval()
        x = torch.randn(2, 3, 64, 64)
        with torch.no_grad():
            ours = m(x)[-1]
            with runtime.override(cpu_kernels=False):
                ref = m(x)[-1]
        assert _rel(ours, ref) < 2e-6


def test_auto_backend_takes_the_kernel_only_without_a_graph(caplog):
    u, delta, A, B, C, D, z, bias = _inputs(1, 16, 12, 16)
    ref = selective_scan_ref(u.double(), delta, A, B, C, D, z, bias, True)
    with torch.no_grad():
        y = selective_scan_fn(u, delta, A, B, C, D, z, bias, True)
    assert _rel(y, ref) < 1e-6
    from amvim_mm.ops import backends
    assert backends.resolve_scan_backend(False, None, None) == 'cpu'
    u.requires_grad_(True)
    y = selective_scan_fn(u, delta, A, B, C, D, z, bias, True)     # torch: differentiable
    y.sum().backward()
    assert u.grad is not None
    with pytest.raises(BackendUnavailableError, match='has no backward'):
        selective_scan_fn(u, delta, A, B, C, D, z, bias, True, backend='cpu')
    with torch.no_grad(), pytest.raises(BackendUnavailableError, match='float32'):
        selective_scan_fn(u.double(), delta, A, B, C, D, z, bias, True, backend='cpu')


def test_aligned_scan_on_the_kernel_equals_the_reference_backend():
    """ToP's gap-folded alignment (a reduced sequence with gaps) on the compiled kernel."""
    u, delta, A, B, C, D, z, bias = _inputs(2, 24, 30, 16, seed=3)
    gap = torch.rand(2, 1, 30) * 0.4 * (torch.rand(2, 1, 30) > 0.5)
    ref = aligned_selective_scan(u.double(), delta.double(), A.double(), B.double(),
                                 C.double(), D.double(), z.double(), bias.double(),
                                 gap.double(), backend='reference')
    with torch.no_grad():
        y = aligned_selective_scan(u, delta, A, B, C, D, z, bias, gap, backend='cpu')
    assert _rel(y, ref) < 1e-6


@pytest.mark.parametrize('K', [4, 2])
def test_conv_silu_in_a_path_order_equals_torch(K):
    torch.manual_seed(0)
    bsz, L, E = 2, 23, 20
    x = torch.randn(bsz, L, 2 * E)[..., :E]                 # strided, as xz[..., :E]
    w, b = torch.randn(E, K), torch.randn(E)
    order = torch.stack([torch.randperm(L), torch.arange(L).flip(0)]).int()
    u = cpu_ops.conv_silu(x, w, b, order, L)
    xs = torch.stack([x[i, order[i].long()] for i in range(bsz)])     # (B, L, E) path order
    ref = causal_conv1d_torch(xs.transpose(1, 2).double(), w.double(), b.double(), 'silu')
    assert _rel(u, ref.transpose(1, 2)) < 1e-6
    u1 = cpu_ops.conv_silu(x, w, None, order[:1].contiguous(), L)
    ref1 = causal_conv1d_torch(x[:, order[0].long()].transpose(1, 2), w, None, 'silu')
    assert _rel(u1, ref1.transpose(1, 2)) < 1e-6


MODELS_AND_REDUCERS = [
    (dict(type='Vim', arch='test', img_size=48), None),
    (dict(type='AMVim', arch='test', img_size=64), None),
    (dict(type='Vim', arch='test', img_size=48), dict(type='ToMe', ratio=0.27)),
    (dict(type='AMVim', arch='test', img_size=64), dict(type='ToMe', ratio=0.4)),
    (dict(type='AMVim', arch='test', img_size=64), dict(type='RandomPrune', ratio=0.3)),
    (dict(type='Vim', arch='test', img_size=48), dict(type='ToP', keep_rate=0.7, locations=(1, ))),
    (dict(type='AMVim', arch='test', img_size=64),
     dict(type='ToP', keep_rate=0.6, locations=(0, 2), gap_delta='token')),
    (dict(type='Vim', arch='test', img_size=48), dict(type='EViT', keep_rate=0.7, locations=(1, ))),
]


@pytest.mark.parametrize('cfg,reduction', MODELS_AND_REDUCERS)
def test_fused_cpu_mixer_equals_the_unfused_mixer(cfg, reduction):
    """The whole backbone (every path, AMVim's windowed one, merged / pruned sequences, ToP's
    importance and aligned scan) with the compiled kernels against the PyTorch mixer, batch 2,
    fp32."""
    torch.manual_seed(0)
    kw = dict(out_type='featmap', out_indices=(-1, ))
    if reduction is not None:
        kw['token_reduction'] = reduction
    m = MODELS.build(dict(cfg, **kw)).eval()
    x = torch.randn(2, 3, cfg['img_size'], cfg['img_size'])
    with torch.no_grad():
        calls = [b.mixer.route for b in m.execution_plan(x).blocks]
        ours = m(x)[0]
        with runtime.override(cpu_kernels=False):
            calls += [b.mixer.route for b in m.execution_plan(x).blocks]
            ref = m(x)[0]
    n = len(m.layers)
    assert calls[:n] == ['cpu'] * n           # ToP's importance and aligned blocks included
    assert calls[n:] == ['torch'] * n         # the switch is honoured
    assert _rel(ours, ref) < 2e-6


def _mixer_op_by_op(hidden, in_w, out_w, stacked, perms):
    """The fused CPU mixer as separate kernel and GEMM calls (what ``amvim_cpu::mixer_forward``
    does in one call)."""
    conv_w, conv_b, x_proj, dt_w, dt_b, A, D = stacked
    P, E, N = A.shape
    r = dt_w.shape[-1]
    xz = torch.nn.functional.linear(hidden, in_w)
    x, z = xz[..., :E], xz[..., E:]
    y = hidden.new_empty(hidden.shape[0], hidden.shape[1], E)
    for k in range(P):
        o = perms[k].to(torch.int32).contiguous()
        u = cpu_ops.conv_silu(x, conv_w[k], conv_b[k], o, hidden.shape[1])
        x_dbl = torch.nn.functional.linear(u, x_proj[k])
        cpu_ops.scan_tokens(u, x_dbl[..., :r], A[k], x_dbl[..., r:r + N],
                            x_dbl[..., r + N:r + 2 * N], D[k], z, dt_b[k], o, y, k > 0, 1.0 / P,
                            dt_proj=dt_w[k])
    return torch.nn.functional.linear(y, out_w)


def _mixer_case(arch, L, per_sample, seed):
    """Block 0's mixer of a test-arch model, hidden states (2, L, D) and random path orders
    (P, 2 or 1, L), seeded."""
    torch.manual_seed(seed)
    m = MODELS.build(dict(type=arch, arch='test', img_size=64)).eval()
    mixer = m.layers[0].mixer
    P = mixer.num_paths
    h = torch.randn(2, L, m.embed_dims)
    perms = torch.stack([torch.randperm(L) for _ in range(P * (2 if per_sample else 1))])
    return mixer, h, perms.view(P, 2 if per_sample else 1, L)


@pytest.mark.parametrize('arch,L,per_sample', [('Vim', 37, False), ('AMVim', 65, True)])
def test_mixer_op_equals_its_kernels_one_by_one(arch, L, per_sample):
    """``amvim_cpu::mixer_forward`` is the same GEMMs and kernels as the calls from Python,
    bit for bit (shared and per-sample path orders, AMVim's four paths)."""
    from amvim_mm.ops.cpu_mixer import cpu_mixer_forward
    mixer, h, perms = _mixer_case(arch, L, per_sample, seed=0)
    with torch.no_grad():
        in_w, stacked, _ = mixer.fused_params()
        ours = cpu_mixer_forward(h, in_w, mixer.out_proj.weight, stacked, perms)
        ref = _mixer_op_by_op(h, in_w, mixer.out_proj.weight, stacked, perms)
    assert torch.equal(ours, ref)
    with pytest.raises(Exception, match='perms'):
        cpu_mixer_forward(h, in_w, mixer.out_proj.weight, stacked, perms[:, :, :-1])


def _aligned_mixer_reference(hidden, in_w, out_w, stacked, perms, gaps, gap_delta):
    """The mixer with ToP's alignment in float64 PyTorch, independent of the kernels: per path,
    x and z gathered into the path's order, conv + SiLU, ``x_proj``, ``dt_proj``,
    ``aligned_selective_scan`` (the gaps' step sizes as ``BiMambaMixer.scan_path`` forms them),
    scattered back to token order. Returns ``(output, per-path outputs (B, L, E) each)``."""
    conv_w, conv_b, x_proj, dt_w, dt_b, A, D = (t.double() for t in stacked)
    P, E, N = A.shape
    r = dt_w.shape[-1]
    bsz, L, _ = hidden.shape
    xz = hidden.double() @ in_w.double().t()
    ys = []
    for k in range(P):
        idx = perms[k].long().expand(bsz, L)[..., None].expand(-1, -1, E)
        x, z = xz[..., :E].gather(1, idx), xz[..., E:].gather(1, idx)      # path order
        u = causal_conv1d_torch(x.transpose(1, 2), conv_w[k], conv_b[k], activation='silu')
        x_dbl = u.transpose(1, 2) @ x_proj[k].t()
        dt = (x_dbl[..., :r] @ dt_w[k].t()).transpose(1, 2)                    # (B, E, L)
        Bm, Cm = x_dbl[..., r:r + N].transpose(1, 2), x_dbl[..., r + N:r + 2 * N].transpose(1, 2)
        g = gaps[k].double()[:, None, :]
        step = (torch.nn.functional.softplus(dt_b[k])[None, :, None] if gap_delta == 'bias'
                else torch.nn.functional.softplus(dt + dt_b[k][None, :, None]))
        y = aligned_selective_scan(u, dt, A[k], Bm, Cm, D[k], z.transpose(1, 2),
                                   delta_bias=dt_b[k], gap_delta=g * step, backend='torch')
        ys.append(torch.zeros(bsz, L, E, dtype=torch.float64).scatter_(1, idx, y.transpose(1, 2)))
    return (sum(ys) / P) @ out_w.double().t(), ys


@pytest.mark.parametrize('arch,L,per_sample', [('Vim', 37, False), ('Vim', 40, True),
                                               ('AMVim', 65, True), ('AMVim', 26, False)])
def test_mixer_op_aligned_scan_and_importance_equal_pytorch(arch, L, per_sample):
    """ToP's hidden-state alignment and importance inside ``amvim_cpu::mixer_forward``: random
    gap counts (0, small and large) in both step-size modes, batch 2, shared and per-sample
    path orders, two and four paths, against the float64 PyTorch mixer built on
    ``aligned_selective_scan`` (1e-5); the importance is the sum over paths and channels of
    max(0, each path's gated output) in token order."""
    from amvim_mm.ops.cpu_mixer import cpu_mixer_forward
    mixer, h, perms = _mixer_case(arch, L, per_sample, seed=1)
    P = mixer.num_paths
    gaps = torch.randint(0, 4, (P, 2, L)) * (torch.rand(P, 2, L) < 0.5)
    gaps[:, :, ::7] = 40                                                  # long gaps
    gaps[:, 1, :3] = 0
    with torch.no_grad():
        in_w, stacked, _ = mixer.fused_params()
        stacked = stacked[:3] + (stacked[3] * 20, ) + stacked[4:]   # token-dependent step sizes
        for mode in ('bias', 'token'):
            ref, ys = _aligned_mixer_reference(h, in_w, mixer.out_proj.weight, stacked, perms,
                                               gaps, mode)
            out, imp = cpu_mixer_forward(h, in_w, mixer.out_proj.weight, stacked, perms,
                                         gaps=gaps, gap_delta=mode, importance=True)
            assert out.shape == h.shape and imp.shape == (2, L) and imp.dtype == torch.float32
            assert _rel(out, ref) < 1e-5
            assert _rel(imp, sum(y.clamp_min(0).sum(-1) for y in ys)) < 1e-5
            alone = cpu_mixer_forward(h, in_w, mixer.out_proj.weight, stacked, perms,
                                      gaps=gaps.float(), gap_delta=mode)
            assert torch.equal(alone, out)               # the importance changes no output bit
        bias_out = cpu_mixer_forward(h, in_w, mixer.out_proj.weight, stacked, perms, gaps=gaps)
        plain = cpu_mixer_forward(h, in_w, mixer.out_proj.weight, stacked, perms)
    assert _rel(bias_out, out) > 3e-4 and _rel(plain, out) > 3e-4   # the gaps and modes matter


@pytest.mark.parametrize('arch,per_sample', [('Vim', False), ('AMVim', True)])
def test_mixer_op_without_gaps_is_unchanged(arch, per_sample):
    """No gaps (or all-zero gaps), with or without the importance: the output is the unaligned
    kernels' one by one, bit for bit; the importance equals PyTorch's."""
    from amvim_mm.ops.cpu_mixer import cpu_mixer_forward
    torch.manual_seed(2)
    m = MODELS.build(dict(type=arch, arch='test', img_size=64)).eval()
    mixer = m.layers[0].mixer
    P, L = mixer.num_paths, 30
    h = torch.randn(2, L, m.embed_dims)
    perms = torch.stack([torch.randperm(L) for _ in range(P * (2 if per_sample else 1))])
    perms = perms.view(P, 2 if per_sample else 1, L)
    with torch.no_grad():
        in_w, stacked, _ = mixer.fused_params()
        args = (h, in_w, mixer.out_proj.weight, stacked, perms)
        ref = _mixer_op_by_op(*args)
        out, imp = cpu_mixer_forward(*args, importance=True)
        zero = torch.zeros(P, 1, L)
        assert torch.equal(cpu_mixer_forward(*args), ref)
        assert torch.equal(out, ref)
        assert torch.equal(cpu_mixer_forward(*args, gaps=zero, gap_delta='token'), ref)
        _, ys = _aligned_mixer_reference(*args, zero.expand(P, 2, L), 'bias')
    assert _rel(imp, sum(y.clamp_min(0).sum(-1) for y in ys)) < 1e-5


def test_mixer_op_gap_errors():
    """A wrong gaps shape or step-size mode is a one-line ConfigError naming the expected form."""
    from amvim_mm.errors import ConfigError
    from amvim_mm.ops.cpu_mixer import cpu_mixer_forward
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32)).eval()
    mixer = m.layers[0].mixer
    h = torch.randn(2, 9, m.embed_dims)
    perms = torch.arange(9).expand(2, 1, 9)
    with torch.no_grad():
        in_w, stacked, _ = mixer.fused_params()
        args = (h, in_w, mixer.out_proj.weight, stacked, perms)
        with pytest.raises(ConfigError, match=r'^gaps must be \(P=2, B=2, L=9\); got \(2, 2, 8\)$'):
            cpu_mixer_forward(*args, gaps=torch.zeros(2, 2, 8))
        with pytest.raises(ConfigError, match=r'gaps must be .*got \(2, 9\)'):
            cpu_mixer_forward(*args, gaps=torch.zeros(2, 9))
        with pytest.raises(ConfigError, match="^gap_delta must be 'bias' or 'token'; got 'mean'$"):
            cpu_mixer_forward(*args, gaps=torch.zeros(2, 2, 9), gap_delta='mean')


def test_fused_params_follow_every_parameter_change():
    """The packed weights of the fused CPU mixer are rebuilt after an in-place write, a
    state-dict load, a replaced parameter, and (a mixer keeping a kernel parameter deeper than
    its direct submodules) a write to that one: the output always equals the unfused mixer's."""
    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32,
                          out_type='featmap', out_indices=(-1, ))).eval()
    x = torch.randn(1, 3, 32, 32)
    mixer = m.layers[0].mixer

    def check():
        with torch.no_grad():
            ours = m(x)[0]
            with runtime.override(cpu_kernels=False):
                ref = m(x)[0]
        assert _rel(ours, ref) < 2e-6

    check()
    with torch.no_grad():
        mixer.x_proj.weight.mul_(1.5)                         # in place
    check()
    sd = {k: v * 0.9 if k.endswith('dt_proj.bias') else v for k, v in m.state_dict().items()}
    m.load_state_dict(sd)                                     # copy_ into the parameters
    check()
    mixer.A_log = torch.nn.Parameter(mixer.A_log.detach() + 0.3)   # another tensor
    check()
    mixer.conv1d_b = torch.nn.Sequential(mixer.conv1d_b)      # a parameter two levels down
    names = mixer.path_param_names
    mixer.path_param_names = lambda k: dict(names(k), conv1d='conv1d_b.0') if k else names(k)
    mixer.path_params = lambda k: tuple(mixer.get_submodule(v) if '.' in v else getattr(mixer, v)
                                        for v in mixer.path_param_names(k).values())
    check()
    assert mixer._fused_cache[2]                              # keyed on the packed tensors
    with torch.no_grad():
        mixer.conv1d_b[0].weight.mul_(-1)
    check()


@pytest.mark.parametrize('shape', [(2, 7, 192), (3, 13), (1, 1, 40)])
@pytest.mark.parametrize('with_residual', [True, False])
def test_add_rmsnorm_kernel_equals_the_module(shape, with_residual):
    """``residual + hidden`` (or ``hidden``) and the project's RMSNorm of it: the sum bit for
    bit, the norm within 1e-6 (its own summation order), rows of a length off the vector width
    and a single row included."""
    g = torch.Generator().manual_seed(1)
    h, r = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g) * 3
    norm = RMSNorm(shape[-1])
    with torch.no_grad():
        norm.weight.copy_(torch.rand(shape[-1], generator=g) + 0.5)
        res_ref = r + h if with_residual else h
        ref = norm(res_ref)
    out, res = cpu_ops.add_rmsnorm(h, r if with_residual else None, norm.weight, norm.eps)
    assert torch.equal(res, res_ref) and res.data_ptr() != h.data_ptr()
    assert out.shape == ref.shape and _rel(out, ref) < 1e-6


def test_add_rmsnorm_misfits_and_the_block_keeps_hooks():
    """The kernel steps aside for autograd, other dtypes and shapes; a block takes it at CPU
    inference, but not when a hook watches its norm (the hook is still called)."""
    w = torch.ones(8)
    h = torch.randn(2, 3, 8)
    assert cpu_ops.add_rmsnorm_misfit(h, None, w) is None
    assert 'backward' in cpu_ops.add_rmsnorm_misfit(h.requires_grad_(), None, w)
    h = h.detach()
    assert 'float32' in cpu_ops.add_rmsnorm_misfit(h.double(), None, w)
    assert 'shape' in cpu_ops.add_rmsnorm_misfit(h, h[:, :2], w)
    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32)).eval()
    x = torch.randn(1, 3, 32, 32)
    block = m.layers[1]
    seen = []
    with torch.no_grad():
        seen.append(m.execution_plan(x).block(1).add_norm.route)
        out = m(x)[0]
        hooked = []
        handle = block.norm.register_forward_hook(lambda *a: hooked.append(1))
        plan = m.execution_plan(x)
        seen.append(plan.block(1).add_norm.route)
        out_hooked = m(x)[0]
        handle.remove()
    assert seen == ['cpu', 'torch'] and hooked == [1]
    assert 'hook' in plan.block(1).add_norm.why and plan.block(0).add_norm.route == 'cpu'
    assert _rel(out_hooked, out) < 1e-6


def _torch_edges(scores, a_idx, b_idx, k):
    """ToMe.select's PyTorch ops after the scores (the kernel's reference)."""
    node_max, node_idx = scores.max(dim=-1)
    edges = node_max.argsort(dim=-1, descending=True, stable=True)[:, :k]
    a = a_idx.expand(scores.shape[0], -1)
    return torch.gather(a, 1, edges), b_idx[torch.gather(node_idx, 1, edges)]


@pytest.mark.parametrize('B,A,Bn,k,kind', [(2, 98, 98, 40, 'random'), (1, 25, 24, 25, 'random'),
                                           (3, 9, 8, 1, 'ties'), (2, 12, 7, 6, 'ties'),
                                           (1, 6, 5, 3, 'nan'), (1, 3, 2, 0, 'random')])
def test_tome_edges_kernel_decides_as_the_torch_ops(B, A, Bn, k, kind):
    """The same merged tokens and partners in the same order as max / argsort / gather on the
    same scores: random scores, many exact ties (first maximum, stable order), NaN scores
    (above every number, as torch orders them)."""
    g = torch.Generator().manual_seed(A)
    scores = torch.randn(B, A, Bn, generator=g)
    if kind == 'ties':
        scores = torch.randint(0, 3, (B, A, Bn), generator=g).float()
    elif kind == 'nan':
        scores[0, 1, 3] = scores[0, 4, 0] = float('nan')
    a_idx, b_idx = torch.arange(A) * 2 + 1, torch.arange(Bn) * 2 + 2
    removed, dst = cpu_ops.tome_edges(scores, a_idx, b_idx, k)
    ref_removed, ref_dst = _torch_edges(scores, a_idx, b_idx, k)
    assert removed.shape == dst.shape == (B, k)
    assert torch.equal(removed, ref_removed) and torch.equal(dst, ref_dst)
    with pytest.raises(RuntimeError, match=f'cannot merge {A + 1} of {A}'):
        cpu_ops.tome_edges(scores, a_idx, b_idx, A + 1)
    with pytest.raises(RuntimeError, match='must match'):
        cpu_ops.tome_edges(scores, a_idx[1:], b_idx, 0)


@pytest.mark.parametrize('cfg', [dict(type='Vim', arch='test', img_size=48),
                                 dict(type='AMVim', arch='test', img_size=64)])
def test_tome_on_the_cpu_kernels_is_bit_identical_to_its_torch_ops(cfg):
    """A ToMe backbone with its steps on the compiled kernel (``cpu_ops.tome_step``) against
    AMVIM_FUSED_REDUCTION_KERNELS=0 (ToMe's PyTorch ops, everything else the same): equal
    outputs and token counts."""
    torch.manual_seed(0)
    m = MODELS.build(dict(cfg, out_type='featmap', out_indices=(-1, ),
                          token_reduction=dict(type='ToMe', ratio=0.4))).eval()
    x = torch.randn(2, 3, cfg['img_size'], cfg['img_size'])
    calls = []
    orig = cpu_ops.tome_step
    with torch.no_grad():
        cpu_ops.tome_step = lambda *a: calls.append(1) or orig(*a)
        try:
            ours, counts = m(x)[0], list(m.token_counts)
            steps = m.last_context.steps
        finally:
            cpu_ops.tome_step = orig
        with runtime.override(reduction_kernels=False):
            ref, ref_counts = m(x)[0], list(m.token_counts)
    assert calls and set(steps) == {'cpu-step'} and len(calls) == len(steps)
    assert counts == ref_counts and counts[-1] < counts[0]
    assert torch.equal(ours, ref)


def test_training_on_cpu_never_takes_the_kernels():
    """With an autograd graph the mixer stays unfused and the scan on PyTorch (differentiable);
    the same model in no_grad takes the kernels."""
    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32))
    x = torch.randn(2, 3, 32, 32)
    plan = m.execution_plan(x)
    calls = [plan.block(0).mixer.route]
    m(x)[0].sum().backward()
    assert m.patch_embed.proj.weight.grad is not None
    with torch.no_grad():
        calls.append(m.execution_plan(x).block(0).mixer.route)
        m(x)
    assert calls == ['torch', 'cpu'] and plan.block(0).mixer.why == 'grad recorded'


def test_missing_library_falls_back_with_one_warning(tmp_path, caplog):
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32)).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = m(x)[0]
        with runtime.override(cache_dir=str(tmp_path)), \
                caplog.at_level(logging.WARNING, logger='amvim_mm'):
            out = m(x)[0]
            m(x)
    msgs = [r.getMessage() for r in caplog.records if 'not built' in r.getMessage()]
    assert len(msgs) == 1 and 'tools/setup_env.sh' in msgs[0], msgs
    assert _rel(out, ref) < 2e-6
    with runtime.override(cache_dir=str(tmp_path)), torch.no_grad(), \
            pytest.raises(BackendUnavailableError, match='not built'):
        u, delta, A, B, C, D, z, bias = _inputs(1, 8, 4, 16)
        selective_scan_fn(u, delta, A, B, C, D, z, bias, True, backend='cpu')


def test_switch_off_by_environment(monkeypatch):
    monkeypatch.setenv('AMVIM_CPU_KERNELS', '0')
    assert cpu_ops.available() == (False, 'AMVIM_CPU_KERNELS=0')
    monkeypatch.setenv('AMVIM_CPU_KERNELS', 'maybe')
    with pytest.raises(ValueError, match='AMVIM_CPU_KERNELS'):
        cpu_ops.available()


def test_build_tool_without_a_compiler_says_so(tmp_path):
    env = dict(os.environ, CXX='no-such-compiler-xyz', AMVIM_CACHE=str(tmp_path))
    res = subprocess.run([sys.executable, 'tools/build_cpu_ops.py'], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and 'no-such-compiler-xyz' in lines[0] and 'PyTorch' in lines[0]


def test_build_tool_reports_the_cached_library():
    res = subprocess.run([sys.executable, 'tools/build_cpu_ops.py'], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert cpu_ops.library_path() in res.stdout


def _tome_step(B, n_patches, cls, k, D=24, seed=0, steps=2):
    """A reduction context after ``steps - 1`` ToMe steps (PyTorch ops) and the next step's
    streams and ToMe selection."""
    from amvim_mm.models.execution import StepPlan
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import Streams, init_reduction_state, reduce_tokens
    g = torch.Generator().manual_seed(seed)
    side = int(n_patches ** 0.5)
    ctx = ScanContext((side, side), side * side // 2 if cls else -1)
    L = n_patches + (1 if cls else 0)
    ctx = init_reduction_state(ctx, B, 'cpu')
    layer = torch.nn.Module()
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.rand(D, generator=g) + 0.5
    tome = ToMe(r=k)
    hidden = torch.randn(B, L, D, generator=g)
    residual = torch.randn(B, L, D, generator=g)
    for s in range(steps):
        streams = Streams(hidden, residual)
        removed, dst, _ = tome.select(s, k, streams, ctx, layer)
        if s == steps - 1:
            return ctx, hidden, residual, removed, dst, streams.total()
        with runtime.override(cpu_kernels=False):
            hidden, residual, ctx = reduce_tokens(ctx, hidden, residual, removed, dst,
                                                  fold=True, stream=streams.total())
        residual, hidden = hidden, torch.randn(hidden.shape, generator=g)


@pytest.mark.parametrize('B,n_patches,cls,k,steps', [
    (1, 196, True, 14, 1), (3, 196, True, 30, 3), (2, 64, False, 20, 2), (2, 16, True, 8, 1)])
def test_fold_merge_kernel_equals_reduce_tokens_bit_for_bit(B, n_patches, cls, k, steps):
    """ToMe's merge step at CPU inference on the compiled kernel against ``reduce_tokens``'s
    PyTorch ops (the reference): the merged stream, pos, size and source, exactly; after
    earlier steps (sizes > 1, several tokens merging into one), with and without a class
    token."""
    from amvim_mm.models.reduction.state import reduce_tokens
    ctx, hidden, residual, removed, dst, stream = _tome_step(B, n_patches, cls, k, steps=steps)
    shared = any(len(set(row)) < len(row) for row in dst.tolist())
    assert shared or k < 20                       # several tokens merging into one
    outs = []
    for kernels in (True, False):
        with runtime.override(cpu_kernels=kernels), torch.no_grad():
            h, res, new = reduce_tokens(ctx, hidden, residual, removed, dst, fold=True,
                                        stream=stream)
        assert res is None
        outs.append((h, new))
    (h1, c1), (h0, c0) = outs
    assert h1.dtype == torch.float32 and h1.shape == (B, ctx.n_patches - k + cls, hidden.shape[-1])
    assert torch.equal(h1, h0)
    for f in ('pos', 'size', 'source'):
        assert torch.equal(getattr(c1, f), getattr(c0, f)), f
    assert (c1.cls_index, c1.n_patches, c1.steps) == (c0.cls_index, c0.n_patches, c0.steps)
    assert c1.frozen is None and c0.frozen is None


@pytest.mark.parametrize('B,n_patches,cls,k,metric,first', [
    (1, 196, True, 14, 'norm_input', False), (3, 196, True, 30, 'norm_input', True),
    (2, 64, False, 20, 'stream', True), (2, 16, True, 4, 'stream', False)])
def test_tome_step_kernel_equals_select_and_reduce_tokens_bit_for_bit(B, n_patches, cls, k,
                                                                      metric, first):
    """The whole ToMe step at CPU inference in one call (``ToMe.step`` on
    ``cpu_ops.tome_step``) against ``ToMe.select`` and ``reduce_tokens(fold=True)`` on
    PyTorch ops only: the same choice, the same merged stream and bookkeeping, exactly; with
    both metrics, before block 0 (no residual yet) and after an earlier step (sizes > 1)."""
    from amvim_mm.models.execution import StepPlan
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import Streams, init_reduction_state, reduce_tokens
    g = torch.Generator().manual_seed(n_patches + k)
    D, side = 24, int(n_patches ** 0.5)
    ctx = init_reduction_state(ScanContext((side, side), side * side // 2 if cls else -1), B,
                               'cpu')
    layer = torch.nn.Module()
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.rand(D, generator=g) + 0.5
    tome = ToMe(r=k, metric=metric)
    L = n_patches + cls
    hidden, residual = torch.randn(B, L, D, generator=g), None
    if not first:       # one earlier step (PyTorch ops): merged tokens of size > 1
        residual = torch.randn(B, L, D, generator=g)
        with runtime.override(cpu_kernels=False, reduction_kernels=False):
            streams = Streams(hidden, residual)
            rem, ds, _ = tome.select(0, k, streams, ctx, layer)
            residual, _, ctx = reduce_tokens(ctx, hidden, residual, rem, ds, fold=True)
        hidden = torch.randn(residual.shape, generator=g)
    with torch.no_grad():
        sel = tome.step(1, k, Streams(hidden, residual), ctx, layer,
                        StepPlan(1, 'cpu', 'cpu', True, 'CPU inference'))
        with runtime.override(cpu_kernels=False, reduction_kernels=False):
            streams = Streams(hidden, residual)
            rem, ds, _ = tome.select(1, k, streams, ctx, layer)
            ref_h, ref_res, ref = reduce_tokens(ctx, hidden, residual, rem, ds, fold=True)
    assert sel.reduced is not None and ref_res is None
    assert torch.equal(sel.removed, rem) and torch.equal(sel.dst, ds)
    h, pos, size, source = sel.reduced
    assert h.shape == (B, ctx.n_patches - k + cls, D) and torch.equal(h, ref_h)
    assert torch.equal(pos, ref.pos) and torch.equal(size, ref.size)
    assert torch.equal(source, ref.source)
    training = StepPlan(1, 'torch', 'torch', False, 'training')      # the step only chooses
    assert tome.step(1, k, Streams(hidden, residual), ctx, layer, training).reduced is None


def test_fold_merge_kernel_refuses_a_bad_selection():
    """Removed tokens that repeat, the class token removed, a removed token as a
    destination, or a source map pointing past the sequence: one clear error, no memory
    touched out of bounds."""
    ctx, hidden, residual, removed, dst, stream = _tome_step(1, 16, True, 4)
    args = (stream, ctx.size, ctx.pos, ctx.source)
    bad = [(removed.clone().fill_(int(removed[0, 0])), dst),      # repeated
           (torch.full_like(removed, ctx.cls_index), dst),        # not a patch token
           (removed, removed.roll(1, 1)),                          # dst removed too
           (removed + 100, dst)]                                   # out of range
    for rem, ds in bad:
        with pytest.raises(RuntimeError, match='removed must be distinct patch tokens'):
            cpu_ops.fold_merge(*args, rem, ds, ctx.n_patches, ctx.cls_index)
    source = ctx.source.clone()
    source[0, 3] = stream.shape[1]                                  # a token past the sequence
    with pytest.raises(RuntimeError, match='every source a token of the sequence'):
        cpu_ops.fold_merge(stream, ctx.size, ctx.pos, source, removed, dst, ctx.n_patches,
                           ctx.cls_index)


def test_fold_merge_kernel_steps_aside_under_autograd_and_other_dtypes():
    ctx, hidden, residual, removed, dst, stream = _tome_step(1, 16, True, 4)
    assert cpu_ops.fold_merge_misfit(stream) is None
    assert cpu_ops.fold_merge_misfit(stream.double()) == 'it computes in float32'
    assert cpu_ops.fold_merge_misfit(stream.requires_grad_()) == 'it has no backward'


def _mlstm_inputs(S, seed, i_scale=1.0, f_scale=1.0, f_shift=3.0, B=2, NH=3, DH=24):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, NH, S, DH, generator=g) for _ in range(3))
    ig = torch.randn(B, NH, S, 1, generator=g) * i_scale
    fg = torch.randn(B, NH, S, 1, generator=g) * f_scale + f_shift
    return q, k, v, ig, fg


@pytest.mark.parametrize('S', [1, 7, 64, 65, 197])
@pytest.mark.parametrize('gates', ['init', 'strong', 'extreme'])
def test_mlstm_cell_equals_the_parallel_form(S, gates):
    """ViL's compiled mLSTM cell against the parallel stabilised form in fp64 (the
    reference): within 1e-5 relative in fp32 for ViL-like and strong gates; with extreme input
    gates (x10, forget gates mostly closed, a normaliser that cancels) within 5e-5 and no
    worse than PyTorch's own fp32 parallel form. Lengths across the kernel's 64-row blocks."""
    from amvim_mm.ops.mlstm import mlstm_parallel
    kw = {'init': {}, 'strong': dict(i_scale=3.0, f_scale=3.0, f_shift=2.0),
          'extreme': dict(i_scale=10.0, f_shift=-2.0)}[gates]
    x = _mlstm_inputs(S, seed=S, **kw)
    ref = mlstm_parallel(*[t.double() for t in x])
    got = cpu_ops.mlstm(*x, 1e-6)
    assert got.shape == ref.shape and got.dtype == torch.float32
    if gates == 'extreme':
        assert _rel(got, ref) < 5e-5 and _rel(got, ref) <= _rel(mlstm_parallel(*x), ref)
    else:
        assert _rel(got, ref) < 1e-5


def test_mlstm_dispatch_and_vil_route(monkeypatch):
    """``mlstm`` takes the compiled cell for float32 CPU inference only (not with gradients,
    not with the kernels switched off, not in fp64); ViL's plan routes every block's cell to
    it, and the backbone's output equals the PyTorch forms'."""
    from amvim_mm.ops import mlstm as mlstm_mod
    calls = []
    real = cpu_ops.mlstm
    monkeypatch.setattr(cpu_ops, 'mlstm', lambda *a: calls.append(1) or real(*a))
    x = _mlstm_inputs(40, seed=1)
    with torch.no_grad():
        mlstm_mod.mlstm(*x)
        assert len(calls) == 1
        with runtime.override(cpu_kernels=False):
            mlstm_mod.mlstm(*x)
        mlstm_mod.mlstm(*[t.double() for t in x])
    mlstm_mod.mlstm(x[0].requires_grad_(), *x[1:])
    assert len(calls) == 1
    torch.manual_seed(0)
    m = MODELS.build(dict(type='ViL', arch='test', img_size=64, out_indices=(-1, ))).eval()
    img = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        routes = [b.mixer.route for b in m.execution_plan(img).blocks]
        ours = m(img)[0]
        with runtime.override(cpu_kernels=False):
            off = [b.mixer.route for b in m.execution_plan(img).blocks]
            ref = m(img)[0]
    assert set(routes) == {'cpu'} and set(off) == {'torch'}
    assert _rel(ours, ref) < 1e-5
