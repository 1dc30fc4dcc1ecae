# AMVim-T fine-tuned from the official Vim-T weights (vim_t_midclstok_76p1acc.pth), AMVim paper recipe:
# 150 epochs, AdamW lr 4e-5 (absolute, total batch 1024 = 8 GPUs x 128), weight decay 0.05,
# cosine schedule, 5 warm-up epochs, DeiT augmentation. Published Top-1: 76.3.
# (Drop path 0.05 and warm-up length are our reading: the paper does not list them.)
_base_ = ['../_base_/imagenet_linear-224.py']
embed_dims = 192
model = dict(
    backbone=dict(type='AMVim', arch='tiny', drop_path_rate=0.05,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/vim_t_midclstok_76p1acc.pth')),
    head=dict(in_channels=embed_dims))
optim_wrapper = dict(optimizer=dict(lr=4e-5))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=5, end=150),
]
train_cfg = dict(by_epoch=True, max_epochs=150, val_interval=1)
