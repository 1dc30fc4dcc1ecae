"""DynamicViT's token keep predictor and its training-time decisions, for learned reducers.

:class:`KeepPredictor` is DynamicViT's ``PredictorLG`` (same layout and parameter names, so
official predictor weights load 1:1): a per-token ("local") half and a policy-weighted mean over
the currently kept tokens ("global") half feed a small MLP that gives each token the
log-probabilities of (keep, drop). :func:`gumbel_keep` is the training decision: a hard
Gumbel-softmax sample with a straight-through gradient, multiplied into the previous decision
so a dropped token never comes back.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from .settings import check_number, is_int


class KeepPredictor(nn.Module):
    """DynamicViT's ``PredictorLG`` on (B, N, C) patch tokens.

    ``h = GELU(Linear(LN(x)))``; ``z = [h[..., :C/2], mean_policy(h[..., C/2:])]`` (the mean
    over the tokens weighted by ``policy``, broadcast to every token); ``LogSoftmax(MLP(z))``
    with widths C -> C/2 -> C/4 -> 2 (GELU between). Channel 0 is "keep".

    Args:
        embed_dims: C (even).
    """

    def __init__(self, embed_dims: int) -> None:
        super().__init__()
        if not is_int(embed_dims) or embed_dims < 4 or embed_dims % 2:
            raise ConfigError(f'KeepPredictor: embed_dims must be an even int >= 4, got '
                              f'{embed_dims!r}')
        C = int(embed_dims)
        self.in_conv = nn.Sequential(nn.LayerNorm(C), nn.Linear(C, C), nn.GELU())
        self.out_conv = nn.Sequential(nn.Linear(C, C // 2), nn.GELU(), nn.Linear(C // 2, C // 4),
                                      nn.GELU(), nn.Linear(C // 4, 2), nn.LogSoftmax(dim=-1))

    def forward(self, x: torch.Tensor, policy: torch.Tensor) -> torch.Tensor:
        """(B, N, C) tokens and (B, N, 1) keep policy -> (B, N, 2) log-probabilities."""
        h = self.in_conv(x)
        B, N, C = h.shape
        local, glob = h[..., :C // 2], h[..., C // 2:]
        policy = policy.reshape(B, N, 1).to(h.dtype)
        glob = (glob * policy).sum(1, keepdim=True) / policy.sum(1, keepdim=True)
        return self.out_conv(torch.cat([local, glob.expand(B, N, C - C // 2)], -1))


def gumbel_keep(log_probs: torch.Tensor, previous: torch.Tensor, tau: float = 1.0
                ) -> torch.Tensor:
    """The training decision: ``gumbel_softmax(log_probs, tau, hard=True)[..., 0:1] *
    previous`` -> (B, N, 1), 0 / 1 in the forward pass with the soft sample's gradient
    (straight-through); tokens dropped before stay dropped. ``tau`` in (0, inf): at inf the
    sample ignores ``log_probs`` (every token kept)."""
    check_number('gumbel_keep', 'tau', tau, low=0, low_open=True)
    return F.gumbel_softmax(log_probs, tau=tau, hard=True)[..., 0:1] * previous
