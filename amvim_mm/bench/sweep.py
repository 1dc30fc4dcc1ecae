"""The sweep's own costs (``tools/benchmark_sweep.py``): cell by cell against one pass, and where a
cell's time goes, on an ADE20K-shaped synthetic validation set.

* :func:`make_ade_like`: ``images/validation/*.jpg`` and ``annotations/validation/*.png`` in
  ADE20K's layout (150 classes, label 0 ignored, mixed sizes >= 512), written once.
* :func:`random_checkpoint`: the config's segmentor with its own initialisation, saved (timing
  needs no trained weights; the sweep loads a checkpoint strictly).
* :func:`time_modes`: the real :func:`~amvim_mm.apis.sweep.run_sweep` on that data, cell by
  cell and in one pass, each into a fresh out-dir: wall seconds (= GPU-seconds on one GPU) per
  cell.
* :func:`breakdown`: one evaluation's batches split into data loading (waiting on the loader),
  preprocessing, the model's inference (slide or whole), its backbone (the same windows through
  the backbone alone) and post-processing (mmseg's and the label map), CUDA-synchronised.
"""
from __future__ import annotations

import copy
import os
import os.path as osp
import shutil
import time
from typing import Dict, Optional, Sequence, Tuple

#: image sizes (H, W) of the synthetic set: ADE20K's are mostly about 512 on the short side
SIZES = ((512, 512), (512, 683), (683, 512), (600, 800))


def make_ade_like(root: str, num: int = 200, sizes: Sequence[Tuple[int, int]] = SIZES,
                  classes: int = 150, seed: int = 0) -> str:
    """Write the synthetic ADE20K-layout validation set (and one training image, which the
    dataset class does not need but the layout has); kept when it is already complete."""
    import cv2
    import numpy as np
    img_dir = osp.join(root, 'images', 'validation')
    ann_dir = osp.join(root, 'annotations', 'validation')
    if osp.isdir(ann_dir) and len(os.listdir(ann_dir)) == num:
        return root
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (classes + 1, 3), dtype=np.uint8)
    for i in range(num):
        h, w = sizes[i % len(sizes)]
        blocks = rng.integers(0, classes + 1, (h // 64 + 1, w // 64 + 1), dtype=np.uint8)
        label = cv2.resize(blocks, (w, h), interpolation=cv2.INTER_NEAREST)
        img = palette[label] + rng.integers(0, 24, (h, w, 3), dtype=np.uint8)
        name = f'ADE_val_{i + 1:08d}'
        cv2.imwrite(osp.join(img_dir, name + '.jpg'), img)
        cv2.imwrite(osp.join(ann_dir, name + '.png'), label)
    return root


def _cfg_options(data_root: str) -> dict:
    return {f'{k}.dataset.data_root': data_root for k in ('val_dataloader', 'test_dataloader')}


def random_checkpoint(config: str, path: str) -> str:
    """The config's segmentor (no pretrained file) with its initialisation, saved at ``path``."""
    import torch
    from mmengine.registry import DefaultScope

    from amvim_mm.apis.runner import load_config
    from amvim_mm.registry import MODELS
    cfg = load_config(config)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(model_cfg)
    model.init_weights()
    torch.save({'state_dict': model.state_dict()}, path)
    return path


def time_modes(config: str, ckpt: str, data_root: str, out_dir: str,
               methods: Sequence[str] = ('tome', 'random', 'evit', 'top'),
               ratios: Sequence[float] = (0, 0.17, 0.27, 0.46), seeds: Sequence[int] = (0, 1, 2),
               modes: Sequence[str] = ('pass', 'cell'), warmup: int = 8) -> Dict[str, dict]:
    """Wall seconds of the same sweep cell by cell and in one pass (fresh out-dirs), after an
    untimed sweep of the first ``warmup`` images (0: none) so that neither mode pays the first
    run's kernel compilation."""
    from amvim_mm.apis.sweep import run_sweep
    out = {}
    cells = len(methods) * len([r for r in ratios if r > 0])
    if warmup:   # the kernels' compilation and tuning, paid before either mode is timed
        warm = dict(_cfg_options(data_root), **{f'{k}.dataset.indices': warmup
                                                for k in ('val_dataloader', 'test_dataloader')})
        run_sweep([(config, ckpt)], list(methods), list(ratios), osp.join(out_dir, 'warmup'),
                  names=['vim-t'], cfg_options=warm, seeds=list(seeds), replicates=40,
                  progress=False)
    for mode in modes:
        folder = osp.join(out_dir, f'sweep_{mode}')
        shutil.rmtree(folder, ignore_errors=True)
        _sync()
        t0 = time.perf_counter()
        data = run_sweep([(config, ckpt)], list(methods), list(ratios), folder,
                         names=['vim-t'], cfg_options=_cfg_options(data_root), seeds=list(seeds),
                         replicates=200, progress=False, one_pass=mode == 'pass')
        _sync()
        wall = time.perf_counter() - t0
        rows = data['results']
        out[mode] = dict(seconds=round(wall, 2), cells=cells, rows=len(rows),
                         seconds_per_cell=round(wall / cells, 3),
                         evaluations=1 + sum(len(seeds) if m == 'random' else 1
                                             for m in methods) * (len(ratios) - 1),
                         metrics={f"{r['method']} {r['ratio']}": r['metric'] for r in rows},
                         # the rows' own seconds: their test loops' (or their share of the
                         # pass's) forwards and metric updates; the rest of the wall time is
                         # building the runner, FLOPs, statistics and the final pass
                         row_seconds=round(sum(r.get('seconds') or 0 for r in rows), 2),
                         seconds_by_row={f"{r['method']} {r['ratio']}": r.get('seconds')
                                         for r in rows})
    if 'pass' in out and 'cell' in out:
        out['same_metrics'] = out['pass']['metrics'] == out['cell']['metrics']
        out['speedup_pass_over_cell'] = round(out['cell']['seconds'] / out['pass']['seconds'], 3)
    return out


def _sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def breakdown(config: str, ckpt: str, data_root: str, num_batches: Optional[int] = 100,
              reductions: Sequence[Optional[dict]] = (None, dict(type='ToMe', ratio=0.46))
              ) -> Dict[str, dict]:
    """Per reduction: seconds per batch of each stage (module docstring), medians."""
    import numpy as np
    import torch

    from amvim_mm.apis.runner import load_config, load_model_weights, make_runner
    from amvim_mm.engine.hooks import find_reducible_backbone
    from amvim_mm.models.segmentors.label_map_segmentor import label_map_postprocess
    cfg = load_config(config, _cfg_options(data_root), work_dir=osp.join(data_root, '..', 'w'))
    cfg.log_level = 'ERROR'
    runner = make_runner(cfg)
    load_model_weights(runner.model, ckpt, strict=True)
    model = runner.model.eval()
    backbone = find_reducible_backbone(model)
    loader = runner.build_dataloader(cfg.test_dataloader)
    out = {}
    for red in reductions:
        backbone.set_token_reduction(red)
        stages: Dict[str, list] = {k: [] for k in ('loading', 'preprocess', 'inference',
                                                   'backbone', 'postprocess_mmseg',
                                                   'postprocess_label_map')}
        with torch.no_grad():
            it = iter(loader)
            for i in range(min(num_batches or len(loader), len(loader))):
                t0 = time.perf_counter()
                batch = next(it)
                t1 = time.perf_counter()
                data = model.data_preprocessor(batch, False)
                _sync()
                t2 = time.perf_counter()
                samples = data['data_samples']
                metas = [s.metainfo for s in samples]
                logits = model.inference(data['inputs'], metas)
                _sync()
                t3 = time.perf_counter()
                model.postprocess_result(logits, [s.new() for s in samples])
                _sync()
                t4 = time.perf_counter()
                label_map_postprocess(model, logits, [s.new() for s in samples])
                _sync()
                t5 = time.perf_counter()
                for k, v in zip(('loading', 'preprocess', 'inference', 'postprocess_mmseg',
                                 'postprocess_label_map'),
                                (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                    stages[k].append(v)
                stages['backbone'].append(_backbone_seconds(model, data['inputs'], metas))
        key = 'none' if red is None else f"{red['type']} {red.get('ratio')}"
        out[key] = {k: round(float(np.median(v)) * 1e3, 3) for k, v in stages.items()}
        out[key]['unit'] = 'ms per batch (median)'
    backbone.set_token_reduction(None)
    return out


def _backbone_seconds(model, inputs, metas) -> float:
    """The backbone alone on the windows the config's inference feeds it (slide: each crop)."""
    tc = model.test_cfg
    crops = [inputs]
    if tc.get('mode') == 'slide':
        h_stride, w_stride = tc['stride']
        h_crop, w_crop = tc['crop_size']
        H, W = inputs.shape[2:]
        crops = []
        for hi in range(max(H - h_crop + h_stride - 1, 0) // h_stride + 1):
            for wi in range(max(W - w_crop + w_stride - 1, 0) // w_stride + 1):
                y1 = min(hi * h_stride, max(H - h_crop, 0))
                x1 = min(wi * w_stride, max(W - w_crop, 0))
                crops.append(inputs[:, :, y1:y1 + h_crop, x1:x1 + w_crop])
    _sync()
    t0 = time.perf_counter()
    for c in crops:
        model.backbone(c)
    _sync()
    return time.perf_counter() - t0
