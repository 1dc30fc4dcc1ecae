"""The GPU suite's tuning parts: launch configurations of the fused scan (forward and
backward), ToMe's matching kernel and the one-kernel embedding, and the table of the automatic
scan choice (sequential / chunked fused scan / mamba-ssm per shape)."""
from __future__ import annotations

import math

import torch

from amvim_mm import runtime
from amvim_mm.models.execution import Choice

from .. import measure as B
from .common import attempt, graph_us, log


def gpu_tune(args):
    """Launch configuration of the fused scan kernel per inner width: bf16 graph throughput of
    Vim-T (E=384) and Vim-S (E=768) per (BLOCK_E, num_warps, dt_in_kernel); the best of each
    is used for the rest of the run (and goes into SCAN_CONFIGS by hand)."""
    from amvim_mm.ops import scan_choice as SC
    rows = []
    for name in ('vim-t', 'vim-s'):
        m = B.build(name, 224, head=True, fused_mixer=True)
        E = m.backbone.layers[0].mixer.d_inner
        mine = []
        for cfg in args.tune_configs:
            with runtime.override(scan_config=cfg):
                r = B.measure(m, 128, 224, 'bf16', 'graph', warmup=3, iters=10, repeats=3)
            r.update(model=name, E=E, config=cfg)
            mine.append(r)
            log(f'  {name} (E={E}) BLOCK_E,warps,dt_in_kernel={cfg}: {r["img_per_s"]} img/s')
        best = max(mine, key=lambda r: r['img_per_s'])
        be, w, dk = (int(v) for v in best['config'].split(','))
        SC.SCAN_CONFIGS[E] = (be, w, bool(dk))
        log(f'  {name}: using {SC.SCAN_CONFIGS[E]}')
        rows += mine
        del m
        torch.cuda.empty_cache()
    return rows


def gpu_tune_match(args):
    """Launch configuration of ToMe's matching kernel (BLOCK_D, num_warps, num_stages) on
    Vim-T's step shape (batch 128, 197 tokens, width 192, bf16 hidden + fp32 residual, 14
    edges, the merge plan made in the same launch as on the fused path); the best is used for
    the rest of the run (and goes into MATCH_CONFIG by hand); then the three dot-product
    precisions with it."""
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.state import init_reduction_state
    from amvim_mm.ops import token_merge as TM
    h = torch.randn(128, 197, 192, device='cuda').to(torch.bfloat16)
    r = torch.randn(128, 197, 192, device='cuda')
    w = torch.rand(192, device='cuda') + 0.5
    ctx = init_reduction_state(ScanContext((14, 14), cls_index=98), 128, 'cuda')
    state = (ctx.pos, ctx.size, ctx.source)
    rows, TM.MATCH_CONFIG = _tune_kernel(
        'tome_match', 'match_config', args.match_configs,
        lambda: TM.tome_match(h, r, w, 196, 98, 14, plan_state=state))
    log(f'  tome_match: using {TM.MATCH_CONFIG}')
    # the cost of fp32-accurate dot products (the default, 3xTF32: ToMe's decisions must not
    # depend on the autocast dtype) against plain fp32 FMAs and one tf32 product
    for prec in TM.DOT_PRECISIONS:
        us = graph_us(lambda: TM.tome_match(h, r, w, 196, 98, 14, precision=prec,
                                            plan_state=state))
        rows.append(dict(config=f'{TM.MATCH_CONFIG} dots {prec}', us_per_call=us))
        log(f'  tome_match, dot products {prec}: {us} us')
    return rows


def _tune_kernel(name, setting, configs, fn):
    """:func:`graph_us` of ``fn`` under each launch configuration of runtime ``setting``
    (:mod:`amvim_mm.runtime`). Returns (rows, the fastest configuration as a tuple)."""
    rows = []
    for cfg in configs:
        with runtime.override(**{setting: cfg}):
            us = graph_us(fn)
        rows.append(dict(config=cfg, us_per_call=us))
        log(f'  {name} {cfg}: {us} us')
    best = min(rows, key=lambda r: r['us_per_call'])['config']
    return rows, tuple(int(v) for v in best.split(','))


def gpu_tune_embed(args):
    """Launch configuration of the one-kernel embedding (BLOCK_M, BLOCK_N, num_warps,
    num_stages) on Vim-T's shape (batch 128, 224, bf16 autocast), next to the reference's five
    launches (unfold + cast copy, GEMM, class-token concatenation, position add); the best is
    used for the rest of the run (and goes into EMBED_CONFIG by hand)."""
    from amvim_mm.ops import fused_embed as FE
    m = B.build('vim-t', 224, head=False, fused_mixer=True)
    x = torch.randn(128, 3, 224, 224, device='cuda')

    def embed():
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
            return m.embed(x)[0]
    rows, FE.EMBED_CONFIG = _tune_kernel('embed', 'embed_config', args.embed_configs,
                                         embed)
    log(f'  embed: using {FE.EMBED_CONFIG}')
    for layer in m.layers:
        layer.mixer.fused = False      # the reference embedding (no launch configuration)
    us = graph_us(embed)
    log(f'  embed (reference, 5 launches): {us} us')
    return rows + [dict(config='reference (5 launches)', us_per_call=us)]


CHUNK_BATCHES = (1, 2, 4, 8, 16, 32, 128)
CHUNK_LENGTHS = (197, 1025, 2305, 4097)     # Vim at 224 / 512 / 768 / 1024 px, class token


def _mixer_us(fn, mode: str) -> float:
    """Microseconds per call of ``fn`` (median of 3 repeats), as CUDA-graph replays
    (``mode='graph'``) or eager calls; the iteration count is set so that a repeat lasts
    about fifty milliseconds."""
    graph = None
    if mode == 'graph':
        graph, _ = B.capture_cuda_graph(fn, warmup=3)
        call = graph.replay
    else:
        for _ in range(3):
            fn()
        call = fn
    torch.cuda.synchronize()
    once = B._timer(call, 1, 'cuda')
    iters = int(min(200, max(3, 0.05 / max(once, 1e-6))))
    times = [B._timer(call, iters, 'cuda') for _ in range(3)]
    del graph
    return round(sorted(times)[1] * 1e6, 2)


def gpu_tune_chunk(args):
    """The automatic scan choice's table (``SCAN_CHOICE_TABLE`` in
    ``amvim_mm/ops/fused_mixer.py``): one dense mixer call (Vim's two paths, raster and its
    reverse; E = 384 and 768, N = 16; batch x L of ``--chunk-batches`` x ``--chunk-lengths``
    up to ``--chunk-max-tokens`` tokens a call) under ``--chunk-dtype`` autocast, timed as
    CUDA-graph replays and eagerly, for: the sequential fused scan ('seq'), the chunked fused
    scan for every T of ``--chunk-sizes`` ('chunkT'), and the unfused mixer with the mamba-ssm
    kernels ('mamba', when importable). The fastest per shape in graph mode makes the table,
    printed ready to paste and used for the rest of the run."""
    from amvim_mm.models.vim.mixer import BiMambaMixer
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.layout.scan_orders import normalize_order
    from amvim_mm.ops import fused_mixer as FM
    from amvim_mm.ops import scan_choice as SC
    from amvim_mm.ops.backends import mamba_selective_scan
    from amvim_mm.token_layout import cls_slot
    has_mamba = mamba_selective_scan()[0] is not None
    variants = ['seq'] + [f'chunk{T}' for T in args.chunk_sizes] + (
        ['mamba'] if has_mamba else [])
    amp = {'fp32': None, 'bf16': torch.bfloat16}[args.chunk_dtype]
    keys = tuple(normalize_order(p) for p in (dict(order='raster'),
                                              dict(order='raster', reverse=True)))
    log(f'  variants {variants} (mamba-ssm {"usable" if has_mamba else "absent"}), '
        f'{args.chunk_dtype}')
    rows = []
    for E in args.chunk_widths:
        torch.manual_seed(0)
        mixer = BiMambaMixer(E // 2).cuda().eval()
        for L in args.chunk_lengths:
            # Vim's dense sequence: an s x s grid and the middle class token where L = s^2 + 1
            s = math.isqrt(L - 1)
            ctx = (ScanContext((s, s), cls_index=cls_slot(L - 1), device='cuda')
                   if s * s == L - 1 else ScanContext((1, L), device='cuda'))
            for batch in args.chunk_batches:
                if batch * L > args.chunk_max_tokens:
                    continue
                h = torch.randn(batch, L, E // 2, device='cuda')
                for mode in ('graph', 'eager'):
                    row = dict(E=E, L=L, batch=batch, dtype=args.chunk_dtype, mode=mode,
                               sequential_programs=batch * -(-E // FM._scan_block(E)[0]) * 2)
                    for v in variants:
                        def call(v=v, mixer=mixer, h=h, ctx=ctx):
                            with torch.no_grad(), torch.autocast(
                                    'cuda', dtype=amp or torch.float32, enabled=amp is not None):
                                return mixer(h, ctx, keys, route=Choice(
                                    'torch' if v == 'mamba' else 'triton', 'tuning'))
                        with runtime.override(scan_chunk=SC.choice_chunk(v)):
                            r = attempt(_mixer_us, call, mode)
                        row[v] = r if not isinstance(r, dict) else None
                        if isinstance(r, dict):
                            row.setdefault('errors', {})[v] = r['error']
                        torch.cuda.empty_cache()
                    timed = {v: row[v] for v in variants if row[v] is not None}
                    if timed:
                        row['best'] = min(timed, key=timed.get)
                        if row.get('seq'):
                            row['best_over_seq'] = round(row['seq'] / timed[row['best']], 3)
                    rows.append(row)
                    log(f'  E={E} L={L} b{batch} {mode}: '
                        + ', '.join(f'{v} {row[v]}' for v in variants)
                        + f' us -> {row.get("best")}')
                del h
        del mixer
        torch.cuda.empty_cache()
    table = B.scan_choice_table([r for r in rows if r['mode'] == 'graph'], variants)
    SC.SCAN_CHOICE_TABLE.update(table)
    literal = B.format_scan_choice_table(table)
    log('  measured table (graph mode), ready to paste into amvim_mm/ops/scan_choice.py:\n'
        + literal)
    return dict(variants=variants, rows=rows, table_literal=literal,
                table={f'{E},{L}': row for (E, L), row in table.items()})


def gpu_tune_bwd(args):
    """Launch configuration of the fused scan's backward (T, BLOCK_E, num_warps): a bf16
    training step of Vim-T at batch 128, 224 and of the backbone at batch 8, 512 (1025
    tokens), eager; the best at 224 is used for the rest of the run (and goes into
    BWD_CONFIG by hand)."""
    from amvim_mm.ops import fused_mixer_autograd as FA
    rows = []
    cases = [('vim-t', 224, args.train_batch, True), ('vim-t', 512, 8, False)]
    best = {}
    for name, res, batch, head in cases:
        torch.manual_seed(0)
        m = B.build(name, res, head=head, fused_mixer=True)
        if not head:
            m = B.Classifier(m).cuda()
        for cfg in args.bwd_configs:
            with runtime.override(bwd_config=cfg):
                r = attempt(B.measure_train, m, batch, res, 'bf16', iters=5)
            r.update(model=name, config=cfg)
            rows.append(r)
            log(f'  {name} {res} b{batch} bwd {cfg}: {r.get("img_per_s")} img/s '
                f'{r.get("error", "")}')
        ok = [r for r in rows if r.get('res') == res and r.get('img_per_s')]
        if ok:
            best[res] = max(ok, key=lambda r: r['img_per_s'])['config']
        del m
        torch.cuda.empty_cache()
    if 224 in best:
        FA.BWD_CONFIG = tuple(int(v) for v in best[224].split(','))
        log(f'  scan backward: using {FA.BWD_CONFIG} (best at 512: {best.get(512)})')
    return rows
