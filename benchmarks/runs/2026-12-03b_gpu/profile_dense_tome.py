"""Where a ToMe-reduced dense forward's GPU time goes: the UperNet configs' Vim-T backbone (four
feature maps, dense restore) at 512, batch 1 and 8, bf16, unreduced vs ToMe 0.46, with the
reduction kernels on (default) and off (AMVIM_FUSED_REDUCTION_KERNELS=0): CUDA-graph replay
time and the top CUDA kernels of one forward. Run on the GPU machine from the repository root
(PYTHONPATH set by tools/gpu/run.sh): python3 benchmarks/runs/2026-12-03b_gpu/profile_dense_tome.py
"""
import torch

from amvim_mm import runtime
from amvim_mm.bench.gpu.common import bf16_profile, graph_us
from amvim_mm.bench.gpu.profile import DENSE_BACKBONE
from amvim_mm.registry import MODELS

for batch in (1, 8):
    for red in (None, dict(type='ToMe', ratio=0.46)):
        for kernels in ((True, False) if red else (True, )):
            torch.manual_seed(0)
            cfg = dict(DENSE_BACKBONE, cuda_graph=False)
            if red:
                cfg['token_reduction'] = red
            m = MODELS.build(cfg).cuda().eval()
            x = torch.randn(batch, 3, 512, 512, device='cuda')
            with runtime.override(reduction_kernels=kernels):
                def fwd():
                    with torch.autocast('cuda', dtype=torch.bfloat16):
                        return m(x)
                with torch.no_grad():
                    us = graph_us(fwd)
                    print(f'=== b{batch} {red} reduction_kernels={kernels}: graph replay '
                          f'{us / 1000:.3f} ms', flush=True)
                    print(bf16_profile(m, x, 22, 70), flush=True)
            del m
            torch.cuda.empty_cache()
