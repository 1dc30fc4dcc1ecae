"""RMSNorm as mamba-ssm has it (weight, no bias, computed in fp32)."""
from __future__ import annotations


import torch
import torch.nn as nn




class RMSNorm(nn.Module):
    """RMSNorm with a weight and no bias (``mamba_ssm``'s ``RMSNorm``), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype)
