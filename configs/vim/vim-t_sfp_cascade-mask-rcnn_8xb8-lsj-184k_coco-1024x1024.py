# Recipe: ours (mmdet default heads), not the official Vim detection run; for reproduction use
# vim-t_sfp_cascade-mask-rcnn_4xb16-lsj-184k_coco-1024x1024_official-code.py.
# Vim-T + simple feature pyramid + Cascade Mask R-CNN on COCO with mmdet's default cascade heads
# (1-conv RPN, Shared2FC box heads and a mask head without norm;
# ../_base_/sfp_cascade-mask-rcnn.py): LSJ 1024, AdamW lr 1e-4 wd 0.1, layer decay 0.7 (the ViTDet-B
# value of the official mask_rcnn_vimdet_b_100ep.py; the official Vim-T run used 0.837), no weight
# decay on 1-D parameters, pos_embed, A_* and D, total batch 64 (8 GPUs x 8), fp32, 184375
# iterations, test images padded to a multiple of 32. What the official code ran instead (2-conv
# RPN, 4conv1fc box heads and mask head with LayerNorm, AMP, 4 GPUs x 16, square padding to 1024):
# the official-code config.
# No published number is an expected result of this config: the Vim paper's Cascade Mask R-CNN
# result (Table 3) came from the official recipe with unreleased v1-style weights.
# Initialised from the released Vim-T ImageNet weights (vim_t_midclstok_76p1acc.pth).
_base_ = ['../_base_/sfp_cascade-mask-rcnn.py']
model = dict(backbone=dict(type='Vim'))
