# Training-free token reduction at test time: ToMe with the AMVim protocol (r tokens merged at
# the start of the even blocks 0..22; ratio 0.46 = the paper's strongest setting; the paper's
# ADE20K table does not state its ratio) on top of the trained AMVim-T UperNet (official-code
# recipe); training is unchanged.
# The AMVim paper's Table 4 ToMe rows (Vim-Ti 40.0 -> 21.1, AMVim-Ti 40.2 -> 27.0 mIoU) are the
# published reference; they are not an expected result of this config (see its base's comment).
# Other methods/ratios: tools/prune_eval.py, or edit reduction below.
_base_ = ['./amvim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code.py']
custom_hooks = [
    dict(type='TokenReductionHook', reduction=dict(type='ToMe', ratio=0.46),
         phases=('val', 'test')),
]
