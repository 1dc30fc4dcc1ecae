"""The rows of one run of the dense suite (:class:`Case`) in the order they run."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

from .config import (ADE_INFER_ONLY, GRAPH_IMPLS, MODELS, TOME_RATIOS, TOP_KEEP_RATE,
                     TRAINING, DenseSizes)

#: our backbones' patch size at every arch of the suite (the token grid of a row's image)
PATCH = 16


@dataclasses.dataclass
class Case:
    """One row: a workload at one size, one model, one implementation, one reduction."""

    workload: str
    model: str            # one of config.MODELS
    impl: str             # 'auto', 'unfused', 'forced' or 'peer'
    res: int
    batch: int
    reduction: Optional[dict] = None
    reduction_name: str = 'none'
    mode: str = 'eager'   # 'eager' or 'graph' (inference rows only)


def model_name(model: str, sizes: DenseSizes) -> str:
    if model == 'peer':
        return 'deit-t (mmseg ViT)' if sizes.arch == 'tiny' else 'vit-test (mmseg ViT)'
    arch = 't' if sizes.arch == 'tiny' else sizes.arch
    if model == 'vim-segmenter':
        return f'vim-{arch} segmenter-mask (tokens)'
    return f'{model}-{arch}'


def inference_reductions(pairs: Sequence[Tuple[str, float]], res: int, depth: int
                         ) -> List[Tuple[dict, str]]:
    """(reducer config, row name) of each (method, ratio) at a ``res`` image: prune_eval's
    mapping of a ratio to a reducer (importance methods prune after its default blocks at the
    keep rate that removes ``ratio`` of the tokens)."""
    from amvim_mm.apis.sweep.methods import METHODS, reduction_config
    out = []
    for method, ratio in pairs:
        cfg = reduction_config(method, ratio, (res // PATCH) ** 2, depth)
        out.append((cfg, f'{METHODS[method]} {ratio:g}'))
    return out


def plan_cases(sizes: DenseSizes, workloads: Sequence[str], depth: int,
               forced: bool = True, infer_modes: Sequence[str] = ('eager', ),
               models: Sequence[str] = MODELS[:3],
               reductions: Sequence[Tuple[str, float]] = tuple(
                   ('tome', r) for r in TOME_RATIOS)) -> List[Case]:
    """Every row, unreduced rows of all workloads first, then the reduction rows; every
    inference row once per mode of ``infer_modes``; the inference rows reduced by every
    (method, ratio) of ``reductions``, the training rows by ToP-ViM's protocol. Models of
    :data:`~.config.ADE_INFER_ONLY` get the ADE20K inference rows only."""
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
        for mode in (['eager'] if train else infer_modes):
            graphs = [] if train or mode != 'eager' else list(GRAPH_IMPLS)
            for res, batch in settings[w]:
                reds = [(top, top_name)] if train else inference_reductions(
                    reductions, res, depth)
                for model in models:
                    if model in ADE_INFER_ONLY and (train or not w.startswith('ade')):
                        continue
                    for impl in (['peer'] if model == 'peer' else impls + graphs):
                        unreduced.append(Case(w, model, impl, res, batch, mode=mode))
                        if model != 'peer':
                            reduced += [Case(w, model, impl, res, batch, red, name, mode)
                                        for red, name in reds]
    return unreduced + reduced
