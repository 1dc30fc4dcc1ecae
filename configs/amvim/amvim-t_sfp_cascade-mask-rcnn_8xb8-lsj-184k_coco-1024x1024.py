# Recipe: ours (mmdet default heads). AMVim has no detection recipe or number of its own (its paper
# reports no detection result), so nothing published is an expected result here.
# AMVim-T + simple feature pyramid + Cascade Mask R-CNN on COCO with mmdet's default heads
# (../_base_/sfp_cascade-mask-rcnn.py): LSJ 1024, AdamW lr 1e-4 wd 0.1, layer decay 0.7, total batch
# 64 (8 GPUs x 8), fp32, 184375 iterations: the recipe of the Vim-T config of the same name, for a
# like-for-like comparison of the two backbones (the official Vim code's Vim-T run:
# configs/vim/vim-t_sfp_cascade-mask-rcnn_4xb16-lsj-184k_coco-1024x1024_official-code.py).
# Initialised from the released Vim-T ImageNet weights (vim_t_midclstok_76p1acc.pth, the base's
# init_cfg).
_base_ = ['../_base_/sfp_cascade-mask-rcnn.py']
model = dict(backbone=dict(type='AMVim'))
