"""Which kernel a forward runs on this machine, and why: the execution plan of a reduced Vim-T
(:meth:`~amvim_mm.models.execution.ExecutionPlan.describe`), for ``tools/check_env.py --routes``.

The plan covers the Vim family (Vim, AMVim, LocalVim); VMamba's cross-scan, PlainMamba's snake
and aligned scans and ViL's mLSTM cell choose their kernels per call in their ops, so for them
the report says so instead of naming a route.
"""
from __future__ import annotations

from typing import List

__all__ = ['route_report']

#: the families whose kernels are not in the execution plan yet
PER_CALL = ('VMamba', 'PlainMamba', 'ViL', 'AMViL')


def _merge_blocks(lines: List[str]) -> List[str]:
    """``block i: ...`` lines with the same routes as one ``blocks i-j: ...`` line."""
    out, run = [], None          # run: (first, last, text)
    for line in lines + ['']:
        if line.startswith('block '):
            i, text = line[len('block '):].split(': ', 1)
            if run is not None and run[2] == text and int(i) == run[1] + 1:
                run = (run[0], int(i), text)
                continue
        if run is not None:
            first, last, text = run
            name = f'block {first}' if first == last else f'blocks {first}-{last}'
            out.append(f'{name}: {text}')
            run = None
        if line.startswith('block '):
            i, text = line[len('block '):].split(': ', 1)
            run = (int(i), int(i), text)
        elif line:
            out.append(line)
    return out


def route_report(device: str, ratio: float = 0.27, size: int = 224) -> List[str]:
    """The plan of one inference forward of Vim-T with ToMe at ``ratio`` on ``device`` (one
    line per part, equal blocks merged), then a line for the families planned per call."""
    import torch

    from amvim_mm.registry import MODELS
    model = MODELS.build(dict(type='Vim', arch='tiny', img_size=size, out_type='cls_token',
                              token_reduction=dict(type='ToMe', ratio=ratio)))
    model = model.to(device).eval()
    x = torch.zeros(1, 3, size, size, device=device)
    with torch.no_grad():
        plan = model.execution_plan(x)
    head = f'Vim-T, ToMe {ratio:g}, {size}x{size}, batch 1, {device} inference:'
    tail = f'{", ".join(PER_CALL)}: their ops choose the kernels per call (not in the plan yet)'
    return [head] + ['  ' + ln for ln in _merge_blocks(plan.describe().splitlines())] + [tail]
