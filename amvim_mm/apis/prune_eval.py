"""Training-free token-reduction sweeps: metric vs reduction ratio for several models.

For every model (config + checkpoint) and every method and ratio, the backbone's reducer is
switched on (AMVim protocol), the config's test loop runs through the library's own metric
(mIoU / COCO AP / Top-1), and the result is stored with the analytic GFLOPs and the realised
ratio. Results are written to ``results.json`` after every run (atomically), so an interrupted
sweep keeps what it finished and a second call resumes where it stopped.
"""
from __future__ import annotations

import json
import os
import os.path as osp
import time
from typing import Dict, List, Optional, Sequence, Tuple

METHODS = {'tome': 'ToMe', 'random': 'RandomPrune'}
PRIMARY_METRICS = {'mmseg': 'mIoU', 'mmdet': 'coco/bbox_mAP', 'mmpretrain': 'accuracy/top1'}


def model_name(config: str) -> str:
    """A short display name from a config file name (``amvim-t_pyramid_...`` -> ``amvim-t``)."""
    return osp.splitext(osp.basename(config))[0].split('_')[0]


def _write_json(path: str, data) -> None:
    from amvim_mm.engine.fileio import atomic_write_bytes
    atomic_write_bytes(json.dumps(data, indent=2).encode(), path)


def load_results(path: str) -> Dict[str, object]:
    if not osp.isfile(path):
        return dict(results=[])
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f'{path} is not valid JSON ({e}); move it away or pick another '
                             '--out-dir') from None
    if not isinstance(data, dict) or 'results' not in data:
        raise ValueError(f'{path} is not a results file of prune_eval (no "results" list); '
                         'move it away or pick another --out-dir')
    return data


def _key(r: dict) -> Tuple[str, str, float]:
    return (r['model'], r['method'], round(float(r['ratio']), 6))


def validate(models: Sequence[Tuple[str, str]], methods: Sequence[str],
             ratios: Sequence[float]) -> None:
    if not models:
        raise ValueError('give at least one CONFIG CHECKPOINT pair')
    for cfg, ckpt in models:
        if not osp.isfile(cfg):
            raise FileNotFoundError(f'config file not found: {cfg}')
        if not osp.isfile(ckpt):
            raise FileNotFoundError(f'checkpoint not found: {ckpt}')
    for m in methods:
        if m not in METHODS:
            raise ValueError(f'unknown method {m!r}; choose from {", ".join(METHODS)}')
    for r in ratios:
        if not 0 <= r < 1:
            raise ValueError(f'ratio {r} is outside [0, 1)')
    names = [model_name(c) for c, _ in models]
    if len(set(names)) != len(names):
        raise ValueError(f'two models share the name {names}; give --names')


def run_sweep(models: Sequence[Tuple[str, str]], methods: Sequence[str],
              ratios: Sequence[float], out_dir: str, names: Optional[Sequence[str]] = None,
              cfg_options: Optional[dict] = None, verbose: bool = False,
              progress: bool = True) -> Dict[str, object]:
    """Run (or resume) a sweep; returns the results dict also written to ``results.json``."""
    import torch
    from tqdm import tqdm

    from amvim_mm.analysis.flops import CONVENTION, vim_family_flops
    from amvim_mm.apis.runner import load_config, load_model_weights, make_runner
    from amvim_mm.engine.hooks import find_reducible_backbone
    validate(models, methods, ratios)
    names = list(names) if names else [model_name(c) for c, _ in models]
    if len(names) != len(models):
        raise ValueError(f'{len(names)} names for {len(models)} models')
    os.makedirs(out_dir, exist_ok=True)
    path = osp.join(out_dir, 'results.json')
    data = load_results(path)
    done = {_key(r): r for r in data['results']}
    ratios = sorted(set(float(r) for r in ratios))
    todo = [(i, m, r) for i in range(len(models)) for m in methods for r in ratios
            if (names[i], m, round(r, 6)) not in done]
    data['meta'] = dict(convention=CONVENTION, protocol='training-free, AMVim protocol '
                        '(r tokens removed at the start of the even blocks)',
                        device='cuda' if torch.cuda.is_available() else 'cpu',
                        torch=torch.__version__)
    bar = tqdm(total=len(todo), desc='prune_eval', disable=not progress, unit='run')
    for i, (config, ckpt) in enumerate(models):
        mine = [(m, r) for j, m, r in todo if j == i]
        if not mine:
            continue
        cfg = load_config(config, cfg_options, work_dir=osp.join(out_dir, 'work', names[i]))
        if not verbose:
            cfg.log_level = 'ERROR'
            cfg.default_hooks.logger = dict(type='LoggerHook', interval=10**9)
        scope = cfg.default_scope
        metric_key = PRIMARY_METRICS[scope]
        runner = make_runner(cfg)
        load_model_weights(runner.model, ckpt, strict=True)
        backbone = find_reducible_backbone(runner.model)
        size = backbone.img_size
        for method, ratio in mine:
            bar.set_postfix_str(f'{names[i]} {method} {ratio}')
            zero = next((r for k, r in done.items()
                         if k[0] == names[i] and k[2] == 0.0), None)
            if ratio == 0.0 and zero is not None:
                rec = dict(zero, method=method)   # ratio 0 is no reduction: same for every method
            else:
                red = dict(type=METHODS[method], ratio=ratio) if ratio > 0 else None
                backbone.set_token_reduction(red)
                t0 = time.perf_counter()
                metrics = runner.test()
                dt = time.perf_counter() - t0
                backbone.set_token_reduction(None)
                if metric_key not in metrics:
                    raise KeyError(f'{config}: the test metrics {sorted(metrics)} have no '
                                   f'{metric_key!r}')
                n = len(runner.test_dataloader.dataset)
                flops = vim_family_flops(backbone, size, red)
                rec = dict(model=names[i], config=config, checkpoint=ckpt, method=method,
                           ratio=ratio, realised_ratio=round(flops['realised_ratio'], 4),
                           gflops=round(flops['gflops'], 4), metric_name=metric_key,
                           metric=float(metrics[metric_key]), final_tokens=flops['tokens'][-1],
                           seconds=round(dt, 2),
                           img_per_s=round(n / dt, 1) if torch.cuda.is_available() else None)
            done[_key(rec)] = rec
            data['results'] = sorted(done.values(), key=lambda r: (r['model'], r['method'],
                                                                   r['ratio']))
            _write_json(path, data)
            bar.update(1)
    bar.close()
    for r in data['results']:
        base = done.get((r['model'], r['method'], 0.0))
        r['drop'] = None if base is None else round(r['metric'] - base['metric'], 4)
    _write_json(path, data)
    return data


def markdown_table(data: Dict[str, object]) -> str:
    rows = data['results']
    gpu = any(r.get('img_per_s') for r in rows)
    head = ['model', 'method', 'ratio', 'realised', 'GFLOPs', 'metric', 'value', 'drop']
    if gpu:
        head.append('img/s')
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        cells = [r['model'], r['method'], f"{r['ratio']:.2f}", f"{r['realised_ratio']:.3f}",
                 f"{r['gflops']:.3f}", r['metric_name'], f"{r['metric']:.2f}",
                 '' if r.get('drop') is None else f"{r['drop']:+.2f}"]
        if gpu:
            cells.append('' if r.get('img_per_s') is None else f"{r['img_per_s']:.1f}")
        lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
    return '\n'.join(lines)


def plot(data: Dict[str, object], path: str) -> str:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in data['results']:
        series.setdefault((r['model'], r['method']), []).append(r)
    models = sorted({m for m, _ in series})
    colors = {m: plt.get_cmap('tab10')(i % 10) for i, m in enumerate(models)}
    styles = {'tome': '-', 'random': '--'}
    for (model, method), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r['ratio'])
        ax.plot([r['ratio'] for r in rs], [r['metric'] for r in rs], color=colors[model],
                marker='o' if method == 'tome' else 's', linestyle=styles.get(method, ':'),
                label=f'{model} / {method}')
    name = data['results'][0]['metric_name'] if data['results'] else 'metric'
    ax.set_xlabel('token reduction ratio (training-free)')
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
