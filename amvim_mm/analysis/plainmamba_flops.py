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

from amvim_mm.models.plain_mamba.plain_mamba import FLOPS_CONVENTIONS as CONVENTIONS
from .flops import backbone_flops

__all__ = ['CONVENTIONS', 'plainmamba_flops']


def plainmamba_flops(model, input_shape: Union[int, Tuple[int, int]] = 224,
                     token_reduction: Optional[dict] = 'model', num_classes: int = 0,
                     convention: str = 'official') -> Dict[str, object]:
    """FLOPs of ``model`` (a :class:`~amvim_mm.models.plain_mamba.plain_mamba.PlainMamba`) for
    one image (:func:`~.flops.backbone_flops`; the layers count themselves,
    ``PlainMambaLayer.flops``).

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
    return backbone_flops(model, input_shape, token_reduction, num_classes, convention)
