"""What the execution plan and the reduction session read of a block of any family."""
from __future__ import annotations

import torch

from ..execution import BlockFacts

__all__ = ['PlannedBlock']


class PlannedBlock:
    """Mixin of every family's block: :meth:`block_facts` (the Vim block overrides it with the
    facts its kernels need; the other families' blocks report what a reduction step needs)."""

    def block_facts(self, training: bool) -> BlockFacts:
        """The block's facts: whether its norm weight records gradients, and whether it has
        its own ToMe metric (``merge_metric``: the reducer then matches on it, in PyTorch)."""
        norm = getattr(self, 'norm', None)
        return BlockFacts(norm_grad=torch.is_grad_enabled() and norm is not None
                          and norm.weight.requires_grad,
                          own_metric=hasattr(self, 'merge_metric'))
