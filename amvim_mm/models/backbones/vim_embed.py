"""The Vim family's embedding: patch embed, middle class token and position embedding, on the
fused kernel or in PyTorch, and the forward's execution decision it shares with the blocks."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from amvim_mm.ops.fused_embed import fused_patch_embed, fused_patch_embed_train
from amvim_mm.ops.fused_mixer import autocast_dtype
from amvim_mm.token_layout import NO_CLS, cls_index_for, cls_slot
from ..layout.scan_context import ScanContext
from .embed import resize_pos_embed


class VimEmbedding:
    """Mixin of :class:`~.vim_family.VimFamilyBackbone`: needs ``patch_embed``, ``pos_embed``,
    ``cls_token``, ``with_cls_token``, ``patch_resolution``, ``interpolate_mode``,
    ``drop_after_pos``, ``layers`` and ``check_images``."""

    def pos_embed_for(self, grid: Tuple[int, int]) -> torch.Tensor:
        """The position embedding for a ``grid`` of patches, resized from the model's own
        (:func:`resize_pos_embed`).

        Without autograd the resized copy is kept for the last grid, keyed by the grid and the
        parameter's storage and version (a load or an optimizer step recomputes it): PyTorch's
        bicubic resize costs about 1 ms a forward on an H200 at 1024 px, a fifth of a fused
        Vim-T backbone forward at batch 2. With grad mode on it is recomputed every time."""
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

    def _embed_fused(self, x: torch.Tensor, fused: Optional[bool]) -> bool:
        """Whether :meth:`embed` runs the fused kernel: the forward's fused decision
        (``fused``; None asks the first block's mixer), a kernel-shaped patch (stride ==
        patch size, a power of two >= 4) and, on CUDA, 16-bit autocast. Training and gradients
        are allowed (:meth:`_embed_wants_grad` picks the trainable Function)."""
        pe = self.patch_embed
        p = pe.patch_size
        if pe.stride != p or p < 4 or p & (p - 1):   # the kernel's K steps
            return False
        if x.is_cuda and autocast_dtype('cuda') not in (torch.float16, torch.bfloat16):
            return False
        if fused is None:
            fused = x.dim() == 4 and self._images_use_fused(x)
        return fused

    def _embed_wants_grad(self, x: torch.Tensor) -> bool:
        """Autograd records the embedding: grad mode is on and the image or an embedding
        parameter requires grad."""
        pe = self.patch_embed
        return torch.is_grad_enabled() and (x.requires_grad or any(
            t.requires_grad for t in (pe.proj.weight, pe.proj.bias, self.pos_embed,
                                      self.cls_token)))

    def _images_use_fused(self, x: torch.Tensor) -> bool:
        """The first mixer's ``use_fused`` for a forward on images ``x`` (B, C, H, W): the
        automatic choice is told the token count (patches, plus the class token)."""
        grid = self.patch_embed.grid_size(*x.shape[-2:])
        L = grid[0] * grid[1] + int(self.with_cls_token)
        return self.layers[0].mixer.use_fused(x, None, seq_len=L)

    @property
    def min_input_size(self) -> int:
        """The smallest image height and width: one patch (see :meth:`check_images`)."""
        return self.patch_embed.patch_size

    def input_dtype(self) -> torch.dtype:
        """The dtype of images outside autocast: the stem's first weight's."""
        return self.patch_embed.proj.weight.dtype

    def embed(self, x: torch.Tensor, fused: Optional[bool] = None
              ) -> Tuple[torch.Tensor, ScanContext]:
        """Patch embed, middle class token and position embedding -> (tokens, context).

        On the fused path (CUDA under 16-bit autocast; any dtype in Triton's interpreter) this
        is one kernel, :func:`amvim_mm.ops.fused_embed.fused_patch_embed`; when a gradient is
        wanted, the same kernel as the autograd Function
        :class:`~amvim_mm.ops.fused_embed.FusedPatchEmbed` (PyTorch backward).
        In fp32 on CUDA cuBLAS's fp32 GEMM stays (Triton's fp32 dot products are not faster).

        The images are checked first (:meth:`check_images`: shape, channels, dtype, NaN/inf;
        a bad batch raises :class:`~amvim_mm.errors.ConfigError`). ``fused``: the forward's
        fused-path decision (None: ask the first block's mixer).
        """
        self.check_images(x)
        if self._embed_fused(x, fused):
            pe = self.patch_embed
            grid = pe.check_input(x)
            dtype = autocast_dtype(x.device.type) or pe.proj.weight.dtype
            cls = self.cls_token if self.with_cls_token else None
            if self._embed_wants_grad(x):      # training: the same kernel, a PyTorch backward
                tokens = fused_patch_embed_train(x, pe.proj.weight, pe.proj.bias,
                                                 self.pos_embed_for(grid), cls, pe.patch_size,
                                                 grid, dtype)
            else:
                w, b = pe.gemm_weight(dtype)
                tokens = fused_patch_embed(x, w, b, self.pos_embed_for(grid), cls,
                                           pe.patch_size, grid)
            cls_index = cls_index_for(grid[0] * grid[1], self.with_cls_token)
            ctx = ScanContext(grid, cls_index=cls_index, device=tokens.device)
            return self.drop_after_pos(tokens), ctx
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

    def fused_path(self, x: torch.Tensor) -> bool:
        """Whether this forward takes the fused inference path (decided once per forward:
        device, grad mode, batch size and the switches; the mixers add per-block conditions
        such as ToP's importance, see :meth:`BiMambaMixer.forward`). A malformed input is left
        to :meth:`check_images`, which names the problem."""
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[0] == 0:
            return False
        p = self.patch_embed.patch_size
        if x.shape[-2] < p or x.shape[-1] < p:
            return False      # check_images names the problem
        return self._images_use_fused(x)

    def execution_plan(self, x: torch.Tensor):
        """The decision of which code runs in this forward, taken once (passed to
        :meth:`embed`, the reduction session and every block)."""
        return self.fused_path(x)
