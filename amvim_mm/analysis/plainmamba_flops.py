"""Analytic FLOPs of PlainMamba.

Conventions, named in every result:

* ``'official'``: what fvcore counts on the official model with the selective-scan handle of
  the vision-Mamba papers (``9 * L * E * N + L * E`` per direction, the D skip included): one
  FLOP per multiply-accumulate of every conv (stem, extra convs, projection, the depthwise 7x7,
  L1's depthwise 3x3) and linear layer, ``5 * numel`` per LayerNorm and ``2 * numel`` per
  BatchNorm in eval mode (fvcore's norm handles); activations, additions, the direction bias
  and the gate count 0. L1 / L2 / L3 at 224 with a 1000-class head: 3.021 / 8.089 / 14.454 G.
* ``'mamba'`` (the project's convention): MACs of the linear/conv layers and ``9 * L * E * N``
  per direction; norms excluded.
* ``'mmengine'``: mmengine's ``FlopAnalyzer`` traced on the backbone (no scan handle).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction import build_reducer
from .mmengine_flops import mmengine_count

CONVENTIONS = {
    'official': ('fvcore MACs of convs/linears, 5*numel per LayerNorm, 2*numel per BatchNorm, '
                 'scan 9*L*E*N + L*E per direction'),
    'mamba': ('MACs of linear/conv layers + selective scan 9*L*E*N per direction (mamba-ssm '
              'convention); norms and activations excluded'),
    'mmengine': ("mmengine's FlopAnalyzer (the libraries' get_flops tools) traced on the "
                 'backbone; the selective scan and element-wise ops uncounted'),
}


def plainmamba_flops(model, input_shape: Union[int, Tuple[int, int]] = 224,
                     token_reduction: Optional[dict] = 'model', num_classes: int = 0,
                     convention: str = 'official') -> Dict[str, object]:
    """FLOPs of ``model`` (a :class:`~amvim_mm.models.backbones.plain_mamba.PlainMamba`) for
    one image.

    Args:
        input_shape: image size (int or (H, W)).
        token_reduction: ``'model'`` (the model's reducer), ``None`` or a reducer config; the
            layers are counted with the tokens they see (EViT's fused token included).
        num_classes: add the classifier (ln1 is in the backbone; the pooling counts 0, a
            linear head of this size).
        convention: ``'official'``, ``'mamba'`` or ``'mmengine'`` (module docstring).

    Returns a dict with ``gflops``, ``tokens`` (per layer), ``removals``, ``realised_ratio``
    and ``convention``.
    """
    if convention not in CONVENTIONS:
        raise ConfigError(f'FLOPs convention {convention!r} is not defined for PlainMamba; '
                          f'choose from {", ".join(CONVENTIONS)}')
    H, W = (input_shape, input_shape) if isinstance(input_shape, int) else input_shape
    depth, C = model.num_layers, model.embed_dims
    reducer = model.token_reducer if token_reduction == 'model' else build_reducer(
        token_reduction)
    official = convention == 'official'
    ln, bn = (5, 2) if official else (0, 0)       # fvcore: eval BN with affine = 2 * numel
    pe = model.patch_embed
    cin = model.in_channels
    c = pe.stem[0].out_channels
    h, w = (H + 1) // 2, (W + 1) // 2                                  # 7x7 stride-2 stem
    f = c * cin * 49 * h * w + bn * c * h * w
    n_convs = len([m for m in pe.convs if hasattr(m, 'kernel_size')])
    f += n_convs * (c * c * 9 * h * w + bn * c * h * w)
    k = pe.projection.stride[0]                                       # 8 (patch 16)
    gh, gw = -(-h // k), -(-w // k)                                    # padded to k, stride k
    M = gh * gw
    f += C * c * k * k * M                                             # projection
    removals, counts, realised = [0] * depth, [M] * depth, 0.0
    if reducer is not None:
        removals, counts, realised = reducer.token_plan(M, depth)
    if reducer is not None and reducer.dynamic:   # per-image counts (LTMP): the evaluated mean
        counts = list(reducer.mean_tokens())
        removals = [p0 - p1 for p0, p1 in zip([M] + counts[:-1], counts)]
        realised = sum(M - c for c in counts) / (depth * M)
    if convention == 'mmengine':
        total = mmengine_count(model, (H, W), reducer) + C * num_classes
        return dict(gflops=total / 1e9, tokens=counts, removals=removals,
                    realised_ratio=realised, convention=CONVENTIONS[convention])
    for layer, L in zip(model.layers, counts):
        m = layer.mamba
        E, N, R = m.d_inner, m.d_state, m.dt_rank
        k2 = m.conv2d.kernel_size[0] * m.conv2d.kernel_size[1]
        f += ln * L * C                                                # norm
        f += L * C * 2 * E + L * E * k2                                # in_proj, dw conv
        f += L * E * (R + 2 * N) + L * R * E + L * E * C               # x_proj, dt_proj, out
        scan = 9 * L * E * N + (L * E if official else 0)
        f += m.num_directions * scan
        if hasattr(layer, 'dw'):
            f += C * 9 * L + bn * C * L
    if model.final_norm:
        f += ln * counts[-1] * C
    if hasattr(reducer, 'extra_flops'):       # a learned reducer's own layers (predictors)
        f += reducer.extra_flops(M, depth)
    f += C * num_classes
    return dict(gflops=f / 1e9, tokens=counts, removals=removals, realised_ratio=realised,
                convention=CONVENTIONS[convention])
