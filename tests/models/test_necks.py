"""The plain pyramid neck: its ops (the official Vim pyramid) and the per-tap input norm."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.models.necks import PlainPyramidNeck


def test_in_norm_is_a_layernorm_per_token_before_the_resize():
    """``in_norm_cfg=LN2d`` equals LocalMamba's ``nn.LayerNorm(D)`` applied to every token of a
    tap (``outnorm_i``) before the map goes on; each tap has its own parameters."""
    torch.manual_seed(0)
    D = 8
    neck = PlainPyramidNeck(D, scales=(1, 1, 2, 0.5), in_norm_cfg=dict(type='LN2d', eps=1e-5))
    with torch.no_grad():
        for norm in neck.in_norms:
            norm.weight.normal_()
            norm.bias.normal_()
    maps = [torch.randn(2, D, 4, 6) for _ in range(4)]
    out = neck(maps)
    for i, (x, y) in enumerate(zip(maps, out, strict=True)):
        ln = nn.LayerNorm(D, eps=1e-5)
        ln.load_state_dict(neck.in_norms[i].state_dict())
        ref = ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if i == 2:
            ref = neck.ops[2](ref)
        elif i == 3:
            ref = F.max_pool2d(ref, 2, 2)
        torch.testing.assert_close(y, ref)
    assert [k for k in neck.state_dict() if k.startswith('in_norms.')] == [
        f'in_norms.{i}.{p}' for i in range(4) for p in ('weight', 'bias')]


def test_no_in_norm_by_default():
    neck = PlainPyramidNeck(8)
    assert neck.in_norms is None
    x = [torch.randn(1, 8, 4, 4) for _ in range(4)]
    torch.testing.assert_close(neck(x)[2], x[2])
