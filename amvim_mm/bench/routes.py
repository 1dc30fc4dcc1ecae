"""Which kernel a forward runs on this machine, and why: the execution plans
(:meth:`~amvim_mm.models.execution.ExecutionPlan.describe`) of a reduced Vim-T and of one
reduced forward of every other family (small archs), for ``tools/check_env.py --routes``.
"""
from __future__ import annotations

from typing import List

__all__ = ['route_report']

#: the other families' reports: (type, its build arguments, image size)
FAMILIES = (('VMamba', dict(arch='tiny'), 224), ('PlainMamba', dict(arch='L1'), 224),
            ('ViL', dict(arch='tiny'), 224))


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


def _merge_steps(lines: List[str]) -> List[str]:
    """``step before block i: ...`` lines with the same routes as one line naming the blocks."""
    out: List[str] = []
    for line in lines:
        head, _, text = line.partition(': ')
        last = out[-1].partition(': ') if out else ('', '', '')
        if head.startswith('step before block ') and last[0].startswith('step') \
                and last[2] == text:
            blocks = last[0].split(' ', 3)[3] + ', ' + head.rsplit(' ', 1)[-1]
            out[-1] = f'steps before blocks {blocks}: {text}'
        else:
            out.append(line)
    return out


def _plan_lines(model, device: str, size: int) -> List[str]:
    import torch
    model = model.to(device).eval()
    x = torch.zeros(1, 3, size, size, device=device)
    with torch.no_grad():
        plan = model.execution_plan(x)
    return ['  ' + ln for ln in _merge_steps(_merge_blocks(plan.describe().splitlines()))]


def route_report(device: str, ratio: float = 0.27, size: int = 224) -> List[str]:
    """The plan of one inference forward of Vim-T with ToMe at ``ratio`` on ``device`` (one
    line per part, equal blocks merged), then those of VMamba-T, PlainMamba-L1 and ViL-T."""
    from amvim_mm.registry import MODELS
    red = dict(type='ToMe', ratio=ratio)
    lines = [f'Vim-T, ToMe {ratio:g}, {size}x{size}, batch 1, {device} inference:']
    lines += _plan_lines(MODELS.build(dict(type='Vim', arch='tiny', img_size=size,
                                           out_type='cls_token', token_reduction=red)),
                         device, size)
    for name, kw, s in FAMILIES:
        lines.append(f'{name} ({kw["arch"]}), ToMe {ratio:g}, {s}x{s}, batch 1, {device} '
                     'inference:')
        lines += _plan_lines(MODELS.build(dict(type=name, img_size=s, token_reduction=red,
                                               **kw)), device, s)
    return lines
