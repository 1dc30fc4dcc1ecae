"""PlainMamba's snake-scan kernel (amvim_mm.ops.plain_scan): the whole backbone on the kernel path
against the unfused mixer (cross-scan, the PyTorch scan, cross-merge), unreduced and with every
kind of reduced sequence (merged, pruned per sample, a fused token, ToP aligned in both gap
modes, displacement codes), in Triton's interpreter on CPU (a subprocess) and compiled on the
GPU; and when the mixer takes the kernel."""
import os
import textwrap

import pytest
import torch

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.ops.plain_scan import snake_config, use_snake_scan
from tests.ops.triton_support import needs_triton, run_in_interpreter

#: (name, arch, reduction, mixer options): every route of the kernel
CASES = [
    ('unreduced', 'test', None, {}),
    ('ToMe, displacement codes', 'test', dict(type='ToMe', r=5, locations=(0, 2)),
     dict(reduced_direction_codes='displacement')),
    ('EViT (fused token)', 'test', dict(type='EViT', keep_rate=0.7, locations=(1, )), {}),
    ('ToP aligned, bias gaps', 'test',
     dict(type='ToP', keep_rate=0.6, locations=(0, 2), gap_delta='bias'), {}),
    ('ToP aligned, token gaps; channel tail', dict(embed_dims=20, num_layers=3, d_state=8,
                                                   num_convs_patch_embed=1),
     dict(type='ToP', keep_rate=0.5, locations=(0, 1), gap_delta='token'), {}),
    ('ToP unaligned', 'test', dict(type='ToP', keep_rate=0.6, locations=(0, 2), align=False),
     {}),
]

SCRIPT = textwrap.dedent('''
    import json, torch
    from tests.ops.test_plain_scan import compare_paths
    print('RESULT' + json.dumps(compare_paths('cpu', torch.float32, 2, (96, 80))))
''')


def compare_paths(device, dtype, batch, img_size, cases=CASES):
    """Per case: the kernel path's features against the unfused mixer's (the PyTorch PlainMamba
    scan and the PyTorch aligned inputs), same survivors; relative max error."""
    import amvim_mm  # noqa: F401  (registers the backbones)
    from amvim_mm.ops.plain_aligned import override_kernels
    from amvim_mm.registry import MODELS
    out = []
    for name, arch, red, opts in cases:
        torch.manual_seed(0)
        cfg = dict(type='PlainMamba', arch=arch, img_size=img_size, out_indices=(-1, ),
                   token_reduction=red)
        m = MODELS.build(cfg).eval()
        with torch.no_grad():              # spread the step sizes the aligned gaps fold
            for layer in m.layers:
                layer.mamba.dt_proj.bias.uniform_(-4, 0.5)
                layer.mamba.direction_Bs.normal_(0, 0.5)
                for k, v in opts.items():
                    setattr(layer.mamba, k, v)
        m = m.to(device=device, dtype=dtype)
        x = torch.randn(batch, 3, *img_size).to(device=device, dtype=dtype)
        res = {}
        for on in (True, False):
            with runtime.override(fused_mixer=on), override_kernels(False), torch.no_grad():
                res[on] = (m(x)[0].float(), m.last_context.source.clone()
                           if red is not None else None)
        (a, sa), (b, sb) = res[True], res[False]
        out.append(dict(case=name, err=float((a - b).abs().max() / b.abs().max()),
                        same=red is None or torch.equal(sa, sb)))
    return out


@needs_triton
def test_snake_scan_equals_the_unfused_mixer_in_the_interpreter():
    """Every route of the kernel equals the unfused mixer to float rounding (fp32, 1e-6)."""
    res = run_in_interpreter(SCRIPT)
    assert [r['case'] for r in res] == [c[0] for c in CASES]
    for r in res:
        assert r['same'] and r['err'] <= 1e-6, r


def test_when_the_mixer_takes_the_kernel():
    """Only without autograd, fp64, an export or an explicit scan backend, with a power-of-2
    state; on CPU tensors only when the fused path is forced (Triton's interpreter); on
    automatic only with enough programs to fill the GPU."""
    x = torch.zeros(2, 5, 8)
    with runtime.override(fused_mixer=False):
        assert not use_snake_scan(x, 16, 8, None)
    with runtime.override(fused_mixer=None):
        assert not use_snake_scan(x, 16, 8, None)          # CPU, automatic
    if not os.environ.get('TRITON_INTERPRET'):
        with runtime.override(fused_mixer=True):
            assert not use_snake_scan(x, 16, 8, None)      # no interpreter, no kernel
    with runtime.override(fused_mixer=True):
        assert not use_snake_scan(x.double(), 16, 8, None)
        assert not use_snake_scan(x.requires_grad_(), 16, 8, None)
        assert not use_snake_scan(x.detach(), 16, 12, None)
        assert not use_snake_scan(x.detach(), 16, 8, 'torch')
        weight = torch.zeros(3, requires_grad=True)       # a trainable mixer, a frozen input
        assert not use_snake_scan(x.detach(), 16, 8, None, [weight])
        with torch.no_grad():
            assert use_snake_scan(x.detach(), 16, 8, None, [weight]) == bool(
                os.environ.get('TRITON_INTERPRET'))


def test_launch_config_is_validated(monkeypatch):
    monkeypatch.setenv('AMVIM_SNAKE_SCAN_CONFIG', '64,2')
    assert snake_config(896) == (64, 2) and snake_config(20) == (32, 2)
    monkeypatch.setenv('AMVIM_SNAKE_SCAN_CONFIG', '48,2')
    with pytest.raises(ConfigError, match='power of 2'):
        snake_config(896)
    monkeypatch.setenv('AMVIM_SNAKE_SCAN_CONFIG', '64')
    with pytest.raises(ConfigError, match='AMVIM_SNAKE_SCAN_CONFIG'):
        snake_config(896)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')
def test_snake_scan_equals_the_unfused_mixer_on_the_gpu():
    """Compiled, fp32: every route against the unfused mixer (mamba-ssm's scan where it is
    installed), 1e-5; and PlainMamba-L1 at 224 unreduced and ToP aligned."""
    for r in compare_paths('cuda', torch.float32, 3, (96, 80)):
        assert r['same'] and r['err'] <= 1e-5, r
    l1 = [('L1 unreduced', 'l1', None, {}),
          ('L1 ToP aligned', 'l1', dict(type='ToP', keep_rate=0.7, locations=(2, 5, 8)), {})]
    for r in compare_paths('cuda', torch.float32, 4, (224, 224), l1):
        assert r['same'] and r['err'] <= 1e-5, r
