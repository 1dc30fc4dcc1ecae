"""The token-reduction switch every reducible backbone shares."""
from __future__ import annotations

from typing import Optional, Tuple

from amvim_mm.errors import ConfigError
from .reducers import TokenReducer, build_reducer


class ReducibleBackbone:
    """Mixin: ``set_token_reduction`` for a backbone that says where a schedule acts
    (:meth:`reduction_domain`) and how to name that domain in an error
    (:meth:`reduction_domain_note`). The backbone's forward reads ``self.token_reducer``."""

    token_reducer: Optional[TokenReducer] = None

    def reduction_domain(self) -> Tuple[int, int]:
        """(tokens, blocks) a reducer's schedule acts on at the backbone's ``img_size``."""
        raise NotImplementedError

    def reduction_domain_note(self, tokens: int, blocks: int) -> str:
        return f'{tokens} tokens, {blocks} blocks'

    def set_token_reduction(self, cfg) -> None:
        """Switch token reduction on (a config dict or reducer) or off (``None``); the
        schedule is validated for ``img_size`` now, not at the first forward."""
        reducer = build_reducer(cfg)
        if reducer is not None:
            M, depth = self.reduction_domain()
            try:
                reducer.removals(M, depth)
            except ConfigError as e:
                raise type(e)(f'{e} [{type(self).__name__} img_size={self.img_size}: '
                              f'{self.reduction_domain_note(M, depth)}]') from None
        self.token_reducer = reducer
