"""Top CUDA kernels of reduced bf16 forwards (batch 128, 224) whose speed-up is far below the
FLOPs ratio: PlainMamba-L3 ToP with / without alignment, VMamba-T stage-3 ToMe 0.46.
Run on the GPU machine from the repository root (PYTHONPATH set by tools/gpu/run.sh)."""
import torch

from amvim_mm.bench import measure as B
from amvim_mm.bench.gpu.common import bf16_profile
from amvim_mm.models.backbones.plain_mamba import L3_TOP_BUDGET

CASES = [('plainmamba-l3', None), ('plainmamba-l3', dict(type='ToP', **L3_TOP_BUDGET)),
         ('plainmamba-l3', dict(type='ToP', align=False, **L3_TOP_BUDGET)),
         ('vmamba-t', None), ('vmamba-t', dict(type='ToMe', ratio=0.46))]

for name, red in CASES:
    torch.manual_seed(0)
    m = B.build(name, 224, head=True, token_reduction=red)
    m.backbone.cuda_graph = False
    x = torch.randn(128, 3, 224, 224, device='cuda')
    print(f'=== {name} {red}', flush=True)
    print(bf16_profile(m, x, 14, 60), flush=True)
    del m
    torch.cuda.empty_cache()
