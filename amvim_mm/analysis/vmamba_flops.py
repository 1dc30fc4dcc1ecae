"""Analytic FLOPs of VMamba, with token reduction in one stage.

Conventions, named in every result:

* ``'official'``: what the official ``VSSM.flops()`` measures (fvcore's ``flop_count`` with
  the official handles): one FLOP per multiply-accumulate of every conv (the 1x1
  "Linear2d" layers, the depthwise 3x3, the grouped ``x_proj``/``dt_projs`` conv1d, patch
  embed and downsample convs) and linear layer; ``5 * numel`` per LayerNorm (fvcore's affine
  norm handle); ``numel`` for the global average pool; the selective scan through the
  official handle ``9 * L * D * N + L * D`` with ``D = K * E`` (all four directions and the D
  skip); activations, element-wise adds, the z gate and the cross-scan/merge count 0.
  VMamba-T/S/B at 224 with the classifier: 4.906 / 8.716 / 15.359 GFLOPs, as the official
  tables.
* ``'mamba'`` (the project's convention for the Vim family): MACs of the linear/conv layers and
  ``9 * L * E * N`` per scan direction; norms, activations and the pool excluded.
* ``'mmengine'``: mmengine's ``FlopAnalyzer`` traced on the backbone (see
  :mod:`amvim_mm.analysis.flops`); it has no handle for the selective scan.

Under token reduction the blocks of the reduced stage are counted at the tokens each block
sees (``tokens``); the depthwise conv runs on the scattered grid but only the present tokens'
outputs are counted. The restore of the full grid costs nothing.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple, Union

from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction import build_reducer
from .mmengine_flops import mmengine_count

CONVENTIONS = {
    'official': ("the official VSSM.flops(): fvcore MACs of convs/linears, 5*numel per "
                 'LayerNorm, numel for the pool, scan 9*L*(K*E)*N + L*(K*E); per-stage and '
                 'per-block token counts'),
    'mamba': ('MACs of linear/conv layers + selective scan 9*L*E*N per direction (mamba-ssm '
              'convention); norms, activations and the pool excluded'),
    'mmengine': ("mmengine's FlopAnalyzer (the libraries' get_flops tools) traced on the "
                 'backbone; the selective scan and element-wise ops uncounted'),
}


def _conv_out(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def vmamba_flops(model, input_shape: Union[int, Tuple[int, int]] = 224,
                 token_reduction: Optional[dict] = 'model', num_classes: int = 0,
                 convention: str = 'official') -> Dict[str, object]:
    """FLOPs of ``model`` (a :class:`~amvim_mm.models.backbones.vmamba.VMamba`) for one image.

    Args:
        input_shape: image size (int or (H, W)).
        token_reduction: ``'model'`` (the model's reducer), ``None`` or a reducer config.
        num_classes: add the official classifier (norm, pool, linear head) of this size.
        convention: ``'official'``, ``'mamba'`` or ``'mmengine'`` (module docstring).

    Returns:
        dict with ``gflops``, ``stage_gflops`` (per stage, incl. its downsample), ``tokens``
        (per block, all stages), ``stage_tokens`` (grid cells per stage), ``removals`` and
        ``realised_ratio`` (of the reduced stage), ``reduction_stage`` and ``convention``.
    """
    if convention not in CONVENTIONS:
        raise ConfigError(f'FLOPs convention {convention!r} is not defined for VMamba; choose '
                          f'from {", ".join(CONVENTIONS)}')
    H, W = (input_shape, input_shape) if isinstance(input_shape, int) else input_shape
    official = convention == 'official'
    ln = 5 if official else 0                 # fvcore: 5 * numel per affine LayerNorm
    cfg = model.arch_settings
    C = model.embed_dims
    cin = model.in_channels
    s = model.reduction_stage
    reducer = model.token_reducer if token_reduction == 'model' else build_reducer(
        token_reduction)

    # patch embed
    if cfg['patch_embed'] == 'v2':
        h1, w1 = _conv_out(H, 3, 2, 1), _conv_out(W, 3, 2, 1)
        h, w = _conv_out(h1, 3, 2, 1), _conv_out(w1, 3, 2, 1)
        embed = (C // 2) * cin * 9 * h1 * w1 + ln * (C // 2) * h1 * w1 \
            + C * (C // 2) * 9 * h * w + ln * C * h * w
    else:
        h, w = H // 4, W // 4
        embed = C * cin * 16 * h * w + ln * C * h * w
    stage_flops: List[float] = []
    tokens: List[int] = []
    stage_tokens: List[int] = []
    removals: List[int] = []
    realised = 0.0
    for i, depth in enumerate(model.depths):
        M = h * w
        stage_tokens.append(M)
        counts = [M] * depth
        if i == s and reducer is not None:
            removals, counts, realised = reducer.token_plan(M, depth)
            if reducer.dynamic:   # per-image counts: the evaluated mean
                counts = list(reducer.mean_tokens())
                removals = [p0 - p1 for p0, p1 in zip([M] + counts[:-1], counts)]
                realised = sum(M - c for c in counts) / (depth * M)
            if hasattr(reducer, 'extra_flops'):      # a learned reducer's own layers
                embed += reducer.extra_flops(M, depth)
        tokens.extend(counts)
        f = 0.0
        for blk, L in zip(model.layers[i].blocks, counts):
            op = blk.op
            d, E, N, R, K = op.d_model, op.d_inner, op.d_state, op.dt_rank, op.num_directions
            k2 = op.conv2d.kernel_size[0] * op.conv2d.kernel_size[1]
            f += ln * L * d                                             # norm
            f += L * d * op.in_proj.out_features                        # in_proj
            f += L * E * k2                                             # depthwise conv
            f += K * L * E * (R + 2 * N) + K * L * R * E                # x_proj, dt_projs
            f += (9 * L * K * E * N + L * K * E) if official else K * 9 * L * E * N
            f += ln * L * E + L * E * d                                 # out_norm, out_proj
            if blk.mlp_branch:
                hid = blk.mlp.fc1.out_features
                f += ln * L * d + 2 * L * d * hid
        if i < len(model.depths) - 1:
            d2 = model.dims[i + 1]
            if cfg['downsample'] == 'v3':
                h, w = _conv_out(h, 3, 2, 1), _conv_out(w, 3, 2, 1)
                f += d2 * model.dims[i] * 9 * h * w + ln * d2 * h * w
            else:
                h, w = math.ceil(h / 2), math.ceil(w / 2)
                f += ln * 4 * model.dims[i] * h * w + h * w * 4 * model.dims[i] * d2
        stage_flops.append(f)
    total = embed + sum(stage_flops)
    if num_classes:
        D = model.dims[-1]
        total += ln * D * h * w + (D * h * w if official else 0) + D * num_classes
    if convention == 'mmengine':
        total = mmengine_count(model, (H, W), reducer)
        if num_classes:
            total += model.dims[-1] * num_classes
        stage_flops = []
    return dict(gflops=total / 1e9, stage_gflops=[f / 1e9 for f in stage_flops],
                tokens=tokens, stage_tokens=stage_tokens, removals=removals,
                realised_ratio=realised, reduction_stage=s,
                convention=CONVENTIONS[convention])
