"""Benchmark Vim-family models: throughput, latency, peak memory; JSON + markdown results.

    python tools/benchmark.py --suite cpu [--out-dir benchmarks]
    python tools/benchmark.py --suite gpu [--out-dir DIR] [--parts main reduction resolution]
    python tools/benchmark.py --suite dense [--out-dir DIR] [--budget-s S] [--smoke]

Suites:
  cpu: batch-1 latency at 224 on this machine's cores: timm DeiT-T / DeiT-S, Vim-T/S and
       AMVim-T on the compiled CPU kernels and on the PyTorch scan, Vim-T on the ``reference``
       loop, Vim-T with ToMe 0.17 / 0.46, and Vim-T with and without ToMe 0.46 at batch 8 (the
       batch prune_eval times a CPU at); interleaved rounds, median and spread, ratios of one
       run (amvim_mm/analysis/cpu_benchmark.py).
  gpu: (tune) launch configuration of the fused scan kernel; (tune-chunk) sequential against
       chunked fused scan (T = 32-256) against the mamba-ssm kernels, one mixer call per
       batch x E x L: the table of the automatic scan choice; (main) Vim-T/S and AMVim-T/S
       whole classifiers, batch 128, 224, fp32 and bf16, eager and CUDA-graph, the unfused
       mixer (mamba-ssm kernels) and the fused Triton mixer side by side, next to the official
       code (``--official-vim PATH``: timed in the same process) or its earlier anchors;
       (reduction) ToMe at ratios 0/0.17/0.27/0.36/0.46: measured speed-up against the FLOPs
       ratio; (resolution) 224 to 1024 with the batch scaled to keep pixels constant;
       (vmamba) VMamba-T whole classifier, batch 128, 224: inference fp32/bf16 eager and
       CUDA-graph and a bf16 training step, next to the official code
       (``--official-vmamba PATH``: timed in the same process, same weights, batch, dtype and
       mode), and stage-3 ToMe/ToP reduction: speed-up against the FLOPs ratio;
       (plainmamba) PlainMamba-L1/L3 classifiers; (plainmamba-reduction) L3 at the
       8.44-GFLOPs schedule of ToP-ViM: speed-up against the FLOPs ratio;
       (learned-reduction) Vim-S DynamicViT-style pruning at 3.56 GFLOPs against ToP at the
       same GFLOPs.
  dense: the dense tasks (amvim_mm/analysis/dense_benchmark.py): ADE20K UperNet training
       step (512, batch 8), slide and whole-image inference (512-1024), the COCO backbone +
       simple feature pyramid forward + backward (1024, batch 2) and the ImageNet fine-tuning
       step (224, batch 128), each for Vim-T and AMVim-T on the automatic (fused) and the
       unfused path next to mmseg's ViT at DeiT-T size, plus ToMe / ToP rows; the path that
       ran is recorded per row. ``--smoke`` runs every row at tiny sizes on the CPU;
       ``--budget-s`` skips the rows that no longer fit. Writes benchmark_dense.json / .md.
Every row records the command, device and versions.
"""
import argparse
import json
import math
import os
import os.path as osp
import sys
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
import torch  # noqa: E402

from amvim_mm.analysis import benchmark as B  # noqa: E402
from amvim_mm.analysis import cpu_benchmark as CB  # noqa: E402
from amvim_mm.analysis import dense_benchmark as DB  # noqa: E402
from amvim_mm.analysis import official_vim as OV  # noqa: E402
from amvim_mm.analysis import official_vmamba as OVM  # noqa: E402
from amvim_mm.analysis.flops import backbone_flops  # noqa: E402
from amvim_mm.models.backbones.plain_mamba import L3_TOP_BUDGET  # noqa: E402
from amvim_mm.models.reduction import ReductionSchedule  # noqa: E402
from amvim_mm import runtime  # noqa: E402
from amvim_mm.apis.cli import run_cli  # noqa: E402
from amvim_mm.errors import ConfigError  # noqa: E402

RATIOS = (0.0, 0.17, 0.27, 0.36, 0.46)


def variant_env(variant):
    """The reduction variant's switch: 'torch-match' matches and orders reduced paths with
    PyTorch ops (AMVIM_FUSED_REDUCTION_KERNELS=0), 'default' with the Triton kernels."""
    return runtime.override(reduction_kernels=variant != 'torch-match')


def log(msg):
    print(msg, flush=True)


def cpu_suite(args):
    """The CPU suite (amvim_mm/analysis/cpu_benchmark.py)."""
    return CB.run_cpu_suite(args.cpu_threads, iters=args.cpu_iters, repeats=args.cpu_repeats,
                            log=log)


MIXERS = {'fused': True, 'unfused': False}


def gpu_tune(args):
    """Launch configuration of the fused scan kernel per inner width: bf16 graph throughput of
    Vim-T (E=384) and Vim-S (E=768) per (BLOCK_E, num_warps, dt_in_kernel); the best of each
    is used for the rest of the run (and goes into SCAN_CONFIGS by hand)."""
    from amvim_mm.ops import fused_mixer as FM
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
        FM.SCAN_CONFIGS[E] = (be, w, bool(dk))
        log(f'  {name}: using {FM.SCAN_CONFIGS[E]}')
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
        us = _graph_us(lambda: TM.tome_match(h, r, w, 196, 98, 14, precision=prec,
                                             plan_state=state))
        rows.append(dict(config=f'{TM.MATCH_CONFIG} dots {prec}', us_per_call=us))
        log(f'  tome_match, dot products {prec}: {us} us')
    return rows


def _graph_us(fn) -> float:
    """Microseconds per call of ``fn``, timed as CUDA-graph replays (eager calls of a Triton
    kernel are bound by its Python launch: ~29 us per call in run 14b, whatever the kernel)."""
    graph, _ = B.capture_cuda_graph(fn, warmup=3)
    times = [B._timer(graph.replay, 200, 'cuda') for _ in range(3)]
    return round(sorted(times)[1] * 1e6, 2)


def _tune_kernel(name, setting, configs, fn):
    """:func:`_graph_us` of ``fn`` under each launch configuration of runtime ``setting``
    (:mod:`amvim_mm.runtime`). Returns (rows, the fastest configuration as a tuple)."""
    rows = []
    for cfg in configs:
        with runtime.override(**{setting: cfg}):
            us = _graph_us(fn)
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
    us = _graph_us(embed)
    log(f'  embed (reference, 5 launches): {us} us')
    return rows + [dict(config='reference (5 launches)', us_per_call=us)]


CHUNK_BATCHES = (1, 2, 4, 8, 16, 32, 128)
CHUNK_LENGTHS = (197, 1025, 2305, 4097)     # Vim at 224 / 512 / 768 / 1024 px, class token


def _mixer_us(fn, mode: str) -> float:
    """Microseconds per call of ``fn`` (median of 3 repeats), as CUDA-graph replays
    (``mode='graph'``) or eager calls; the iteration count is set for ~50 ms a repeat."""
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
    from amvim_mm.models.backbones.mixer import BiMambaMixer
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.layout.scan_orders import normalize_order
    from amvim_mm.ops import fused_mixer as FM
    from amvim_mm.ops.backends import mamba_selective_scan
    from amvim_mm.token_layout import cls_slot
    has_mamba = mamba_selective_scan()[0] is not None
    variants = ['seq'] + [f'chunk{T}' for T in args.chunk_sizes] + (['mamba'] if has_mamba
                                                                     else [])
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
                                return mixer(h, ctx, keys, fused=v != 'mamba')
                        with runtime.override(scan_chunk=FM.choice_chunk(v)):
                            r = _attempt(_mixer_us, call, mode)
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
    FM.SCAN_CHOICE_TABLE.update(table)
    literal = B.format_scan_choice_table(table)
    log('  measured table (graph mode), ready to paste into amvim_mm/ops/fused_mixer.py:\n'
        + literal)
    return dict(variants=variants, rows=rows, table_literal=literal,
                table={f'{E},{L}': row for (E, L), row in table.items()})


def gpu_main(args):
    """Our mixers side by side and, with ``--official-vim``, the official code's classifier
    (same weights, batch, dtype and mode) timed in the same process: ``vs_official_run`` is
    the ratio to it in the same mode; ``vs_official`` divides by the anchors measured earlier
    (eager, another run) and is kept for runs without the official checkout."""
    rows = []
    for name in args.models:
        official = args.official_vim and name in OV.OFFICIAL_MODELS
        for dtype in ('fp32', 'bf16'):
            for mode in ('eager', 'graph'):
                here = []
                for mixer in args.mixers + (['official'] if official else []):
                    if mixer == 'unfused' and mode == 'eager' and 'fused' in args.mixers:
                        continue   # the baseline in its best mode only (saves device time)
                    torch.manual_seed(0)
                    m = B.build(name, 224, head=True, fused_mixer=MIXERS.get(mixer, False))
                    extra = {}
                    if mixer == 'official':
                        ours = m
                        m = OV.build_official(name, args.official_vim, weights_from=ours)
                        if dtype == 'fp32' and mode == 'eager':   # the same function?
                            x = torch.randn(8, 3, 224, 224, device='cuda')
                            with torch.no_grad():
                                diff = (m(x) - ours(x)).abs().max().item()
                            extra['max_abs_diff_vs_unfused'] = float(f'{diff:.3g}')
                        del ours
                    r = B.measure(m, 128, 224, dtype, mode)
                    r.update(model=name, mixer=mixer,
                             official=B.OFFICIAL_ANCHORS.get((name, dtype)), **extra)
                    if r['official']:
                        r['vs_official'] = round(r['img_per_s'] / r['official'], 3)
                    here.append(r)
                    log(f'  {name} {dtype} {mode} {mixer}: {r["img_per_s"]} img/s '
                        f'(official anchor {r["official"]}), {r.get("peak_mem_mib")} MiB'
                        + (f', {extra}' if extra else ''))
                    del m
                    torch.cuda.empty_cache()
                ref = [r['img_per_s'] for r in here if r['mixer'] == 'official']
                for r in here:
                    if ref:
                        r['vs_official_run'] = round(r['img_per_s'] / ref[0], 3)
                rows += here
    return rows


def gpu_reduction(args):
    rows = []
    for variant, name, mode in [(v, n, m) for v in args.reduction_variants
                                for n in ('vim-t', 'amvim-t') for m in args.reduction_modes]:
        base = None
        for ratio in RATIOS:
            red = dict(type='ToMe', ratio=ratio) if ratio else None
            m = B.build(name, 224, head=True, token_reduction=red)
            with variant_env(variant):
                r = B.measure(m, 128, 224, 'bf16', mode)
            fl = backbone_flops(m.backbone, 224, 'model')
            r.update(model=name, method='ToMe', ratio=ratio, gflops=round(fl['gflops'], 3),
                     realised=round(fl['realised_ratio'], 3), variant=variant)
            if base is None:
                base = r
            _speedup(r, base)
            rows.append(r)
            log(f'  {name} {mode} {variant} ToMe {ratio}: {r["img_per_s"]} img/s, speed-up '
                f'{r["speedup"]} vs FLOPs ratio {r["flops_ratio"]}')
            del m
            torch.cuda.empty_cache()
    return rows


def gpu_resolution(args):
    rows = []
    for name in ('vim-t', 'amvim-t'):
        for res in (224, 448, 768, 1024):
            batch = max(1, round(128 * 224 ** 2 / res ** 2))
            m = B.build(name, res, head=True)
            r = B.measure(m, batch, res, 'bf16', 'graph', iters=10)
            r.update(model=name, official=B.OFFICIAL_RESOLUTION_BF16.get((name, res)))
            rows.append(r)
            log(f'  {name} {res} b{batch}: {r["img_per_s"]} img/s (official {r["official"]})')
            del m
            torch.cuda.empty_cache()
    return rows


def _bf16_profile(m, x, rows: int, width: int) -> str:
    """The top CUDA kernels of one bf16 forward of ``m`` on ``x`` (after 3 warm-up calls)."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            m(x)
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by='cuda_time_total', row_limit=rows,
                                     max_name_column_width=width)


def gpu_profile(args):
    """Top CUDA kernels of one bf16 forward (batch 128, 224): Vim-T unfused (when mamba-ssm is
    there) and fused, and Vim-T/AMVim-T fused with ToMe 0.46 with the matching kernels
    (default) and without (AMVIM_FUSED_REDUCTION_KERNELS=0)."""

    from amvim_mm.ops.backends import mamba_selective_scan
    tome = dict(type='ToMe', ratio=0.46)
    cases = [('vim-t', 'unfused', None, 'default')] if mamba_selective_scan()[0] else []
    cases += [('vim-t', 'fused', None, 'default')]
    cases += [(n, 'fused', tome, v) for n in ('vim-t', 'amvim-t')
              for v in ('default', 'torch-match')]
    out = {}
    for name, mixer, red, variant in cases:
        m = B.build(name, 224, head=True, fused_mixer=MIXERS[mixer], token_reduction=red)
        x = torch.randn(128, 3, 224, 224, device='cuda')
        with variant_env(variant):
            t = _bf16_profile(m, x, rows=25, width=140)
        key = f'{name}_{mixer}' + (f'_tome0.46_{variant}' if red else '')
        out[key] = t
        log(f'profile, {key}:\n{t}')
        del m
        torch.cuda.empty_cache()
    return out



#: the ADE20K UperNet configs' Vim-T backbone (configs/_base_/upernet_ade20k-512x512.py)
DENSE_BACKBONE = dict(type='Vim', arch='tiny', img_size=512, out_type='featmap',
                      out_indices=(5, 11, 17, 23), with_cls_token=False, final_norm=False)


def _host_profile(m, calls: int = 20) -> str:
    """Where the host's time goes in eager bf16 forwards of ``m`` at 512 b1 (a launch-bound
    shape): ms per forward eager and as a CUDA-graph replay, then cProfile's top functions
    over ``calls`` forwards (own time and cumulative)."""
    import cProfile
    import io
    import pstats
    m = m.cuda().eval()
    x = torch.randn(1, 3, 512, 512, device='cuda')

    def fwd():
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
            return m(x)
    for _ in range(3):
        fwd()
    torch.cuda.synchronize()
    eager = B._timer(fwd, calls, 'cuda')
    graph, _ = B.capture_cuda_graph(fwd, warmup=2)
    replay = B._timer(graph.replay, calls, 'cuda')
    del graph
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fwd()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    buf.write(f'eager {eager * 1e3:.3f} ms per forward, graph replay {replay * 1e3:.3f} ms; '
              f'cProfile over {calls} forwards:\n')
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats('tottime').print_stats(45)
    st.sort_stats('cumulative').print_stats(45)
    return buf.getvalue()


def gpu_dense_profile(args):
    """Top CUDA kernels of one bf16 forward of the UperNet configs' Vim-T backbone (four
    feature maps) at the dense shapes 512 b8 and 1024 b2, next to the classifier's 224 b128:
    where the fused path's time goes outside the scan; unfused too when mamba-ssm is there."""
    from amvim_mm.ops.backends import mamba_selective_scan
    from amvim_mm.registry import MODELS as REG
    mixers = ['fused'] + (['unfused'] if mamba_selective_scan()[0] else [])
    out = {}
    for mixer in mixers:
        key = f'vim-t_backbone_{mixer}_512_b1_host'
        out[key] = _host_profile(REG.build(dict(DENSE_BACKBONE, fused_mixer=MIXERS[mixer])))
        log(f'dense profile, {key}:\n{out[key]}')
    for res, batch in ((512, 8), (1024, 2), (224, 128)):
        for mixer in mixers:
            m = REG.build(dict(DENSE_BACKBONE, fused_mixer=MIXERS[mixer])).cuda().eval()
            x = torch.randn(batch, 3, res, res, device='cuda')
            t = _bf16_profile(m, x, rows=30, width=110)
            key = f'vim-t_backbone_{mixer}_{res}_b{batch}'
            out[key] = t
            log(f'dense profile, {key}:\n{t}')
            del m
            torch.cuda.empty_cache()
    return out


def _triton_kernel_report() -> list:
    """Registers and spills of every compiled Triton kernel of the fused path (from the jit
    caches), one row each."""
    from amvim_mm.ops import fused_mixer as FM
    from amvim_mm.ops import fused_mixer_autograd as FA
    rows = []
    kernels = list(FM._kernels(False)) + list(FA._bwd_kernels(False))
    try:
        for k in kernels:
            for cache in getattr(k, 'device_caches', {}).values():
                for compiled in cache[0].values():
                    rows.append(dict(kernel=k.fn.__name__,
                                     n_regs=getattr(compiled, 'n_regs', None),
                                     n_spills=getattr(compiled, 'n_spills', None),
                                     num_warps=getattr(compiled.metadata, 'num_warps', None)))
    except Exception as e:   # noqa: BLE001  (Triton's cache layout differs between versions)
        rows.append(dict(error=f'{type(e).__name__}: {e}'))
    return rows


def gpu_train_profile(args):
    """Top CUDA kernels of one bf16 training step (forward, loss, backward) of Vim-T, batch
    128, 224: the fused and the unfused path; and the fused path's Triton kernels' registers
    and spills."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for mixer in ('fused', 'unfused'):
        m = B.build('vim-t', 224, head=True, fused_mixer=mixer == 'fused')
        m.train()
        x = torch.randn(args.train_batch, 3, 224, 224, device='cuda')
        y = torch.randint(0, 1000, (args.train_batch, ), device='cuda')

        def step(m=m):
            with torch.autocast('cuda', dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x).float(), y)
            loss.backward()
            for p in m.parameters():
                p.grad = None
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        t = prof.key_averages().table(sort_by='cuda_time_total', row_limit=30,
                                      max_name_column_width=120)
        out[f'vim-t_{mixer}'] = t
        log(f'train profile, vim-t {mixer}:\n{t}')
        del m
        torch.cuda.empty_cache()
    out['triton_kernels'] = _triton_kernel_report()
    log(f'triton kernels: {out["triton_kernels"]}')
    return out


def _speedup(r: dict, base: dict) -> None:
    """Add the speed-up over ``base``, the FLOPs ratio and their quotient to row ``r`` (when
    both were measured)."""
    if r.get('img_per_s') and base.get('img_per_s'):
        r['speedup'] = round(r['img_per_s'] / base['img_per_s'], 3)
        r['flops_ratio'] = round(base['gflops'] / r['gflops'], 3)
        r['speedup_over_ideal'] = round(r['speedup'] / r['flops_ratio'], 3)


def _attempt(fn, *args, **kwargs):
    """A measurement, or ``{'error': ...}`` (one failing case must not lose the run)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:   # noqa: BLE001  (recorded in the results, named in the log)
        torch.cuda.empty_cache()
        return dict(error=f'{type(e).__name__}: {str(e).splitlines()[0][:300]}')


def gpu_vmamba(args):
    """VMamba-T: ours and (``--official-vmamba``) the official code, same weights, batch 128,
    224: inference (fp32/bf16, eager/graph; ``vs_official_run`` = ours / official in the same
    mode), a bf16 training step (eager), and stage-3 reduction (bf16, graph and eager)."""
    rows = []
    name, arch = 'vmamba-t', 'tiny'
    torch.manual_seed(0)
    ours = B.build(name, 224, head=True)
    official = None
    if args.official_vmamba:
        official = OVM.build_official(arch, args.official_vmamba, weights_from=ours)
        x = torch.randn(8, 3, 224, 224, device='cuda')
        diff = OVM.max_abs_diff(official, ours, x)
        log(f'  official VMamba-T (scan backend {OVM.scan_backend(args.official_vmamba)}): '
            f'max |logits difference| {diff:.3g} (fp32, batch 8)')
        rows.append(dict(model=name, impl='official', check='max_abs_diff_fp32',
                         value=float(f'{diff:.3g}')))
    impls = [('ours', ours)] + ([('official', official)] if official is not None else [])
    for dtype in ('fp32', 'bf16'):
        for mode in ('eager', 'graph', 'train'):
            if mode == 'train' and dtype == 'fp32':
                continue
            here = []
            for impl, m in impls:
                if mode == 'train':
                    r = _attempt(B.measure_train, m, 128, 224, dtype)
                else:
                    r = _attempt(B.measure, m, 128, 224, dtype, mode)
                r.update(model=name, impl=impl, dtype=dtype, mode=r.get('mode', mode))
                here.append(r)
                log(f'  {name} {dtype} {r["mode"]} {impl}: {r.get("img_per_s")} img/s, '
                    f'{r.get("peak_mem_mib")} MiB {r.get("error", "")}')
                torch.cuda.empty_cache()
            ref = [r.get('img_per_s') for r in here if r['impl'] == 'official']
            for r in here:
                if ref and ref[0] and r.get('img_per_s'):
                    r['vs_official_run'] = round(r['img_per_s'] / ref[0], 3)
            rows += here
    del official
    torch.cuda.empty_cache()
    # stage-3 reduction: measured speed-up against the FLOPs ratio (official convention)
    M, depth = ours.backbone.reduction_domain()
    locs = ReductionSchedule.importance_locations(depth)
    for mode in ('graph', 'eager'):
        base = None
        for method, ratio in [('none', 0.0)] + [(m, r) for m in ('ToMe', 'ToP')
                                                 for r in (0.27, 0.46)]:
            if method == 'ToMe':
                red = dict(type='ToMe', ratio=ratio)
            elif method == 'ToP':
                red = dict(type='ToP', locations=locs, keep_rate=ReductionSchedule
                           .keep_rate_for_ratio(ratio, M, depth, locs))
            else:
                red = None
            ours.backbone.set_token_reduction(red)
            r = _attempt(B.measure, ours, 128, 224, 'bf16', mode)
            fl = backbone_flops(ours.backbone, 224, 'model', num_classes=1000,
                                convention='official')
            r.update(model=name, part='reduction', method=method, ratio=ratio, reduction=red,
                     realised=round(fl['realised_ratio'], 3), gflops=round(fl['gflops'], 3),
                     stage3_tokens=fl['tokens'][4:4 + depth])
            if base is None:
                base = r
            _speedup(r, base)
            rows.append(r)
            log(f'  {name} bf16 {mode} {method} {ratio}: {r.get("img_per_s")} img/s, speed-up '
                f'{r.get("speedup")} vs FLOPs ratio {r.get("flops_ratio")} {r.get("error", "")}')
        ours.backbone.set_token_reduction(None)
    return rows


def gpu_vmamba_profile(args):
    """Top CUDA kernels of one bf16 forward of VMamba-T (batch 128, 224): ours and, with
    ``--official-vmamba``, the official code."""
    torch.manual_seed(0)
    ours = B.build('vmamba-t', 224, head=True)
    models = [('ours', ours)]
    if args.official_vmamba:
        models.append(('official', OVM.build_official('tiny', args.official_vmamba,
                                                      weights_from=ours)))
    x = torch.randn(128, 3, 224, 224, device='cuda')
    out = {}
    for impl, m in models:
        t = _bf16_profile(m, x, rows=30, width=100)
        out[impl] = t
        log(f'vmamba profile, {impl}:\n{t}')
    return out


def gpu_plainmamba(args):
    """PlainMamba-L1 / L3 whole classifiers on our path, batch 128, 224, bf16 and fp32, eager
    and CUDA graph (no official code: it needs mmcv 1.x / mmcls 0.x)."""
    rows = []
    for name in ('plainmamba-l1', 'plainmamba-l3'):
        torch.manual_seed(0)
        m = B.build(name, 224, head=True)
        fl = backbone_flops(m.backbone, 224, None, num_classes=1000, convention='official')
        for dtype in ('bf16', 'fp32'):
            for mode in ('eager', 'graph'):
                r = _attempt(B.measure, m, 128, 224, dtype, mode, warmup=3, iters=10,
                             repeats=3)
                r.update(model=name, dtype=dtype, mode=mode, gflops=round(fl['gflops'], 3))
                rows.append(r)
                log(f'  {name} {dtype} {mode}: {r.get("img_per_s")} img/s, '
                    f'{r.get("peak_mem_mib")} MiB {r.get("error", "")}')
        del m
        torch.cuda.empty_cache()
    return rows


def gpu_plainmamba_reduction(args):
    """PlainMamba-L3 classifier, batch 128, 224, bf16: the 8.44-GFLOPs schedule (ToP with and
    without alignment, EViT) and ToMe at a similar realised ratio; measured speed-up against
    the FLOPs ratio (official convention), CUDA graph and eager."""
    name = 'plainmamba-l3'
    torch.manual_seed(0)
    m = B.build(name, 224, head=True)
    cases = [('none', None), ('ToP', dict(type='ToP', **L3_TOP_BUDGET)),
             ('ToP-noalign', dict(type='ToP', align=False, **L3_TOP_BUDGET)),
             ('EViT', dict(type='EViT', **L3_TOP_BUDGET)), ('ToMe', dict(type='ToMe', ratio=0.42))]
    return _reduction_rows(m, name, cases, 'official', 'reduction')


def _reduction_rows(m, name, cases, convention, part):
    """Time ``m`` (batch 128, 224, bf16) with each ``(method, reducer config)`` of
    ``cases`` (the first is the baseline), CUDA graph then eager; speed-up against the FLOPs
    ratio (``convention``)."""
    rows = []
    for mode in ('graph', 'eager'):
        base = None
        for method, red in cases:
            m.backbone.set_token_reduction(red)
            r = _attempt(B.measure, m, 128, 224, 'bf16', mode, warmup=3, iters=10, repeats=3)
            fl = backbone_flops(m.backbone, 224, 'model', num_classes=1000, convention=convention)
            r.update(model=name, part=part, method=method, reduction=red, mode=mode,
                     realised=round(fl['realised_ratio'], 3), gflops=round(fl['gflops'], 3),
                     final_tokens=fl['tokens'][-1])
            if base is None:
                base = r
            _speedup(r, base)
            rows.append(r)
            log(f'  {name} bf16 {mode} {method}: {r.get("img_per_s")} img/s, {r["gflops"]} G, '
                f'speed-up {r.get("speedup")} vs FLOPs ratio {r.get("flops_ratio")} '
                f'{r.get("error", "")}')
            torch.cuda.empty_cache()
    m.backbone.set_token_reduction(None)
    return rows


def _nearest(values, target, gflops_of):
    """The value whose GFLOPs are nearest to ``target`` (ties: the first)."""
    return min(values, key=lambda v: abs(gflops_of(v) - target))


def gpu_learned_reduction(args):
    """Vim-S classifier, batch 128, 224, bf16: DynamicViT-style pruning (keep predictors
    before blocks 6, 12, 18; rho fitted to the published 3.56 GFLOPs in the LocalMamba
    convention, where Vim-S is 5.14 G as published 5.1 G) against ToP (ToP-ViM's Small
    locations, after blocks 5, 10, 15) at the same GFLOPs, with and without alignment;
    measured speed-up against the FLOPs ratio, CUDA graph and eager. Random predictor weights
    (the speed does not depend on which tokens are kept)."""
    name = 'vim-s'
    torch.manual_seed(0)
    m = B.build(name, 224, head=True)
    bb = m.backbone

    def gflops(red):
        bb.set_token_reduction(red)
        try:
            return backbone_flops(bb, 224, 'model', num_classes=1000,
                                  convention='localmamba')['gflops']
        finally:
            bb.set_token_reduction(None)

    def dyn(rho):
        return dict(type='DynamicViT', keep_rate=rho, locations=(5, 11, 17))

    def top(k, align=True):
        return dict(type='ToP', keep_rate=k, locations=(5, 10, 15), align=align)

    grid = [round(0.5 + 0.005 * i, 3) for i in range(81)]
    rho = _nearest(grid, 3.56, lambda v: gflops(dyn(v)))
    target = gflops(dyn(rho))
    kt = _nearest(grid, target, lambda v: gflops(top(v)))
    log(f'  DynamicViT rho {rho}: {target:.3f} G; ToP keep {kt}: {gflops(top(kt)):.3f} G')
    cases = [('none', None), ('DynamicViT', dyn(rho)), ('ToP', top(kt)),
             ('ToP-noalign', top(kt, align=False))]
    return _reduction_rows(m, name, cases, 'localmamba', 'learned-reduction')


def _training_path(m) -> str:
    """Which mixer path a training step of classifier ``m`` takes (asked of its first mixer
    with a gradient wanted, as the forward asks)."""
    mixer = m.backbone.layers[0].mixer
    with torch.enable_grad():
        x = torch.empty(2, 3, 16, 16, device='cuda')
        return 'fused' if mixer.use_fused(x, None) else 'unfused'


def gpu_train(args):
    """Training step (forward, cross-entropy, backward; eager) of the whole classifier at each
    ``--train-sizes`` RES:BATCH (default 224:128) and ``--train-dtypes``: the fused path
    (forced: ``fused_mixer=True``) against the unfused path (the official code's speed) in the
    same run;
    ``vs_unfused`` = fused / unfused img/s, with both peak memories. Rows whose path decision
    came out unfused (the automatic choice) say so in ``path``."""
    rows = []
    for name in args.models:
        for res, batch in args.train_sizes:
            for dtype in args.train_dtypes:
                here = {}
                for mixer in ('unfused', 'fused'):
                    torch.manual_seed(0)
                    m = B.build(name, res, head=True, fused_mixer=True if mixer == 'fused'
                                else False)
                    r = _attempt(B.measure_train, m, batch, res, dtype)
                    r.update(model=name, mixer=mixer, path=_training_path(m), res=res,
                             batch=batch)
                    here[mixer] = r
                    log(f'  {name} {res} b{batch} {dtype} train {mixer} ({r["path"]}): '
                        f'{r.get("img_per_s")} img/s, {r.get("peak_mem_mib")} MiB '
                        f'{r.get("error", "")}')
                    del m
                    torch.cuda.empty_cache()
                f, u = here['fused'], here['unfused']
                if f.get('img_per_s') and u.get('img_per_s'):
                    f['vs_unfused'] = round(f['img_per_s'] / u['img_per_s'], 3)
                    f['mem_vs_unfused'] = round(f['peak_mem_mib'] / u['peak_mem_mib'], 3)
                rows += [u, f]
    return rows


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
                r = _attempt(B.measure_train, m, batch, res, 'bf16', iters=5)
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


# the GPU suite's parts: (name, progress title, function)
GPU_PARTS = [
    ('tune', 'fused scan kernel launch configuration (Vim-T bf16 graph)', gpu_tune),
    ('tune-chunk', 'sequential / chunked fused scan / mamba-ssm per shape (one mixer call)',
     gpu_tune_chunk),
    ('tune-match', 'ToMe matching kernel launch configuration', gpu_tune_match),
    ('tune-embed', 'one-kernel embedding launch configuration', gpu_tune_embed),
    ('tune-bwd', 'fused scan backward launch configuration (Vim-T bf16 training step)',
     gpu_tune_bwd),
    ('profile', None, gpu_profile),
    ('dense-profile', None, gpu_dense_profile),
    ('main', 'whole classifiers, batch 128, 224', gpu_main),
    ('train', 'training step, fused vs unfused, batch 128, 224', gpu_train),
    ('train-profile', 'top CUDA kernels of a bf16 training step (Vim-T, batch 128, 224)',
     gpu_train_profile),
    ('reduction', 'ToMe, bf16, batch 128, 224', gpu_reduction),
    ('resolution', 'bf16, CUDA graph, pixels per batch constant', gpu_resolution),
    ('vmamba', 'VMamba-T whole classifier, batch 128, 224, ours and official', gpu_vmamba),
    ('vmamba-profile', None, gpu_vmamba_profile),
    ('plainmamba', 'PlainMamba-L1/L3 whole classifiers, batch 128, 224', gpu_plainmamba),
    ('plainmamba-reduction', 'PlainMamba-L3 token reduction, bf16, batch 128, 224',
     gpu_plainmamba_reduction),
    ('learned-reduction', 'Vim-S DynamicViT-style vs ToP at 3.56 GFLOPs, bf16, batch 128, 224',
     gpu_learned_reduction),
]

def _res_batch(text: str):
    """``RES:BATCH`` -> (res, batch)."""
    try:
        res, batch = (int(v) for v in text.split(':'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected RES:BATCH, e.g. 512:8; got {text!r}')
    return res, batch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--suite', choices=['cpu', 'gpu', 'dense'], required=True)
    p.add_argument('--parts', nargs='+', default=['main', 'reduction', 'resolution'],
                   choices=[part for part, *_ in GPU_PARTS])
    p.add_argument('--tune-configs', nargs='+', default=[
        '32,1,1', '32,1,0', '64,2,1', '64,2,0', '16,1,1', '16,1,0'],
        help='tune part: BLOCK_E,num_warps,dt_in_kernel of the fused scan kernel')
    p.add_argument('--chunk-sizes', nargs='+', type=int, default=[32, 64, 128, 256],
                   help='tune-chunk part: chunk lengths T of the chunked fused scan')
    p.add_argument('--chunk-widths', nargs='+', type=int, default=[384, 768],
                   help='tune-chunk part: inner widths E (the mixer has D = E / 2)')
    p.add_argument('--chunk-lengths', nargs='+', type=int, default=list(CHUNK_LENGTHS),
                   help='tune-chunk part: sequence lengths L')
    p.add_argument('--chunk-batches', nargs='+', type=int, default=list(CHUNK_BATCHES),
                   help='tune-chunk part: batch sizes')
    p.add_argument('--chunk-max-tokens', type=int, default=128 * 1025,
                   help='tune-chunk part: skip shapes with batch x L above this')
    p.add_argument('--chunk-dtype', choices=['bf16', 'fp32'], default='bf16',
                   help='tune-chunk part: autocast dtype of the mixer calls')
    p.add_argument('--match-configs', nargs='+', default=[
        '32,8,1', '32,4,1', '32,16,1', '64,8,1', '64,16,1', '32,8,2', '64,16,2', '32,4,3'],
        help='tune-match part: BLOCK_D,num_warps,num_stages of the ToMe matching kernel')
    p.add_argument('--embed-configs', nargs='+', default=[
        '64,128,4,3', '64,64,4,3', '128,64,4,3', '32,128,4,3', '64,128,4,4', '64,128,8,3',
        '64,256,4,1', '128,256,8,1'],
        help='tune-embed part: BLOCK_M,BLOCK_N,num_warps,num_stages of the embedding kernel')
    p.add_argument('--bwd-configs', nargs='+', default=[
        '32,32,2', '16,32,2', '16,64,2', '16,16,1', '16,64,4'],
        help='tune-bwd part: T,BLOCK_E,num_warps of the fused scan backward')
    p.add_argument('--train-batch', type=int, default=128,
                   help='tune-bwd and train-profile parts: batch of the 224 training step')
    p.add_argument('--train-sizes', nargs='+', type=_res_batch, default=[(224, 128)],
                   metavar='RES:BATCH', help='train part: resolutions and batches')
    p.add_argument('--train-dtypes', nargs='+', default=['bf16', 'fp32'],
                   choices=['bf16', 'fp16', 'fp32'], help='train part: autocast dtypes')
    p.add_argument('--reduction-modes', nargs='+', default=['graph'], choices=['eager', 'graph'],
                   help='reduction part: eager is launch-bound at batch 128 (many small ops)')
    p.add_argument('--reduction-variants', nargs='+', default=['default'],
                   choices=['default', 'torch-match'],
                   help="reduction part: 'torch-match' sets AMVIM_FUSED_REDUCTION_KERNELS=0 "
                        "(ToMe matching and reduced path indices in PyTorch ops)")
    p.add_argument('--mixers', nargs='+', default=['unfused', 'fused'], choices=list(MIXERS),
                   help='main part: the mixer implementations to time side by side')
    p.add_argument('--models', nargs='+', default=['vim-t', 'amvim-t', 'vim-s', 'amvim-s'])
    p.add_argument('--official-vim', metavar='PATH',
                   help='main part: a checkout of hustvl/Vim; its Vim-T/S are timed in the same '
                        'process, same weights, batch, dtype and mode (see '
                        'amvim_mm/analysis/official_vim.py)')
    p.add_argument('--official-vmamba', metavar='PATH',
                   help='vmamba part: a checkout of MzeroMiko/VMamba (its root vmamba.py); '
                        'its VMamba-T is timed in the same process, same weights, batch, dtype '
                        'and mode (see amvim_mm/analysis/official_vmamba.py)')
    p.add_argument('--cpu-iters', type=int, default=3,
                   help='cpu suite: forwards per row and round')
    p.add_argument('--cpu-repeats', type=int, default=5,
                   help='cpu suite: interleaved rounds (median and spread over them)')
    p.add_argument('--cpu-threads', type=int, default=os.cpu_count() or 1,
                   help='cpu suite: torch.set_num_threads (default: every core)')
    p.add_argument('--out-dir', default='benchmarks')
    dense = p.add_argument_group('dense suite (amvim_mm/analysis/dense_benchmark.py)')
    dense.add_argument('--smoke', action='store_true',
                       help='every row at tiny sizes on the CPU (a test of the code paths, '
                            'not a measurement)')
    dense.add_argument('--budget-s', metavar='S',
                       help='time budget in seconds from the start: rows that no longer fit '
                            'are skipped and listed')
    dense.add_argument('--workloads', nargs='+', metavar='W',
                       help=f'a subset of {", ".join(DB.WORKLOADS)} (default: all)')
    dense.add_argument('--whole-sizes', metavar='RES:BATCH,...',
                       help='whole-image inference sizes (default 512:8,768:4,1024:2)')
    dense.add_argument('--repeats', metavar='N', help='timed repeats per row (default 3)')
    dense.add_argument('--warmup', metavar='N', help='warm-up calls per row (default 3)')
    dense.add_argument('--train-iters', metavar='N',
                       help='training steps per timed repeat (default 5)')
    dense.add_argument('--infer-iters', metavar='N',
                       help='inference calls per timed repeat (default 10)')
    dense.add_argument('--infer-modes', nargs='+', metavar='MODE',
                       help=f'inference rows in these modes: {", ".join(DB.INFER_MODES)} '
                            '(graph: replays of one CUDA graph); default eager')
    args = p.parse_args(argv)
    dense_opts = dict(workloads=args.workloads, whole_sizes=args.whole_sizes,
                      budget_s=args.budget_s, repeats=args.repeats, warmup=args.warmup,
                      train_iters=args.train_iters, infer_iters=args.infer_iters,
                      infer_modes=args.infer_modes)
    if args.suite != 'dense':
        given = [k for k, v in dense_opts.items() if v is not None] + \
            (['smoke'] if args.smoke else [])
        if given:
            raise ConfigError(f'--{given[0].replace("_", "-")} belongs to --suite dense')
    else:
        command = 'python tools/benchmark.py ' + ' '.join(argv or sys.argv[1:])
        root = osp.dirname(osp.dirname(osp.abspath(__file__)))
        result = DB.run_dense(out_dir=args.out_dir, root=root, command=command,
                              smoke=args.smoke, log=log, **dense_opts)
        print(DB.markdown(result))
        return 0
    if args.suite == 'gpu' and not torch.cuda.is_available():
        print('error: --suite gpu needs a CUDA device', file=sys.stderr)
        return 2
    if args.official_vim:
        OV.official_module(args.official_vim)   # a wrong path fails now, not after the tunes
    if args.official_vmamba:
        OVM.official_module(args.official_vmamba)
    os.makedirs(args.out_dir, exist_ok=True)
    result = dict(command='python tools/benchmark.py ' + ' '.join(argv or sys.argv[1:]),
                  environment=B.environment())
    log(f'environment: {result["environment"]}')
    if args.suite == 'cpu':
        result['cpu'] = cpu_suite(args)
    else:
        for part, title, fn in GPU_PARTS:    # in this order (tunes first: later parts use them)
            if part in args.parts:
                if title:
                    log(f'{part}: {title}')
                result[part.replace('-', '_')] = fn(args)
    path = osp.join(args.out_dir, f'benchmark_{args.suite}.json')
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
    md = [f'# benchmark ({args.suite})', '', f'`{result["command"]}`', '',
          f'environment: `{json.dumps(result["environment"])}`', '']
    if 'cpu' in result:
        md += [f'batch 1 (8 where the batch column says so), 224, fp32, eager, '
               f'{result["cpu"]["threads"]} threads; latency: median '
               f'of {result["cpu"]["repeats"]} interleaved rounds of {result["cpu"]["iters"]} '
               'forwards', '', B.table(result['cpu']['rows'], CB.COLUMNS), '',
               f'summary: {result["cpu"]["summary"]}']
    if 'main' in result:
        md += ['## main', B.table(result['main'], ['model', 'dtype', 'mode', 'mixer', 'img_per_s',
                                                   'vs_official_run', 'official',
                                                   'vs_official', 'latency_ms', 'spread_pct',
                                                   'peak_mem_mib']), '']
    if 'train' in result:
        md += ['## train (training step, eager; vs_unfused: same run)', B.table(
            result['train'], ['model', 'res', 'dtype', 'mixer', 'path', 'batch', 'img_per_s',
                              'vs_unfused', 'latency_ms', 'spread_pct', 'peak_mem_mib',
                              'mem_vs_unfused', 'error']), '']
    if 'tune_bwd' in result:
        md += ['## tune-bwd (fused scan backward: T,BLOCK_E,num_warps; bf16 training step)',
               B.table(result['tune_bwd'], ['model', 'res', 'batch', 'config', 'img_per_s',
                                            'peak_mem_mib', 'error']), '']
    if 'tune' in result:
        md += ['## tune (fused scan kernel: BLOCK_E,num_warps,dt_in_kernel; bf16 graph)', B.table(
            result['tune'], ['model', 'E', 'config', 'img_per_s', 'spread_pct']), '']
    if 'tune_chunk' in result:
        tc = result['tune_chunk']
        md += ['## tune-chunk (one mixer call, us; sequential / chunked fused scan / mamba-ssm)',
               B.table(tc['rows'], ['E', 'L', 'batch', 'dtype', 'mode', 'sequential_programs']
                       + tc['variants'] + ['best', 'best_over_seq']), '',
               'Fastest per shape (graph mode), ready to paste into '
               '`amvim_mm/ops/fused_mixer.py`:', '', '```python', tc['table_literal'], '```',
               '']
    if 'tune_match' in result:
        md += ['## tune-match (ToMe matching kernel: BLOCK_D,num_warps,num_stages)',
               B.table(result['tune_match'], ['config', 'us_per_call']), '']
    if 'tune_embed' in result:
        md += ['## tune-embed (one-kernel embedding: BLOCK_M,BLOCK_N,num_warps,num_stages)',
               B.table(result['tune_embed'], ['config', 'us_per_call']), '']
    if 'reduction' in result:
        md += ['## reduction (ToMe, bf16)', B.table(result['reduction'], [
            'model', 'variant', 'mode', 'ratio', 'realised', 'gflops', 'img_per_s', 'speedup',
            'flops_ratio', 'speedup_over_ideal']), '']
    if 'resolution' in result:
        md += ['## resolution (bf16, graph)', B.table(result['resolution'], [
            'model', 'res', 'batch', 'img_per_s', 'official', 'peak_mem_mib']), '']
    if 'vmamba' in result:
        inf = [r for r in result['vmamba'] if 'mode' in r and r.get('part') != 'reduction']
        red = [r for r in result['vmamba'] if r.get('part') == 'reduction']
        md += ['## vmamba (VMamba-T, batch 128, 224; vs_official_run: same mode, same run)',
               B.table(inf, ['model', 'dtype', 'mode', 'impl', 'img_per_s', 'vs_official_run',
                             'latency_ms', 'spread_pct', 'peak_mem_mib', 'error']), '',
               '## vmamba stage-3 reduction (bf16)',
               B.table(red, ['model', 'mode', 'method', 'ratio', 'realised', 'gflops',
                             'img_per_s', 'speedup', 'flops_ratio', 'speedup_over_ideal',
                             'error']), '']
    if 'plainmamba' in result:
        md += ['## plainmamba (batch 128, 224, our path)', B.table(result['plainmamba'], [
            'model', 'dtype', 'mode', 'gflops', 'img_per_s', 'latency_ms', 'spread_pct',
            'peak_mem_mib', 'error']), '']
    if 'plainmamba_reduction' in result:
        md += ['## plainmamba-reduction (PlainMamba-L3, bf16, batch 128, 224)',
               B.table(result['plainmamba_reduction'], [
                   'model', 'mode', 'method', 'realised', 'gflops', 'img_per_s', 'speedup',
                   'flops_ratio', 'speedup_over_ideal', 'peak_mem_mib', 'error']), '']
    if 'learned_reduction' in result:
        md += ['## learned-reduction (Vim-S, bf16, batch 128, 224, GFLOPs: LocalMamba '
               'convention)', B.table(result['learned_reduction'], [
                   'model', 'mode', 'method', 'realised', 'final_tokens', 'gflops', 'img_per_s',
                   'speedup', 'flops_ratio', 'speedup_over_ideal', 'peak_mem_mib', 'error']), '']
    with open(osp.join(args.out_dir, f'benchmark_{args.suite}.md'), 'w') as f:
        f.write('\n'.join(md) + '\n')
    print('\n'.join(md))
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
