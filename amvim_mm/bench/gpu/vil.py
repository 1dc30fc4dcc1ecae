"""The GPU suite's ViL part: ViL-T beside the official code (``--official-vil``), same weights,
batch 128, 224, and the mLSTM cell's forms at ViL-T's shape."""
from __future__ import annotations

import torch
from torch import nn

from amvim_mm import runtime
from amvim_mm.ops import mlstm as ML

from .. import measure as B
from .. import official_vil as OVIL
from .common import attempt, graph_us, log


class _NoGraphs(nn.Module):
    """``model`` with the backbones' own CUDA graphs off (pure eager, like for like with the
    official eager code)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        with runtime.override(cuda_graph=False):
            return self.model(x)


def _cell_rows(batch: int = 128, heads: int = 4, length: int = 196, dh: int = 96):
    """Microseconds per call of each mLSTM form at ViL-T's shape (bf16 inputs, graph replays)."""
    g = torch.Generator(device='cuda').manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, dh, device='cuda', generator=g,
                           dtype=torch.bfloat16) for _ in range(3))
    i, f = (torch.randn(batch, heads, length, 1, device='cuda', generator=g) * 2 + 2
            for _ in range(2))
    forms = [('parallel', ML.mlstm_parallel), ('chunkwise', ML.mlstm_chunkwise),
             ('fused', ML.mlstm_triton), ('dispatch', ML.mlstm)]
    rows = []
    ref = ML.mlstm_parallel(q.float(), k.float(), v.float(), i, f)
    with torch.no_grad():
        for name, fn in forms:
            out = fn(q, k, v, i, f).float()
            err = float((out - ref).abs().max() / ref.abs().max())
            r = attempt(lambda: dict(us=graph_us(lambda: fn(q, k, v, i, f))))
            r.update(model='mlstm-cell', impl=name, shape=f'{batch}x{heads}x{length}x{dh}',
                     dtype='bf16', max_rel_err_vs_fp32=float(f'{err:.3g}'))
            log(f'  mLSTM {name}: {r.get("us")} us, rel err {err:.3g} {r.get("error", "")}')
            rows.append(r)
    return rows


def gpu_vil(args):
    """ViL-T whole classifiers, ours and (``--official-vil``) the official ``VisionLSTM2``,
    batch 128, 224, fp32 / bf16 in three modes: ``graph`` (both replayed from one CUDA graph),
    ``default`` (ours as a user calls it, the official code eager) and ``eager`` (ours with its
    graphs off, the official code eager); ``vs_official_run`` = ours / official in that mode."""
    rows = _cell_rows()
    if not args.official_vil:
        log('  (no --official-vil checkout: ViL rows skipped)')
        return rows
    torch.manual_seed(0)
    official, ours = OVIL.build_pair('tiny', args.official_vil)
    x = torch.randn(8, 3, 224, 224, device='cuda')
    diff = OVIL.max_rel_diff(official, ours, x)
    log(f'  ViL-T ours vs official: max relative logits difference {diff:.3g} (fp32, batch 8)')
    rows.append(dict(model='vil-t', check='max_rel_diff_fp32', value=float(f'{diff:.3g}')))
    impls = {'graph': (ours, 'graph'), 'default': (ours, 'eager'),
             'eager': (_NoGraphs(ours), 'eager')}
    for dtype in ('fp32', 'bf16'):
        for mode, (m, how) in impls.items():
            here = {}
            for impl, model in (('official', official), ('ours', m)):
                r = attempt(B.measure, model, 128, 224, dtype, how)
                r.update(model='vil-t', impl=impl, dtype=dtype, mode=mode)
                here[impl] = r
                log(f'  vil-t {dtype} {mode} {impl}: {r.get("img_per_s")} img/s, '
                    f'{r.get("peak_mem_mib")} MiB {r.get("error", "")}')
                torch.cuda.empty_cache()
            if here['official'].get('img_per_s') and here['ours'].get('img_per_s'):
                here['ours']['vs_official_run'] = round(
                    here['ours']['img_per_s'] / here['official']['img_per_s'], 3)
            rows += here.values()
    return rows
