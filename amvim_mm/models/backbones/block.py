"""One Vim block: residual add + RMSNorm (fused on the fused path, one compiled pass at CPU
inference) + mixer."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError
from amvim_mm.ops import cpu_ops
from amvim_mm.ops.fused_add_rmsnorm import fused_add_rmsnorm_train
from amvim_mm.ops.fused_mixer import fused_add_rmsnorm
from amvim_mm.ops.token_merge import apply_merge_plan
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import normalize_order
from .drop import DropPath
from .norm import RMSNorm


class VimBlock(nn.Module):
    """``residual = residual + drop_path(h); h = mixer(norm(residual))`` with an fp32 residual."""

    def __init__(self, mixer: nn.Module, embed_dims: int, paths: Sequence,
                 drop_path: float = 0., norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = RMSNorm(embed_dims, eps=norm_eps)
        self.mixer = mixer
        self.drop_path = DropPath(drop_path)
        self.path_keys = tuple(normalize_order(p) for p in paths)   # validated once
        if len(self.path_keys) != getattr(mixer, 'num_paths', len(self.path_keys)):
            raise ConfigError(f'{type(mixer).__name__} has {mixer.num_paths} paths, but the block '
                              f'got {len(self.path_keys)} scan orders')
        self.paths = tuple(dict(k) for k in self.path_keys)

    def forward(self, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                ctx: ScanContext, merge=None, fused: Optional[bool] = None,
                keep: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``merge``: a ToMe step planned for this block
        (:func:`~amvim_mm.models.reduction.state.plan_merge_step`): the streams come in at the
        old length and the merge happens in the fused add + RMSNorm. ``fused``: the forward's
        fused-path decision (the backbone takes it once per forward); None asks the mixer.
        ``keep``: a learned reducer's (B, L) keep mask (training): the mixer's masked forward
        (``forward_masked``) on the full sequence.

        With ``fused`` and a gradient wanted (:meth:`_wants_grad`) the add + RMSNorm is the
        trainable :func:`~amvim_mm.ops.fused_add_rmsnorm.fused_add_rmsnorm_train`; without a
        gradient the inference kernel (with the merge in its pass); unfused otherwise."""
        if keep is not None:
            residual = hidden if residual is None else residual + self.drop_path(hidden)
            normed = self.norm(residual.to(self.norm.weight.dtype))
            return self.mixer.forward_masked(normed, ctx, self.path_keys, keep), \
                residual.float()
        if fused is None:
            fused = self.mixer.use_fused(hidden, None)
        if fused and self._wants_grad(hidden, residual):
            # training on the fused path: the trainable add + RMSNorm (Triton forward and
            # backward, stochastic depth as a per-sample factor); a ToMe merge plan is applied
            # in PyTorch first, as on the unfused path (no stochastic depth on a merged stream)
            if merge is not None:
                hidden, residual = apply_merge_plan(hidden, residual, merge), None
            scale = None if residual is None else self.drop_path.scale(hidden)
            normed, residual = fused_add_rmsnorm_train(hidden, residual, self.norm.weight,
                                                       self.norm.eps, scale=scale)
            return self.mixer(normed, ctx, self.path_keys, fused=True), residual
        if fused and (not self.training or self.drop_path.drop_prob == 0):
            # inference: residual add + RMSNorm in one Triton pass (amvim_mm.ops.fused_mixer)
            normed, residual = fused_add_rmsnorm(hidden, residual, self.norm.weight,
                                                 self.norm.eps, merge=merge)
            return self.mixer(normed, ctx, self.path_keys, fused=True), residual
        if merge is not None:
            hidden, residual = apply_merge_plan(hidden, residual, merge), None
        if self._cpu_add_norm_fits(hidden, residual):
            # CPU inference: residual add + RMSNorm in one compiled pass (cpu_ops.add_rmsnorm)
            hidden, residual = cpu_ops.add_rmsnorm(hidden, residual, self.norm.weight,
                                                   self.norm.eps)
            return self.mixer(hidden, ctx, self.path_keys, fused=fused), residual
        residual = hidden if residual is None else residual + self.drop_path(hidden)
        hidden = self.norm(residual.to(self.norm.weight.dtype))
        residual = residual.float()
        return self.mixer(hidden, ctx, self.path_keys, fused=fused), residual

    def _cpu_add_norm_fits(self, hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> bool:
        """The unfused add + RMSNorm can take the compiled CPU kernel: float32 CPU inference,
        no stochastic depth in effect, the block's own ``RMSNorm`` with no hooks on it (a hook
        would be skipped), and :func:`~amvim_mm.ops.cpu_ops.add_rmsnorm_misfit` finds nothing
        (kernels built and on, no autograd, no trace)."""
        return (hidden.device.type == 'cpu' and type(self.norm) is RMSNorm
                and (not self.training or self.drop_path.drop_prob == 0)
                and not (self.norm._forward_hooks or self.norm._forward_pre_hooks
                         or nn.modules.module._global_forward_hooks
                         or nn.modules.module._global_forward_pre_hooks)
                and cpu_ops.add_rmsnorm_misfit(hidden, residual, self.norm.weight) is None)

    def _wants_grad(self, hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> bool:
        """Autograd records this block's add + RMSNorm: grad mode is on and the streams or the
        norm weight require grad."""
        return torch.is_grad_enabled() and (
            hidden.requires_grad or self.norm.weight.requires_grad
            or (residual is not None and residual.requires_grad))
