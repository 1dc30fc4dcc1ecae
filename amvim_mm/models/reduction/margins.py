"""Decision margins of the reducers whose token choices depend on the image's features.

ToMe keeps a token or merges it, EViT / ToP keep it or not, by comparing scores: a choice is a
step function of the features. Two runtimes that compute the features with different rounding
(ONNX Runtime's kernels and PyTorch's, or PyTorch's compiled CPU kernels and its ATen ops) make
the same choices except at a **near tie**, where the deciding scores are within rounding of
each other; there they may choose differently, and the rest of the forward then differs by far
more than rounding (flat image regions give ToMe many such ties: cosine similarities crowd at
0.99998, one fp32 step apart). No implementation can make discontinuous choices agree at every
input; what a parity check can do is tell an image at a near tie from a wrong graph.

:func:`recording` collects, per image, the smallest margin of every choice a reducer makes in
one forward (PyTorch ops; the compiled routes step aside while recording):

* ToMe: the gap between the last merged and the first kept edge, and for every merged token
  the gap between its best and second-best partner (cosine similarities, scale 1);
* EViT / ToP: the gap between the last removed and the first kept importance, relative to the
  image's largest importance.

``NEAR_TIE``: a margin below it is a near tie (about 16 fp32 steps at 1.0; the features of the
two runtimes differ by about 1e-7 there).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional

import torch

__all__ = ['NEAR_TIE', 'MarginRecord', 'recording', 'active', 'matching_margin',
           'ranking_margin']

NEAR_TIE = 1e-6

_records: List['MarginRecord'] = []


class MarginRecord:
    """The per-image smallest margin of one forward (``None`` until a reducer chose)."""

    def __init__(self) -> None:
        self.margin: Optional[torch.Tensor] = None

    def note(self, margin: torch.Tensor) -> None:
        m = margin.detach().float().cpu()
        self.margin = m if self.margin is None else torch.minimum(self.margin, m)

    def near_ties(self, batch: int) -> torch.Tensor:
        """(batch,) bool: the images whose choices came within ``NEAR_TIE`` of a tie."""
        if self.margin is None:
            return torch.zeros(batch, dtype=torch.bool)
        return self.margin.expand(batch) < NEAR_TIE


@contextlib.contextmanager
def recording() -> Iterator[MarginRecord]:
    """Record the margins of the reducers' choices inside the block."""
    rec = MarginRecord()
    _records.append(rec)
    try:
        yield rec
    finally:
        _records.remove(rec)


def active() -> Optional[MarginRecord]:
    """The innermost record, or None (the reducers then compute no margin)."""
    return _records[-1] if _records else None


def matching_margin(scores: torch.Tensor, k: int) -> torch.Tensor:
    """ToMe's margin per image: ``scores`` (B, A, B') similarities, ``k`` merged edges -> (B,)."""
    big = torch.ones(scores.shape[0], device=scores.device)
    top = scores.topk(min(2, scores.shape[-1]), dim=-1).values
    node_max = top[..., 0]
    order = torch.argsort(node_max, dim=-1, descending=True, stable=True)
    ranked = torch.gather(node_max, 1, order)
    cut = ranked[:, k - 1] - ranked[:, k] if k < ranked.shape[1] else big
    if top.shape[-1] < 2:
        return cut
    partner = torch.gather(top[..., 0] - top[..., 1], 1, order[:, :k]).amin(1)
    return torch.minimum(cut, partner)


def ranking_margin(score: torch.Tensor, k: int) -> torch.Tensor:
    """EViT / ToP's margin per image: ``score`` (B, n) importances, the ``k`` lowest removed ->
    (B,), relative to the image's largest importance."""
    if k >= score.shape[1]:
        return torch.ones(score.shape[0], device=score.device)
    ranked = score.sort(dim=1).values
    scale = score.abs().amax(1).clamp_min(torch.finfo(score.dtype).tiny)
    return (ranked[:, k] - ranked[:, k - 1]) / scale
