"""The rows of one run of the dense suite (:class:`Case`) in the order they run."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

from .config import GRAPH_IMPLS, TOME_RATIOS, TOP_KEEP_RATE, TRAINING, DenseSizes


@dataclasses.dataclass
class Case:
    """One row: a workload at one size, one model, one implementation, one reduction."""

    workload: str
    model: str            # 'vim', 'amvim' or 'peer'
    impl: str             # 'auto', 'unfused', 'forced' or 'peer'
    res: int
    batch: int
    reduction: Optional[dict] = None
    reduction_name: str = 'none'
    mode: str = 'eager'   # 'eager' or 'graph' (inference rows only)


def model_name(model: str, sizes: DenseSizes) -> str:
    if model == 'peer':
        return 'deit-t (mmseg ViT)' if sizes.arch == 'tiny' else 'vit-test (mmseg ViT)'
    return f'{model}-t' if sizes.arch == 'tiny' else f'{model}-{sizes.arch}'


def plan_cases(sizes: DenseSizes, workloads: Sequence[str], depth: int,
               forced: bool = True, infer_modes: Sequence[str] = ('eager', )) -> List[Case]:
    """Every row, unreduced rows of all workloads first, then the reduction rows; every
    inference row once per mode of ``infer_modes``."""
    from amvim_mm.models.reduction import ReductionSchedule
    top = dict(type='ToP', keep_rate=TOP_KEEP_RATE,
               locations=tuple(ReductionSchedule.importance_locations(depth)))
    top_name = f'ToP keep {TOP_KEEP_RATE} after {top["locations"]}'
    settings = {
        'ade-train': [(sizes.ade_crop, sizes.ade_train_batch)],
        'ade-slide': [(sizes.ade_crop, b) for b in sizes.slide_batches],
        'ade-whole': list(sizes.whole),
        'ade-backbone': list(dict.fromkeys(
            [(sizes.ade_crop, b) for b in sizes.slide_batches] + list(sizes.whole))),
        'coco': [(sizes.coco_res, sizes.coco_batch)],
        'in1k': [(sizes.in1k_res, sizes.in1k_batch)],
    }
    unreduced, reduced = [], []
    for w in workloads:
        train = w in TRAINING
        impls = ['auto', 'unfused'] + ([] if train or not forced else ['forced'])
        reductions = [(top, top_name)] if train else [
            (dict(type='ToMe', ratio=r), f'ToMe {r}') for r in TOME_RATIOS]
        for mode in (['eager'] if train else infer_modes):
            graphs = [] if train or mode != 'eager' else list(GRAPH_IMPLS)
            for res, batch in settings[w]:
                for model in ('vim', 'amvim', 'peer'):
                    for impl in (['peer'] if model == 'peer' else impls + graphs):
                        unreduced.append(Case(w, model, impl, res, batch, mode=mode))
                        if model != 'peer':
                            reduced += [Case(w, model, impl, res, batch, red, name, mode)
                                        for red, name in reductions]
    return unreduced + reduced
