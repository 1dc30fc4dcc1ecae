"""Throughput, latency and peak memory of Vim-family models (see ``tools/benchmark.py``).

Measurement: warm up, then time many iterations with CUDA
events (or ``perf_counter`` after a synchronize on the CPU), report the median of several
repeats and their spread; record the device, torch/CUDA versions, dtype, batch, resolution and
scan backend. ``mode='graph'`` captures the whole forward pass in a CUDA graph and times its
replays (static shapes: fine for inference at a fixed batch and resolution).
"""
from __future__ import annotations

import platform
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError, LookupConfigError

# measured anchors of the official code (one H200, PyTorch 2.11 + CUDA 13.0, 2026-11-29),
# inference, 224x224, batch 128, images/s (official code, one H200; benchmarks/README.md)
OFFICIAL_ANCHORS = {
    ('vim-t', 'fp32'): 3599, ('vim-t', 'bf16'): 4377, ('vim-t', 'fp16'): 3473,
    ('vim-s', 'fp32'): 1625, ('vim-s', 'bf16'): 2318, ('vim-s', 'fp16'): 2324,
}
OFFICIAL_RESOLUTION_BF16 = {('vim-t', 448): 1294, ('vim-t', 768): 330, ('vim-t', 1024): 210}

MODELS = {
    'vim-t': dict(type='Vim', arch='tiny'),
    'vim-s': dict(type='Vim', arch='small'),
    'vim-b': dict(type='Vim', arch='base'),
    'amvim-t': dict(type='AMVim', arch='tiny'),
    'amvim-s': dict(type='AMVim', arch='small'),
    'localvim-t': dict(type='LocalVim', arch='tiny'),
    'vim-test': dict(type='Vim', arch='test'),
    'amvim-test': dict(type='AMVim', arch='test'),
    # VMamba: the classifier input (the official classifier norm + average pool)
    'vmamba-t': dict(type='VMamba', arch='tiny', out_type='avg_featmap', out_indices=(3, )),
    'vmamba-test': dict(type='VMamba', arch='test', out_type='avg_featmap', out_indices=(3, )),
    # PlainMamba: the official classifier input (ln1 + mean over tokens)
    'plainmamba-l1': dict(type='PlainMamba', arch='l1', out_type='avg_featmap'),
    'plainmamba-l3': dict(type='PlainMamba', arch='l3', out_type='avg_featmap'),
    # ViL: the mean of the last block's normed tokens (a (B, D) input for the linear head)
    'vil-t': dict(type='ViL', arch='tiny', out_type='avg_featmap'),
    'vil-test': dict(type='ViL', arch='test', out_type='avg_featmap'),
}


class Classifier(nn.Module):
    """Backbone + linear head: the whole ImageNet model, as the official code benchmarks it."""

    def __init__(self, backbone: nn.Module, num_classes: int = 1000) -> None:
        super().__init__()
        self.backbone = backbone
        # the last stage's width of a hierarchical backbone (VMamba), else the embedding width
        width = backbone.dims[-1] if hasattr(backbone, 'dims') else backbone.embed_dims
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x)[-1])


def build(name: str, img_size: int = 224, head: bool = True,
          token_reduction: Optional[dict] = None, scan_backend: Optional[str] = None,
          device: str = 'cuda', fused_mixer: Optional[bool] = None) -> nn.Module:
    """A benchmark model; ``fused_mixer`` as in :class:`~amvim_mm.models.backbones.Vim`
    (``None``: the automatic choice, the fused Triton mixer for CUDA inference; VMamba has
    none)."""
    from amvim_mm.registry import MODELS as REG
    if name not in MODELS:
        raise LookupConfigError(f'unknown model {name!r}; choose from {", ".join(MODELS)}')
    cfg = dict(MODELS[name], img_size=img_size)
    if scan_backend is not None:     # ViL has no selective scan
        cfg['scan_backend'] = scan_backend
    if token_reduction is not None:
        cfg['token_reduction'] = token_reduction
    cfg.setdefault('out_type', 'cls_token')
    if fused_mixer is not None:
        if cfg['type'] == 'VMamba':
            raise ConfigError('VMamba has no fused mixer; leave fused_mixer at None')
        cfg['fused_mixer'] = fused_mixer
    backbone = REG.build(cfg)
    model = Classifier(backbone) if head else backbone
    return model.to(device).eval()


def capture_cuda_graph(fn: Callable, warmup: int = 3):
    """Run ``fn`` ``warmup`` times on a side stream, then capture one call in a CUDA graph.

    Returns ``(graph, out)``: ``graph.replay()`` re-runs the captured work and refreshes
    ``out``, the captured call's (static) output.
    """
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def eager_and_replayed(fn: Callable):
    """Run ``fn`` eagerly, then capture it in a CUDA graph and replay it once; returns
    ``(eager output (a copy), replayed output)``, to check that a forward survives capture."""
    ref = fn().clone()
    graph, out = capture_cuda_graph(fn, warmup=1)
    graph.replay()
    torch.cuda.synchronize()
    return ref, out


def _timer(fn: Callable, iters: int, device: str) -> float:
    """Seconds per call of ``fn`` over ``iters`` calls."""
    if device == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / iters
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def speedup_ceiling(t_whole: float, t_backbone: float, flops_ratio: float) -> Optional[float]:
    """The whole model's speed-up if its backbone's time (``t_backbone`` of the unreduced
    model's ``t_whole``, any unit) fell exactly with its FLOPs (``flops_ratio``: reduced /
    unreduced), the rest unchanged; None where that leaves no time."""
    t = t_whole - t_backbone * (1 - flops_ratio)
    return t_whole / t if t > 0 else None


def _timings(fn: Callable, device: str, warmup: int, iters: int, repeats: int
             ) -> Tuple[float, List[float]]:
    """``warmup`` untimed calls, then ``repeats`` timings of ``iters`` calls each: (the median
    seconds per call, the timings)."""
    for _ in range(warmup):
        fn()
    if device == 'cuda':
        torch.cuda.synchronize()
    times = [_timer(fn, iters, device) for _ in range(repeats)]
    return statistics.median(times), times


@torch.no_grad()
def measure_call(fn: Callable, images: int, device: str, warmup: int = 2, iters: int = 5,
                 repeats: int = 5) -> Dict[str, object]:
    """Images/s of ``fn`` (a call that processes ``images`` images: a library's test step),
    the median of ``repeats`` timings of ``iters`` calls each, and their spread."""
    med, times = _timings(fn, device, warmup, iters, repeats)
    return dict(images=images, img_per_s=round(images / med, 1),
                spread_pct=round(100 * (max(times) - min(times)) / med, 1))


@torch.no_grad()
def measure(model: nn.Module, batch: int, res: int, dtype: str = 'fp32', mode: str = 'eager',
            warmup: int = 5, iters: int = 20, repeats: int = 5) -> Dict[str, object]:
    """Images/s (median of ``repeats``), latency and peak memory of one forward pass."""
    device = next(model.parameters()).device.type
    x = torch.randn(batch, 3, res, res, device=device)
    amp = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}[dtype]

    def fwd():
        if amp is None:
            return model(x)
        with torch.autocast(device, dtype=amp):
            return model(x)

    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    fn = fwd
    if mode == 'graph':
        if device != 'cuda':
            raise RuntimeError('mode="graph" needs CUDA')
        graph, _ = capture_cuda_graph(fwd, warmup=3)
        fn = graph.replay
    elif mode != 'eager':
        raise ConfigError(f'mode must be eager or graph, got {mode!r}')
    med, times = _timings(fn, device, warmup, iters, repeats)
    out = dict(batch=batch, res=res, dtype=dtype, mode=mode, img_per_s=round(batch / med, 1),
               latency_ms=round(med * 1000, 3),
               spread_pct=round(100 * (max(times) - min(times)) / med, 2))
    if device == 'cuda':
        out['peak_mem_mib'] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def measure_train(model: nn.Module, batch: int, res: int, dtype: str = 'bf16',
                  warmup: int = 3, iters: int = 10, repeats: int = 3,
                  num_classes: int = 1000) -> Dict[str, object]:
    """Training images/s of ``model`` (a classifier): forward, cross-entropy, backward (no
    optimizer step, gradients reset between steps), eager, under autocast to ``dtype``."""
    device = next(model.parameters()).device.type
    x = torch.randn(batch, 3, res, res, device=device)
    y = torch.randint(0, num_classes, (batch, ), device=device)
    amp = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}[dtype]
    model.train()

    def step():
        with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        for p in model.parameters():
            p.grad = None

    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    try:
        for _ in range(warmup):
            step()
        times = [_timer(step, iters, device) for _ in range(repeats)]
    finally:
        model.eval()
    med = statistics.median(times)
    out = dict(batch=batch, res=res, dtype=dtype, mode='train-eager',
               img_per_s=round(batch / med, 1), latency_ms=round(med * 1000, 3),
               spread_pct=round(100 * (max(times) - min(times)) / med, 2))
    if device == 'cuda':
        out['peak_mem_mib'] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def environment() -> Dict[str, object]:
    from amvim_mm.ops.backends import mamba_selective_scan
    env = dict(torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
               mamba_ssm='usable' if mamba_selective_scan()[0] is not None else 'absent',
               cpu=platform.processor() or platform.machine(),
               threads=torch.get_num_threads())
    if torch.cuda.is_available():
        env['gpu'] = torch.cuda.get_device_name(0)
        env['gpus'] = torch.cuda.device_count()
    return env


def table(rows: List[Dict[str, object]], cols: List[str]) -> str:
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for r in rows:
        lines.append('| ' + ' | '.join('' if r.get(c) is None else str(r.get(c))
                                       for c in cols) + ' |')
    return '\n'.join(lines)


def scan_choice_table(rows: List[Dict[str, object]], variants: List[str]
                      ) -> Dict[Tuple[int, int], Dict[int, str]]:
    """The fastest scan per shape, as :data:`amvim_mm.ops.scan_choice.SCAN_CHOICE_TABLE` holds
    it: ``{(E, L): {batch: variant}}`` from timing rows with keys ``E``, ``L``, ``batch`` and
    one microsecond time (or None: not measured) per name in ``variants`` ('seq', 'chunkT',
    'mamba'). Ties go to the earlier variant; shapes with no time are left out."""
    table: Dict[Tuple[int, int], Dict[int, str]] = {}
    for r in rows:
        timed = [(r[v], i, v) for i, v in enumerate(variants)
                 if isinstance(r.get(v), (int, float))]
        if timed:
            table.setdefault((int(r['E']), int(r['L'])), {})[int(r['batch'])] = min(timed)[2]
    return table


def format_scan_choice_table(table: Dict[Tuple[int, int], Dict[int, str]],
                             name: str = 'SCAN_CHOICE_TABLE', width: int = 100) -> str:
    """``table`` as a Python literal ready to paste into ``amvim_mm/ops/scan_choice.py``
    (sorted keys, lines of at most ``width`` characters)."""
    lines = [f'{name}: Dict[Tuple[int, int], Dict[int, str]] = {{']
    for (E, L), row in sorted(table.items()):
        head = f'    ({E}, {L}): {{'
        items = [f'{b}: {row[b]!r}' for b in sorted(row)]
        line = head
        for k, item in enumerate(items):
            piece = item + (', ' if k + 1 < len(items) else '},')
            if len(line) + len(piece.rstrip()) > width and line != head:
                lines.append(line.rstrip())
                line = ' ' * len(head)
            line += piece
        lines.append(line if items else head + '},')
    lines.append('}')
    return '\n'.join(lines)
