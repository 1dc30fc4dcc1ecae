"""mmengine's FlopAnalyzer on a backbone with a reducer switched on (what the libraries'
``get_flops`` tools measure), shared by the Vim-family and VMamba counters."""
from __future__ import annotations

from typing import Tuple

import torch
from mmengine.analysis import FlopAnalyzer

from amvim_mm import runtime


def mmengine_count(model, input_shape: Tuple[int, int], reducer) -> float:
    """FLOPs that mmengine's ``FlopAnalyzer`` counts for one image with ``reducer`` on (the
    unfused path: the trace needs PyTorch ops). The model's own reducer is put back."""
    own = model.token_reducer
    device = next(model.parameters()).device
    was_training = model.training
    x = torch.zeros(1, model.in_channels, *input_shape, device=device)
    try:
        model.swap_token_reducer(reducer)
        model.eval()
        with runtime.override(fused_mixer=False), torch.no_grad():
            fa = FlopAnalyzer(model, (x, ))
            fa.unsupported_ops_warnings(False)
            fa.uncalled_modules_warnings(False)
            return float(fa.total())
    finally:
        model.swap_token_reducer(own)
        model.train(was_training)
