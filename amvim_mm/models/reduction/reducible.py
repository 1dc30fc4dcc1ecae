"""The token-reduction switch every reducible backbone shares."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError
from . import margins
from .reducers import TokenReducer, build_reducer


class ReducibleBackbone:
    """Mixin: ``set_token_reduction`` for a backbone that says where a schedule acts
    (:meth:`reduction_domain`) and how to name that domain in an error
    (:meth:`reduction_domain_note`). The backbone's forward reads ``self.token_reducer``."""

    # ``token_reducer`` is set by set_token_reduction in the backbone's __init__ (no class
    # default: it would shadow a learned reducer registered as a submodule)
    #: the backbone has the masked training forward a learned reducer needs
    #: (:mod:`~amvim_mm.models.reduction.learned`)
    supports_learned_reduction = False

    def reduction_domain(self) -> Tuple[int, int]:
        """(tokens, blocks) a reducer's schedule acts on at the backbone's ``img_size``."""
        raise NotImplementedError

    @staticmethod
    def near_tie_recording() -> bool:
        """Whether a near-tie recorder is on (:func:`.margins.recording`): the execution plan
        then routes the steps' selections through PyTorch, which records."""
        return margins.active() is not None

    def reduction_width(self) -> int:
        """The token width where a schedule acts (a learned reducer's input width)."""
        return self.embed_dims

    def reduction_domain_note(self, tokens: int, blocks: int) -> str:
        return f'{tokens} tokens, {blocks} blocks'

    def set_token_reduction(self, cfg) -> None:
        """Switch token reduction on (a config dict or reducer) or off (``None``); the
        schedule is validated for ``img_size`` now, not at the first forward."""
        reducer = build_reducer(cfg)
        if reducer is not None and reducer.learned and not self.supports_learned_reduction:
            raise ConfigError(
                f'{type(self).__name__}: the learned reducer {type(reducer).__name__} needs a '
                'masked training forward, which the Vim family (Vim, AMVim, LocalVim), '
                'PlainMamba and ViL / AMViL have, not this backbone yet')
        if reducer is not None:
            M, depth = self.reduction_domain()
            try:
                reducer.removals(M, depth)
            except ConfigError as e:
                raise type(e)(f'{e} [{type(self).__name__} img_size={self.img_size}: '
                              f'{self.reduction_domain_note(M, depth)}]') from None
            if reducer.learned:
                reducer.bind(self)
        self.swap_token_reducer(reducer)

    def swap_token_reducer(self, reducer: Optional[TokenReducer]) -> Optional[TokenReducer]:
        """Put ``reducer`` (built and validated) in place and return the previous one. A
        learned reducer is a submodule (its parameters are the backbone's); any other value
        replaces it as a plain attribute."""
        old = getattr(self, 'token_reducer', None)
        modules = getattr(self, '_modules', {})
        if 'token_reducer' in modules and not isinstance(reducer, nn.Module):
            del modules['token_reducer']
        self.token_reducer = reducer
        return old

    #: the masked training forward models merges too (the Vim family: a merge is a weighted
    #: mean of both streams; a 2D grid conv would need the merged token in all its cells)
    masked_training_merges = False

    def begin_masked_training(self, ctx, tokens: torch.Tensor, depth: int):
        """Start a learned reducer's training forward over ``depth`` blocks of ``tokens``
        (B, L, D) on the grid of ``ctx``: refuse a merging reducer where the masked forward does
        not model merges, start the reducer's decisions, ask the mixers for importance when it
        needs them. Returns the reducer."""
        red = self.token_reducer
        if red.merges and not self.masked_training_merges:
            raise ConfigError(f'{type(self).__name__}: {type(red).__name__} merges tokens; a '
                              "merged token fills all its cells in this backbone's grid conv, "
                              'which the masked training forward does not model yet (use LTMP '
                              'with merge=False, or DynamicViT)')
        red.begin(tokens.shape[0], ctx.n_patches, depth, tokens.device)
        ctx.want_importance = red.needs_importance
        return red

    def runs_per_image(self, x) -> bool:
        """Whether this inference forward runs image by image: a reducer whose token counts
        depend on the image (LTMP's thresholds) and a batch of more than one image."""
        reducer = self.token_reducer
        return (reducer is not None and reducer.dynamic and not self.training
                and isinstance(x, torch.Tensor) and x.dim() == 4 and x.shape[0] > 1)

    def forward_per_image(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Inference one image at a time (**decision**: grouping, not padding; exact, and
        every image's survivors stay in order), outputs stacked in the batch's order; the
        record (``self.last_record``) is the last image's with ``token_counts`` the per-block
        mean over the images."""
        if getattr(self, 'out_type', None) == 'raw':
            raise ConfigError(f'{type(self).__name__}: out_type="raw" returns the reduced '
                              f'sequence, whose length differs per image with '
                              f'{type(self.token_reducer).__name__}; use featmap or cls_token, '
                              'or one image per batch')
        outs, counts = [], []
        for b in range(x.shape[0]):
            outs.append(self(x[b:b + 1]))
            counts.append(self.token_counts)
        self.last_record = dataclasses.replace(
            self.last_record, token_counts=[sum(c) / len(c) for c in zip(*counts)])
        return tuple(torch.cat(o, 0) for o in zip(*outs))
