"""The Vim family's embedding (patch embed, middle class token and position embedding, on the
fused kernel or in PyTorch) and the forward's execution plan (:meth:`VimEmbedding.
execution_plan`) that the embedding, the reduction session and the blocks read."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from amvim_mm.errors import ConfigError
from amvim_mm.ops.fused_embed import fused_patch_embed, fused_patch_embed_train
from amvim_mm.ops.fused_mixer import autocast_dtype
from amvim_mm.token_layout import NO_CLS, cls_index_for, cls_slot
from ..execution import (TRITON, TRITON_TRAIN, ExecutionPlan, forward_facts, plan_vim,
                         reducer_facts)
from ..layout.scan_context import ScanContext
from ..skeleton.embed import resize_pos_embed


class VimEmbedding:
    """Mixin of :class:`~.family.VimFamilyBackbone`: needs ``patch_embed``, ``pos_embed``,
    ``cls_token``, ``with_cls_token``, ``patch_resolution``, ``interpolate_mode``,
    ``drop_after_pos``, ``layers`` and ``check_images``."""

    def pos_embed_for(self, grid: Tuple[int, int]) -> torch.Tensor:
        """The position embedding for a ``grid`` of patches, resized from the model's own
        (:func:`resize_pos_embed`).

        Without autograd the resized copy is kept for the last grid, keyed by the grid and the
        parameter's storage and version (a load or an optimizer step recomputes it): PyTorch's
        bicubic resize is a large share of a fused backbone forward at detection sizes
        (benchmarks/README.md). With grad mode on it is recomputed every time."""
        if tuple(grid) == tuple(self.patch_resolution):
            return self.pos_embed
        pe = self.pos_embed
        if torch.is_grad_enabled():      # (a cached inference-mode tensor must not enter autograd)
            return resize_pos_embed(pe, self.patch_resolution, grid, self.interpolate_mode)
        key = (tuple(grid), pe.device, pe.dtype, pe.data_ptr(), pe._version,
               self.interpolate_mode)
        cached = self.__dict__.get('_resized_pos_embed')
        if cached is None or cached[0] != key:
            with torch.no_grad():
                out = resize_pos_embed(pe, self.patch_resolution, grid, self.interpolate_mode)
            cached = self.__dict__['_resized_pos_embed'] = (key, out)
        return cached[1]

    @property
    def min_input_size(self) -> int:
        """The smallest image height and width: one patch (see :meth:`check_images`)."""
        return self.patch_embed.patch_size

    def input_dtype(self) -> torch.dtype:
        """The dtype of images outside autocast: the stem's first weight's."""
        return self.patch_embed.proj.weight.dtype

    def embed(self, x: torch.Tensor, plan: Optional[ExecutionPlan] = None
              ) -> Tuple[torch.Tensor, ScanContext]:
        """Patch embed, middle class token and position embedding -> (tokens, context).

        On the plan's ``'triton'`` route (:mod:`amvim_mm.models.execution`: CUDA under 16-bit
        autocast, or any dtype in Triton's interpreter) this is one kernel,
        :func:`amvim_mm.ops.fused_embed.fused_patch_embed`; on ``'triton-train'`` the same
        kernel as the autograd Function :class:`~amvim_mm.ops.fused_embed.FusedPatchEmbed`
        (PyTorch backward); else PyTorch (in fp32 on CUDA cuBLAS's GEMM stays).

        The images are checked first (:meth:`check_images`: shape, channels, dtype, NaN/inf;
        a bad batch raises :class:`~amvim_mm.errors.ConfigError`). ``plan``: the forward's
        :class:`~amvim_mm.models.execution.ExecutionPlan` (None: made here).
        """
        self.check_images(x)
        plan = plan if plan is not None else self.execution_plan(x)
        if plan.embed.route in (TRITON, TRITON_TRAIN):
            return self._embed_triton(x, plan.embed.route == TRITON_TRAIN)
        tokens, grid = self.patch_embed(x)
        B, M, _ = tokens.shape
        pos_embed = self.pos_embed_for(grid)
        mid = cls_slot(M)
        if self.with_cls_token:
            cls = self.cls_token.expand(B, -1, -1)
            tokens = torch.cat([tokens[:, :mid], cls, tokens[:, mid:]], dim=1) + pos_embed
            ctx = ScanContext(grid, cls_index=mid, device=tokens.device)
        else:
            tokens = tokens + torch.cat([pos_embed[:, :mid], pos_embed[:, mid + 1:]], 1)
            ctx = ScanContext(grid, cls_index=NO_CLS, device=tokens.device)
        return self.drop_after_pos(tokens), ctx

    def _embed_triton(self, x: torch.Tensor, train: bool) -> Tuple[torch.Tensor, ScanContext]:
        """The embedding on the fused kernel (``train``: as the autograd Function)."""
        pe = self.patch_embed
        grid = pe.check_input(x)
        dtype = autocast_dtype(x.device.type) or pe.proj.weight.dtype
        cls = self.cls_token if self.with_cls_token else None
        if train:
            tokens = fused_patch_embed_train(x, pe.proj.weight, pe.proj.bias,
                                             self.pos_embed_for(grid), cls, pe.patch_size,
                                             grid, dtype)
        else:
            w, b = pe.gemm_weight(dtype)
            tokens = fused_patch_embed(x, w, b, self.pos_embed_for(grid), cls, pe.patch_size,
                                       grid)
        cls_index = cls_index_for(grid[0] * grid[1], self.with_cls_token)
        ctx = ScanContext(grid, cls_index=cls_index, device=tokens.device)
        return self.drop_after_pos(tokens), ctx

    def fused_path(self, x: torch.Tensor) -> bool:
        """Whether this forward runs the Triton kernels (:meth:`execution_plan`'s ``fused``)."""
        return self.execution_plan(x).fused

    def execution_plan(self, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
        """Which code runs in a forward on images ``x``, decided once
        (:func:`~amvim_mm.models.execution.plan_vim`; passed to :meth:`embed`, the
        reduction session and every block). ``fused``: a caller's Triton decision (None: the
        automatic one). A malformed input is planned without Triton and left to
        :meth:`check_images`, which names the problem."""
        pe = self.patch_embed
        p = pe.patch_size
        ok = isinstance(x, torch.Tensor) and x.dim() == 4 and x.shape[0] > 0 \
            and x.shape[-2] >= p and x.shape[-1] >= p
        grid = pe.grid_size(*x.shape[-2:]) if ok else (0, 0)
        M = int(grid[0] * grid[1])    # a plain int also under a trace (shapes as tensors)
        grad = torch.is_grad_enabled()
        facts = forward_facts(
            x, pe.proj.weight.dtype, self.training, M + int(self.with_cls_token),
            tuple(layer.block_facts(self.training) for layer in self.layers),
            self._reducer_facts(M) if ok else None, mixer=self.layers[0].mixer.mixer_facts(),
            embed_grad=grad and any(t.requires_grad for t in (
                pe.proj.weight, pe.proj.bias, self.pos_embed, self.cls_token)),
            embed_kernel=pe.stride == p and p >= 4 and not p & (p - 1),
            forced=fused if ok else False, recording=self.near_tie_recording())
        return plan_vim(facts, type(self).__name__)

    def _reducer_facts(self, num_patches: int):
        """The token reducer's facts for this grid (None: no reducer, or a schedule that does
        not fit, which the reduction session reports after the images are checked)."""
        try:
            return reducer_facts(self.token_reducer, num_patches, len(self.layers))
        except ConfigError:
            return None
