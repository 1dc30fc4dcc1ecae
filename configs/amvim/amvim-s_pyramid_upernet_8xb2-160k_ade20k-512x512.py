# AMVim-S + PlainPyramidNeck + UperNet, ADE20K 512x512, total batch 16 (8 GPUs x 2), 160k iters.
# Recipe: ../_base_/upernet_ade20k-512x512.py. Published mIoU (single scale):
#   Vim-Ti 41.0 / Vim-S 44.9 (Vim paper), AMVim's reproduction Vim-Ti 40.0 / Vim-S 43.3,
#   AMVim-Ti 40.2 / AMVim-S 43.4 (AMVim paper, Table 4).
# Initialised from the official ImageNet weights (vim_s_midclstok_80p5acc.pth); AMVim loads the same Vim file 1:1.
_base_ = ['../_base_/upernet_ade20k-512x512.py']
embed_dims = 384
model = dict(
    backbone=dict(type='AMVim', arch='small',
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/vim_s_midclstok_80p5acc.pth')),
    neck=dict(in_channels=embed_dims),
    decode_head=dict(in_channels=[embed_dims] * 4, channels=embed_dims),
    auxiliary_head=dict(in_channels=embed_dims))
