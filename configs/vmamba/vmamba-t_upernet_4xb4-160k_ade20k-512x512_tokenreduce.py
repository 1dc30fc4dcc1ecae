# Training-free token reduction at test time: ToMe inside VMamba's third stage (stage index 2,
# the backbone's reduction_stage: 8 of the 14 blocks of VMamba-T, as in ToP-ViM and the Swin
# pruning works), with the AMVim protocol (r tokens merged at the start of the stage's even
# blocks); the full grid is restored before the stage's downsample and its output norm, so the
# UperNet head sees dense maps. Ratio 0.27 is our choice: no published VMamba number exists for
# this setting. On top of the trained VMamba-T UperNet; training is unchanged.
# Other methods/ratios: tools/prune_eval.py, or edit reduction below.
_base_ = ['./vmamba-t_upernet_4xb4-160k_ade20k-512x512.py']
custom_hooks = [
    dict(type='TokenReductionHook', reduction=dict(type='ToMe', ratio=0.27),
         phases=('val', 'test')),
]
