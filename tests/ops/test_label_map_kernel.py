"""The fused label-map kernel (``amvim_mm/ops/label_map.py``) against its reference, mmseg's
two calls (``F.interpolate`` bilinear, then ``argmax`` over the classes).

On the GPU: the resized values bit for bit and the labels identical, on random logits, on
quantised ones (ties across classes at most pixels), with NaN and +-inf, align_corners either
way. In Triton's interpreter (CPU): the kernel's argmax rule on its own values (first maximum,
NaN above every number) and values within float rounding of the CPU interpolation (whose
kernel rounds differently from CUDA's, so not bitwise there).
"""
import pytest
import torch

from amvim_mm.ops.label_map import fused_applies, fused_label_map, reference_label_map
from tests.ops.triton_support import needs_triton, run_in_interpreter

SHAPES = [((150, 128, 171), (512, 683), False), ((19, 64, 64), (97, 131), True),
          ((7, 33, 45), (250, 20), False), ((5, 16, 16), (16, 40), False)]


def _cases(device):
    g = torch.Generator(device=device).manual_seed(0)
    for (C, h, w), size, align in SHAPES:
        yield 'random', torch.randn(C, h, w, device=device, generator=g) * 4, size, align
        ties = torch.randint(0, 3, (C, h, w), device=device, generator=g).float()
        yield 'ties', ties, size, align
        odd = torch.randn(C, h, w, device=device, generator=g)
        odd[1, ::3, ::2] = float('nan')
        odd[C - 1, 1::4] = float('inf')
        odd[0, ::5] = float('-inf')
        yield 'nan/inf', odd, size, align


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')
def test_fused_label_map_equals_mmseg_on_the_gpu():
    for name, x, size, align in _cases('cuda'):
        assert fused_applies(x, size), name
        ref = torch.nn.functional.interpolate(x[None], size, mode='bilinear',
                                              align_corners=align)[0]
        got = fused_label_map(x, size, align, values=True)
        assert torch.equal(torch.nan_to_num(ref, 7.), torch.nan_to_num(got, 7.)), name
        assert torch.equal(fused_label_map(x, size, align),
                           reference_label_map(x, size, align)), (name, size, align)


def test_fused_route_applies_to_cuda_fp32_only():
    x = torch.zeros(3, 8, 8)
    assert not fused_applies(x, (16, 16))          # a CPU tensor
    assert fused_label_map(x, (16, 16), False) is None


SCRIPT = r'''
import json, torch, triton
from amvim_mm.ops import _label_map_kernels as k
from amvim_mm.ops.label_map import _scale
out = []
torch.manual_seed(0)
for C, h, w, H, W, align in ((7, 9, 11, 20, 17, False), (5, 8, 8, 15, 30, True)):
    for kind in ('random', 'ties', 'nan'):
        x = torch.randn(C, h, w) * 4 if kind != 'ties' else torch.randint(0, 3, (C, h, w)).float()
        if kind == 'nan':
            x[2, ::2] = float('nan')
        labels = torch.empty(H * W, dtype=torch.int64)
        vals = torch.empty(C, H * W)
        for write, dst in ((True, vals), (False, labels)):
            k.label_map_kernel[(triton.cdiv(H * W, 64), )](
                x, labels, dst, C, h, w, H, W, _scale(h, H, align), _scale(w, W, align),
                ALIGN=align, S=1, INNER=1, OUTER=1, WRITE_VALUES=write, BLOCK=64)
        ref = torch.nn.functional.interpolate(x[None], (H, W), mode='bilinear',
                                              align_corners=align)[0].reshape(C, -1)
        fin = torch.isfinite(ref)
        out.append(dict(case=kind, labels=torch.equal(labels, vals.argmax(0)),
                        same_nan=torch.equal(ref.isnan(), vals.isnan()),
                        err=float((vals[fin] - ref[fin]).abs().max())))
print('RESULT' + json.dumps(out))
'''


@needs_triton
def test_kernel_argmax_rule_in_the_interpreter():
    res = run_in_interpreter(SCRIPT)
    assert len(res) == 6
    for r in res:
        assert r['labels'] and r['same_nan'] and r['err'] <= 1e-5, r
