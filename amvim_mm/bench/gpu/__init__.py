"""The GPU suite of ``tools/benchmark.py --suite gpu``: its parts, run in the order of
:data:`GPU_PARTS` (tunes first: later parts use what they chose)."""
from .families import (gpu_learned_reduction, gpu_plainmamba, gpu_plainmamba_reduction,
                       gpu_vmamba)
from .profile import gpu_dense_profile, gpu_profile, gpu_train_profile, gpu_vmamba_profile
from .reduction_table import gpu_reduction_table
from .speed import gpu_main, gpu_reduction, gpu_resolution, gpu_train
from .tune import gpu_tune, gpu_tune_bwd, gpu_tune_chunk, gpu_tune_embed, gpu_tune_match
from .vil import gpu_vil

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
    ('reduction-table', 'every family x reducer at its published budget: graph / default / '
     'eager, bf16, batch 128, 224', gpu_reduction_table),
    ('vil', 'ViL-T whole classifier, batch 128, 224, ours and official; the mLSTM cell',
     gpu_vil),
]
