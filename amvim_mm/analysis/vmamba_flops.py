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

from typing import Dict, Optional, Tuple, Union

from amvim_mm.models.vmamba.vmamba import FLOPS_CONVENTIONS as CONVENTIONS
from .flops import backbone_flops

__all__ = ['CONVENTIONS', 'vmamba_flops']


def vmamba_flops(model, input_shape: Union[int, Tuple[int, int]] = 224,
                 token_reduction: Optional[dict] = 'model', num_classes: int = 0,
                 convention: str = 'official') -> Dict[str, object]:
    """FLOPs of ``model`` (a :class:`~amvim_mm.models.vmamba.vmamba.VMamba`) for one image
    (:func:`~.flops.backbone_flops`; the blocks count themselves, ``VSSBlock.flops``).

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
    return backbone_flops(model, input_shape, token_reduction, num_classes, convention)
