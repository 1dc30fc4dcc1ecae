"""The GPU suite's profile parts: the top CUDA kernels of classifier, dense-shape and training
forwards, the host's time of a launch-bound forward, the fused path's Triton kernels'
registers and spills."""
from __future__ import annotations

import torch

from .. import measure as B
from .. import official_vmamba as OVM
from .common import MIXERS, bf16_profile, log, variant_env


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
            t = bf16_profile(m, x, rows=25, width=140)
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
            t = bf16_profile(m, x, rows=30, width=110)
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
        t = bf16_profile(m, x, rows=30, width=100)
        out[impl] = t
        log(f'vmamba profile, {impl}:\n{t}')
    return out
