"""Training on the fused path (amvim_mm.ops.fused_mixer_autograd): outputs and gradients of
whole backbones equal the unfused path's (the PyTorch mixer and scan, an independent route).

On CPU the kernels run in Triton's interpreter (a subprocess with ``TRITON_INTERPRET=1``), with
chunks of 4 or 8 steps so that every sequence (13 tokens, fewer after a reduction step) spans
several chunks, a partial last one included; the cases cover Vim's two paths with some channels
past softplus' threshold, AMVim's window paths with per-sample pruned sequences, and ToMe's
merges without a class token. The GPU checks compile the kernels and compare at realistic sizes.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.registry import MODELS
from amvim_mm.testing.triton_interpreter import PREAMBLE as FAST_INTERPRETER
from tests.ops.triton_support import HAS_TRITON, needs_triton  # noqa: F401


# one training step per case on the unfused path (the reference, once per case), then one on
# the fused path per backward setting that the case runs under: outputs, every parameter's
# gradient, token counts
GRAD_SCRIPT = textwrap.dedent('''
    import json, os, sys, torch, amvim_mm
    import amvim_mm.ops.fused_mixer_autograd as FA
    from amvim_mm.registry import MODELS
    cases, phases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    seen, groups_rule = set(), FA.bwd_groups

    def recording_groups(programs, n_chunks):   # (programs, chunks, groups) of each backward
        seen.add((programs, n_chunks, groups_rule(programs, n_chunks)))
        return groups_rule(programs, n_chunks)
    FA.bwd_groups = recording_groups

    def step(m, x, fused):
        for layer in m.layers:
            layer.mixer.fused = fused
        m.zero_grad()
        outs = m(x)
        loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
        loss.backward()
        return ([o.detach() for o in outs], {
            n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None},
            list(m.token_counts))

    res = []
    for i, (cfg, (h, w), batch, big_dt) in enumerate(cases):
        torch.manual_seed(0)
        m = MODELS.build(dict(dict(out_type='featmap', out_indices=(1, -1)), **cfg)).train()
        if big_dt:   # some channels past softplus' x > 20 threshold (delta = dt + bias)
            for layer in m.layers:
                with torch.no_grad():
                    layer.mixer.dt_proj.bias[::3] = 25.
        x = torch.randn(batch, 3, h, w)
        o0, g0, c0 = step(m, x, False)
        for bwd_config, target, which in phases:
            if i not in which:
                continue
            os.environ['AMVIM_FUSED_BWD_CONFIG'] = bwd_config
            FA.BWD_TARGET_PROGRAMS = target     # how many chunk groups the backward uses
            seen.clear()
            o1, g1, c1 = step(m, x, True)
            res.append(dict(
                case=i, phase=[bwd_config, target],
                out=max(((a - b).abs().max() / b.abs().max()).item()
                        for a, b in zip(o1, o0, strict=True)),
                names=sorted(g0) == sorted(g1), n=len(g0), counts=[c0, c1],
                groups=sorted(seen),
                grads={k: ((g1[k] - g0[k]).abs().max() / (g0[k].abs().max() + 1e-30)).item()
                       for k in g0}))
    print('RESULT' + json.dumps(res))
''')

# (model, input size: 13 tokens, batch, dt bias past softplus' threshold); Vim's own case is
# one block and one image (the multi-block, two-image route is the same code, run by the others)
CASES = [
    (dict(type='Vim', arch=dict(embed_dims=32, num_layers=1, d_state=8, d_conv=4, expand=2,
                                dt_rank=2), img_size=64, out_indices=(-1, )), (48, 64), 1, True),
    (dict(type='AMVim', arch='test', img_size=64, window_size=2,
          token_reduction=dict(type='RandomPrune', ratio=0.27, seed=1)), (64, 48), 2, False),
    (dict(type='Vim', arch='test', img_size=64, with_cls_token=False,
          token_reduction=dict(type='ToMe', ratio=0.3)), (64, 48), 2, False),
]
# (backward launch configuration, target programs, the cases run with it): programs = batch x
# channel blocks (64 inner channels / BLOCK_E) x 2 paths, chunks = tokens / T (the last one
# partial). 4,8,1 with target 1: one group (the chunks walked in turn), on every case. The
# grouping is the same code for every model, so the other two settings run on the first case
# only (13 tokens): 4,8,1 has 1 x 8 x 2 = 16 programs and 4 chunks, target 32 -> 2 groups of
# 2 chunks (the carried gradient, the link between groups); 8,16,2 has 1 x 4 x 2 = 8 programs
# and 2 chunks, a large target -> a group a chunk
PHASES = [('4,8,1', 1, [0, 1, 2]), ('4,8,1', 32, [0]), ('8,16,2', 10 ** 6, [0])]


def _run(cases, phases):
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', FAST_INTERPRETER + GRAD_SCRIPT, json.dumps(cases),
                           json.dumps(phases)],
                          env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    return json.loads(line[len('RESULT'):])


@pytest.mark.skipif(not HAS_TRITON, reason='triton is not installed')
def test_fused_training_matches_unfused_in_interpreter():
    """Every case under the first backward setting, the first case under all three (PHASES), in
    one interpreter process: the grouping each setting is
    meant to reach, outputs to 1e-5, every gradient to 2e-5 (relative to its largest entry) of
    the unfused path's, computed once per case."""
    results = _run(CASES, PHASES)
    assert [(r['case'], r['phase']) for r in results] == [
        (i, [c, t]) for i in range(len(CASES)) for c, t, which in PHASES if i in which]
    for r in results:
        cfg = CASES[r['case']][0]
        assert r['names'] and r['n'] > 20, r
        assert r['out'] < 1e-5, (cfg, r['phase'], r['out'])
        worst = max(r['grads'].items(), key=lambda kv: kv[1])
        assert worst[1] < 2e-5, (cfg, r['phase'], worst)
        # every mixer parameter got a gradient (in_proj to A_log / D of both paths)
        assert any('A_b_log' in k for k in r['grads']) and any('in_proj' in k
                                                                 for k in r['grads'])
        c0, c1 = r['counts']
        assert c0 == c1
    # the grouping each setting is meant to reach, (programs, chunks, groups) for 13 tokens:
    # one group, 2 groups of 2 chunks, a group a chunk
    by_phase = {(r['case'], r['phase'][1]): set(map(tuple, r['groups'])) for r in results}
    assert by_phase[0, 1] == {(16, 4, 1)}
    assert all(g == 1 for i in (1, 2) for _, _, g in by_phase[i, 1])
    assert by_phase[0, 32] == {(16, 4, 2)}
    assert by_phase[0, 10 ** 6] == {(8, 2, 2)}
    # the reduced cases ran on shorter sequences
    by_case = {r['case']: r for r in results}
    assert by_case[1]['counts'][0][-1] < by_case[1]['counts'][0][0]
    assert by_case[2]['counts'][0][-1] < by_case[2]['counts'][0][0]


@pytest.mark.skipif(not HAS_TRITON, reason='triton is not installed')
@pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') == '1', reason='interpreter is on')
def test_forced_fused_training_on_cpu_without_interpreter_says_how():
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32, fused_mixer=True)).train()
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET=1'):
        m(torch.randn(1, 3, 32, 32))


def test_automatic_training_choice_rule():
    from amvim_mm.ops.fused_mixer_autograd import TRAIN_MIN_LEN, auto_prefers_fused_training
    assert TRAIN_MIN_LEN == 512
    assert auto_prefers_fused_training(1025, torch.bfloat16)
    assert auto_prefers_fused_training(4097, torch.float16)
    assert not auto_prefers_fused_training(1025, None)              # fp32: 0.73x measured
    assert not auto_prefers_fused_training(197, torch.bfloat16)     # AMVim-T 224: 0.95x


def test_bwd_groups_rule():
    from amvim_mm.ops.fused_mixer_autograd import BWD_TARGET_PROGRAMS, bwd_groups
    assert bwd_groups(BWD_TARGET_PROGRAMS, 13) == 1             # enough programs: one group
    assert bwd_groups(8 * 12 * 2, 65) == 6                      # UperNet 512, batch 8
    assert bwd_groups(2 * 12 * 2, 257) == 22                    # Mask R-CNN 1024, batch 2
    assert bwd_groups(1, 3) == 3                                # never more groups than chunks


def test_bwd_config_env_is_validated(monkeypatch):
    from amvim_mm.ops.fused_mixer_autograd import BWD_CONFIG, bwd_config
    monkeypatch.delenv('AMVIM_FUSED_BWD_CONFIG', raising=False)
    assert bwd_config() == BWD_CONFIG
    monkeypatch.setenv('AMVIM_FUSED_BWD_CONFIG', '32,8,4')
    assert bwd_config() == (32, 8, 4)
    monkeypatch.setenv('AMVIM_FUSED_BWD_CONFIG', '32,8')
    with pytest.raises(ValueError, match='AMVIM_FUSED_BWD_CONFIG=.*"T,BLOCK_E,num_warps"'):
        bwd_config()


# ------------------------------------------------------------------------------------ GPU
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')


def _rel(a, b):
    return ((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-30)).item()


def _step(m, x, fused, amp):
    """One forward + backward; (outputs, {name: grad}) as fp32 copies."""
    for layer in m.layers:
        layer.mixer.fused = fused
    m.zero_grad()
    with torch.autocast('cuda', dtype=amp or torch.float32, enabled=amp is not None):
        outs = m(x)
        loss = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=x.device)
                    .view_as(o)).sum() / o.numel() ** 0.5 for o in outs)
    loss.backward()
    return ([o.detach().float() for o in outs],
            {n: p.grad.detach().float().clone() for n, p in m.named_parameters()
             if p.grad is not None})


def _worst(ga, gb):
    return max(((_rel(ga[k], gb[k]), k) for k in gb))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize('typ, arch, batch, size, reduction', [
    ('Vim', 'tiny', 8, 224, None),
    ('AMVim', 'tiny', 4, 224, None),
    ('Vim', 'tiny', 2, 512, None),                    # 1025 tokens
    ('Vim', 'small', 4, 224, dict(type='ToMe', ratio=0.17)),
    ('AMVim', 'tiny', 4, 224, dict(type='RandomPrune', ratio=0.3, seed=0)),
])
@pytest.mark.usefixtures('exact_fp32')
def test_fused_training_grads_cuda(typ, arch, batch, size, reduction):
    """fp32: fused = the unfused path on PyTorch's scan and conv (an independent route) to 1e-4
    relative (per tensor, against its largest entry) through every block; the unfused path on
    the mamba-ssm / causal-conv1d kernels is compared too (printed). bf16 autocast: the fused
    and the unfused (PyTorch route) path are compared with the fp32 result; the fused path's
    error is at most 1.5x the unfused path's plus 2e-3 (both round, neither is exact)."""
    from amvim_mm import runtime
    torch.manual_seed(0)
    cfg = dict(type=typ, arch=arch, img_size=size, out_type='featmap', out_indices=(5, -1))
    if reduction:
        cfg['token_reduction'] = reduction
    m = MODELS.build(cfg).cuda().train()
    x = torch.randn(batch, 3, size, size, device='cuda')
    o_k, g_k = _step(m, x, False, None)                 # mamba-ssm / causal-conv1d, if built
    with runtime.override(scan_backend='torch', conv_backend='torch'):
        o_ref, g_ref = _step(m, x, False, None)
        o_u16, g_u16 = _step(m, x, False, torch.bfloat16)
    o_f, g_f = _step(m, x, True, None)
    o_f16, g_f16 = _step(m, x, True, torch.bfloat16)
    assert sorted(g_ref) == sorted(g_f)
    worst, kernels = _worst(g_f, g_ref), _worst(g_k, g_ref)
    err_u, err_f = _worst(g_u16, g_ref), _worst(g_f16, g_ref)
    print(f'{typ}-{arch} b{batch} {size} {reduction}: fp32 fused vs torch route {worst}; '
          f'CUDA-kernel route vs torch route {kernels}; bf16 vs fp32: unfused {err_u}, '
          f'fused {err_f}')
    assert max(_rel(a, b) for a, b in zip(o_f, o_ref, strict=True)) < 1e-4
    assert worst[0] < 1e-4, worst
    assert err_f[0] <= 1.5 * err_u[0] + 2e-3, (err_f, err_u)
    out_u = max(_rel(a, b) for a, b in zip(o_u16, o_ref, strict=True))
    out_f = max(_rel(a, b) for a, b in zip(o_f16, o_ref, strict=True))
    assert out_f <= 1.5 * out_u + 2e-3, (out_f, out_u)
