"""Every family through ONNX Runtime next to our PyTorch CPU path and DeiT-T, in one run
(``python tools/deploy/benchmark_onnx.py --models vim-t vmamba-t plainmamba-l1 vil-t deit-t``).

Each model (random weights, the ImageNet classifier: :func:`amvim_mm.bench.measure.build`'s
backbone + linear head; ``deit-t`` is timm's ``deit_tiny_patch16_224``) is exported at the
image size with a fixed batch (:func:`amvim_mm.deploy.export.export_onnx`, the TorchScript
exporter, opset 17), checked once against PyTorch in ONNX Runtime (``max_rel_err``), then timed:
``rounds`` interleaved rounds, each timing ``iters`` calls of every model in ONNX Runtime and
in PyTorch (``torch.inference_mode``, the runtime's default CPU path: the compiled kernels where
built), on the same threads (``threads``: ONNX Runtime's intra-op pool, not spinning between
calls so that it leaves the cores to the PyTorch calls that follow, and
``torch.set_num_threads``). Medians over rounds; ratios: ONNX Runtime over PyTorch for the same
model, and each side over DeiT-T's same side. ``--tome R`` adds each of our models with ToMe at
ratio R (same weights): its export's speed-up over the unreduced export and that over its FLOPs
ratio (``ort_speedup_over_flops``).
"""
from __future__ import annotations

import os.path as osp
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from amvim_mm.errors import ConfigError

#: the models besides :data:`amvim_mm.bench.measure.MODELS`: timm's DeiT-T (the reference)
DEIT = {'deit-t': 'deit_tiny_patch16_224'}


def build_model(name: str, res: int, tome: Optional[float] = None) -> torch.nn.Module:
    """The classifier ``name`` at ``res`` on the CPU, eval mode; ``tome``: with ToMe at that
    ratio (our models only)."""
    from amvim_mm.bench import measure
    if name in DEIT:
        import timm
        return timm.create_model(DEIT[name], pretrained=False, img_size=res).eval()
    if name not in measure.MODELS:
        raise ConfigError(f'unknown model {name!r}; choose from '
                          f'{", ".join(list(measure.MODELS) + list(DEIT))}')
    red = None if tome is None else dict(type='ToMe', ratio=tome)
    return measure.build(name, res, head=True, token_reduction=red, device='cpu').eval()


def _flops_ratio(dense: torch.nn.Module, reduced: torch.nn.Module, res: int) -> float:
    """GFLOPs of ``dense``'s backbone over ``reduced``'s (the project's convention)."""
    from amvim_mm.analysis.flops import backbone_flops
    return backbone_flops(dense.backbone, res, None)['gflops'] / backbone_flops(
        reduced.backbone, res, 'model')['gflops']


def _variants(models: Sequence[str], res: int, tome: Optional[float]):
    """(row name, model, extra row fields) of every model, and with ``tome`` each of ours
    again with ToMe at that ratio (its FLOPs ratio and its unreduced row's name)."""
    out = []
    for name in dict.fromkeys(models):
        model = build_model(name, res)
        out.append((name, model, dict(model=name, reduction='none')))
        if tome is not None and name not in DEIT:
            reduced = build_model(name, res, tome)
            reduced.load_state_dict(model.state_dict())
            out.append((f'{name} ToMe {tome:g}', reduced, dict(
                model=name, reduction=f'ToMe {tome:g}',
                flops_ratio=round(_flops_ratio(model, reduced, res), 3))))
    return out


def run_families(models: Sequence[str], out_dir: str, res: int = 224, batch: int = 1,
                 rounds: int = 5, iters: int = 3, threads: Optional[int] = None,
                 tome: Optional[float] = None,
                 log: Callable[[str], None] = print) -> List[Dict[str, object]]:
    """Export, check and time ``models`` (see the module docstring); one row per model and,
    with ``tome``, one more per model of ours with ToMe at that ratio, carrying its export's
    speed-up over the unreduced export (``ort_speedup``) against its FLOPs ratio."""
    from amvim_mm.bench.measure import _timer
    from .export import export_onnx
    from .ort import compare_onnx, ort_session, run_onnx
    if rounds < 1 or iters < 1 or batch < 1 or res < 16:
        raise ConfigError('--rounds, --iters and --batch must be positive, --res at least 16')
    if threads is not None:
        torch.set_num_threads(threads)
    threads = threads or torch.get_num_threads()
    x = torch.randn(batch, 3, res, res, generator=torch.Generator().manual_seed(0))
    arr = x.numpy()
    if tome is not None and not 0 < tome < 1:
        raise ConfigError(f'--tome takes a ratio between 0 and 1, got {tome:g}')
    entries = []
    for name, model, fields in _variants(models, res, tome):
        path = osp.join(out_dir, f'{name.replace(" ", "_")}_{res}_b{batch}.onnx')
        t0 = time.perf_counter()
        export_onnx(model, path, (x, ), opset=17, dynamic_batch=False)
        session = ort_session(path, threads, spin=False)
        err = max(r['max_rel_err'] for r in compare_onnx(model, path, [x], session).values())
        import onnx
        nodes = len(onnx.load(path, load_external_data=False).graph.node)
        log(f'  {name}: exported in {time.perf_counter() - t0:.0f} s ({nodes} nodes, max '
            f'relative error {err:.1e})')
        entries.append((name, model, session, dict(fields, onnx_nodes=nodes,
                                                     max_rel_err=float(f'{err:.2e}'))))
    with torch.inference_mode():
        sides = lambda model, session: {  # noqa: E731
            'onnxruntime': lambda: run_onnx(session, arr), 'pytorch': lambda: model(x)}
        for _, model, session, _ in entries:              # warm-up
            for fn in sides(model, session).values():
                fn()
        times = {name: {'onnxruntime': [], 'pytorch': []} for name, *_ in entries}
        for r in range(rounds):
            for name, model, session, _ in entries:
                for side, fn in sides(model, session).items():
                    times[name][side].append(_timer(fn, iters, 'cpu'))
            log(f'  round {r + 1}/{rounds}: ' + ', '.join(
                f'{n} {1e3 * t["onnxruntime"][-1]:.0f} / {1e3 * t["pytorch"][-1]:.0f} ms'
                for n, t in times.items()))
    rows = []
    for name, _, _, row in entries:
        # ratios of the reported (rounded) medians, so that the table divides as printed
        ort_ms = round(1e3 * statistics.median(times[name]['onnxruntime']), 2)
        pt_ms = round(1e3 * statistics.median(times[name]['pytorch']), 2)
        rows.append(dict(row, res=res, batch=batch, threads=threads, onnxruntime_ms=ort_ms,
                         pytorch_ms=pt_ms, ort_over_pytorch=round(ort_ms / pt_ms, 2)))
    deit = next((r for r in rows if r['model'] in DEIT), None)
    plain = {r['model']: r for r in rows if r['reduction'] == 'none'}
    for r in rows:
        if r['reduction'] != 'none':
            r['ort_speedup'] = round(plain[r['model']]['onnxruntime_ms'] / r['onnxruntime_ms'], 3)
            r['ort_speedup_over_flops'] = round(r['ort_speedup'] / r['flops_ratio'], 3)
        if deit is not None:
            r['ort_over_deit_ort'] = round(r['onnxruntime_ms'] / deit['onnxruntime_ms'], 2)
            r['pytorch_over_deit_pytorch'] = round(r['pytorch_ms'] / deit['pytorch_ms'], 2)
    return rows


COLUMNS = ['model', 'reduction', 'onnxruntime_ms', 'pytorch_ms', 'ort_over_pytorch',
           'ort_over_deit_ort', 'pytorch_over_deit_pytorch', 'flops_ratio', 'ort_speedup',
           'ort_speedup_over_flops', 'max_rel_err', 'onnx_nodes']
