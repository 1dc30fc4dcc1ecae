"""Effective receptive field maps (as in the RepLKNet / AMVim analyses).

For noise inputs, the gradient of the centre position of the last feature map (summed over
channels) with respect to the input image; absolute values summed over the colour channels and
averaged over samples. :func:`erf_map` returns the raw map; :func:`normalise_erf` applies the
usual ``log10(1 + x)`` and scales it to [0, 1] for display.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError


def erf_map(backbone: nn.Module, input_size: Tuple[int, int] = (224, 224), num_samples: int = 8,
            batch_size: int = 4, seed: int = 0, device: str = 'cpu') -> torch.Tensor:
    """(H, W) aggregated input-gradient magnitude of the centre output token of the
    backbone's last feature map (``backbone.last_featmap``)."""
    if num_samples < 1:
        raise ConfigError(f'num_samples must be positive, got {num_samples}')
    was_training = backbone.training
    backbone.eval()
    g = torch.Generator().manual_seed(seed)
    acc = torch.zeros(input_size, dtype=torch.float64)
    try:
        done = 0
        while done < num_samples:
            n = min(batch_size, num_samples - done)
            x = torch.randn(n, 3, *input_size, generator=g).to(device).requires_grad_(True)
            feat = backbone.last_featmap(x)                        # (n, D, h, w)
            h, w = feat.shape[-2:]
            centre = feat[:, :, h // 2, w // 2].sum()
            (grad, ) = torch.autograd.grad(centre, x)
            acc += grad.abs().sum(dim=(0, 1)).double().cpu()
            done += n
    finally:
        backbone.train(was_training)
    return (acc / num_samples).float()


def normalise_erf(m: torch.Tensor) -> torch.Tensor:
    m = torch.log10(1 + m)
    return (m - m.min()) / (m.max() - m.min()).clamp_min(1e-12)


def high_contribution_area(m: torch.Tensor, threshold: float = 0.2) -> float:
    """Share of the image whose normalised contribution exceeds ``threshold``."""
    return float((normalise_erf(m) > threshold).float().mean())
