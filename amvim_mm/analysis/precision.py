"""Does mixed precision change what a reducer decides? fp32 against bf16/fp16 on one test set.

Every reduction step's choice is recorded as grid positions (``removed`` token -> the survivor
it merges into, -1 for pruned) for each image; two runs agree on a step's decision when the
same edge is chosen. Agreement = agreeing edges / all edges, over all images and steps (a step
after a disagreement still counts: its tokens may differ, which is part of the effect). The
test loop runs each step under autocast (:class:`~amvim_mm.engine.loops.AmpTestLoop`).
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Sequence, Tuple

import torch

from amvim_mm.errors import ConfigError


@contextlib.contextmanager
def recording(backbone) -> Iterator[List[Tuple[torch.Tensor, torch.Tensor]]]:
    """Record every step of ``backbone``'s reducer as ``(removed_pos, dst_pos)`` (B, k) CPU
    tensors of grid positions, in call order."""
    reducer = backbone.token_reducer
    if reducer is None:
        raise ConfigError('recording needs a reducer switched on')
    log: List[Tuple[torch.Tensor, torch.Tensor]] = []
    original = reducer.step

    def step(block, k, stream, ctx, layer, route):
        sel = original(block, k, stream, ctx, layer, route)
        pos = ctx.pos if ctx.pos.dim() == 2 else ctx.pos.expand(sel.removed.shape[0], -1)
        rem = torch.gather(pos, 1, sel.removed)
        dst = torch.where(sel.dst >= 0, torch.gather(pos, 1, sel.dst.clamp_min(0)),
                          torch.full_like(sel.dst, -1))
        log.append((rem.cpu(), dst.cpu()))
        return sel
    reducer.step = step
    try:
        yield log
    finally:
        del reducer.step


def agreement(a: Sequence[Tuple[torch.Tensor, torch.Tensor]],
              b: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> Dict[str, float]:
    """Share of edges chosen in both runs, and share of images x steps with identical
    choices; ``a`` and ``b`` are :func:`recording` logs of the same data in the same order."""
    if len(a) != len(b):
        raise ValueError(f'the runs made {len(a)} and {len(b)} steps')
    same = total = same_steps = steps = 0
    for (ra, da), (rb, db) in zip(a, b):
        if ra.shape != rb.shape:
            raise ValueError(f'step shapes differ: {tuple(ra.shape)} vs {tuple(rb.shape)}')
        for i in range(ra.shape[0]):
            ea = set(zip(ra[i].tolist(), da[i].tolist()))
            eb = set(zip(rb[i].tolist(), db[i].tolist()))
            same += len(ea & eb)
            total += len(ea)
            same_steps += ea == eb
            steps += 1
    return dict(edge_agreement=same / max(total, 1), step_agreement=same_steps / max(steps, 1),
                edges=total, steps=steps)


def compare_precisions(runner, backbone, reduction: dict, metric_key: str,
                       precisions: Sequence[str] = ('fp32', 'bf16')) -> List[Dict[str, object]]:
    """Run the test set once per precision with ``reduction`` on; rows with the metric, its
    difference from the first precision's and the decision agreement with it."""
    rows, first = [], None
    loop = runner.test_loop
    if not hasattr(loop, 'precision'):
        raise ConfigError('the runner needs test_cfg=dict(type="AmpTestLoop")')
    for p in precisions:
        loop.precision = p
        backbone.set_token_reduction(reduction)
        try:
            with recording(backbone) as log:
                metric = float(runner.test()[metric_key])
        finally:
            backbone.set_token_reduction(None)
        row = dict(precision=p, metric=metric, reduction=reduction)
        if first is None:
            first = (metric, log)
        else:
            row.update(delta=round(metric - first[0], 4), **agreement(first[1], log))
        rows.append(row)
    return rows
