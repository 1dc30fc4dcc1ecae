# Recipe: paper text (Vim, Appendix B): Vim-T + PlainPyramidNeck + UperNet, ADE20K 512x512, total
# batch 16 (8 GPUs x 2), 160k iterations, AdamW lr 6e-5, wd 0.01
# (../_base_/upernet_ade20k-512x512.py).
# Not the run behind any published number: the official code ran another recipe
# (./vim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code.py, the one
# for reproduction). The AMVim paper's Table 4 states no recipe of its own.
# Initialised from the released ImageNet weights (vim_t_midclstok_76p1acc.pth).
_base_ = ['../_base_/upernet_ade20k-512x512.py']
embed_dims = 192
model = dict(
    backbone=dict(type='Vim', arch='tiny',
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/vim_t_midclstok_76p1acc.pth')),
    neck=dict(in_channels=embed_dims),
    decode_head=dict(in_channels=[embed_dims] * 4, channels=embed_dims),
    auxiliary_head=dict(in_channels=embed_dims))
