"""Segmenter's heads on the backbone's kept tokens (``out_type='tokens'``, a
:class:`~.token_grid.TokenGrid`): the per-token class scores are restored to the grid by the
reduction's own restore map, then mmseg up-samples them as usual.

* ``TokenFCNHead``: mmseg's ``FCNHead`` as Segmenter's linear head uses it (``num_convs=0``,
  ``concat_input=False``: dropout and the 1x1 ``conv_seg``) on every carrier. A 1x1 conv is the
  same linear map at every cell, so the scores of the carriers, restored, equal the head on
  the restored grid (``TokenGrid.dense``) exactly.
* ``TokenMaskTransformerHead``: mmseg's ``SegmenterMaskTransformerHead`` (its layers, weights
  and key names unchanged) with **proportional attention**: a carrier standing for ``s`` cells
  adds ``log s`` to the attention logits of every query on it (ToMe's rule), which equals the
  dense head on the restored grid, where that token appears ``s`` times (to rounding); carriers
  of no cell (``s = 0``: the class token, EViT's fused token, padding) are left out as keys.

Both take a dense feature map as well (then they are mmseg's heads). The classes are made on
first use (mmseg is imported then, not with this module); the registry's builders name them.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS
from .token_grid import TokenGrid

__all__ = ['token_fcn_head_class', 'token_mask_head_class', 'proportional_attention_bias']


def proportional_attention_bias(size: torch.Tensor, extra: int) -> torch.Tensor:
    """(B, N + extra) float key bias (attention's ``key_padding_mask``, added to the logits of
    every query on that key): ``log size`` on the carriers (-inf where a carrier stands for no
    cell), 0 on the ``extra`` keys after them (the class embeddings)."""
    B, _ = size.shape
    return torch.cat([size.float().log(), size.new_zeros(B, extra, dtype=torch.float32)], 1)


@functools.lru_cache(maxsize=None)
def token_fcn_head_class():
    """``TokenFCNHead``: mmseg's ``FCNHead`` (``num_convs=0``) on a :class:`TokenGrid`."""
    from mmseg.models.decode_heads import FCNHead

    class TokenFCNHead(FCNHead):
        def __init__(self, **kwargs) -> None:
            kwargs.setdefault('num_convs', 0)
            kwargs.setdefault('concat_input', False)
            super().__init__(**kwargs)
            if self.num_convs != 0 or self.concat_input:
                raise ConfigError('TokenFCNHead is the linear head (num_convs=0, '
                                  'concat_input=False): convs would mix neighbouring cells')

        def forward(self, inputs):
            x = self._transform_inputs(inputs)
            if not isinstance(x, TokenGrid):
                return super().forward(inputs)
            w = self.conv_seg.weight.flatten(1)                    # (C, D)
            t = self.dropout(x.tokens) if self.dropout is not None else x.tokens
            return x.restore(F.linear(t, w, self.conv_seg.bias))

    TokenFCNHead.__qualname__ = TokenFCNHead.__name__ = 'TokenFCNHead'
    return TokenFCNHead


@functools.lru_cache(maxsize=None)
def token_mask_head_class():
    """``TokenMaskTransformerHead``: Segmenter's mask transformer on a :class:`TokenGrid`."""
    from mmseg.models.decode_heads import SegmenterMaskTransformerHead

    class TokenMaskTransformerHead(SegmenterMaskTransformerHead):
        def forward(self, inputs):
            x = self._transform_inputs(inputs)
            if not isinstance(x, TokenGrid):
                return super().forward(inputs)
            h = self.dec_proj(x.tokens)
            C = self.num_classes
            h = torch.cat((h, self.cls_emb.expand(h.size(0), -1, -1)), 1)
            bias = proportional_attention_bias(x.size, C).to(h.dtype)
            for layer in self.layers:    # mmseg's TransformerEncoderLayer, with the key bias
                h = layer.attn(layer.norm1(h), identity=h, key_padding_mask=bias)
                h = layer.ffn(layer.norm2(h), identity=h)
            h = self.decoder_norm(h)
            patches = F.normalize(self.patch_proj(h[:, :-C]), dim=2, p=2)
            cls_seg_feat = F.normalize(self.classes_proj(h[:, -C:]), dim=2, p=2)
            masks = self.mask_norm(patches @ cls_seg_feat.transpose(1, 2))   # (B, N, C)
            return x.restore(masks)

    TokenMaskTransformerHead.__qualname__ = 'TokenMaskTransformerHead'
    TokenMaskTransformerHead.__name__ = 'TokenMaskTransformerHead'
    return TokenMaskTransformerHead


@MODELS.register_module(name='TokenFCNHead')
def build_token_fcn_head(**kwargs):
    """The registry's ``TokenFCNHead`` (:func:`token_fcn_head_class`)."""
    return token_fcn_head_class()(**kwargs)


@MODELS.register_module(name='TokenMaskTransformerHead')
def build_token_mask_head(**kwargs):
    """The registry's ``TokenMaskTransformerHead`` (:func:`token_mask_head_class`)."""
    return token_mask_head_class()(**kwargs)
