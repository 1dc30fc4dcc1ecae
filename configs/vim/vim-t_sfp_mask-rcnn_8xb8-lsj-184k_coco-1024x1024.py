# Recipe: ours (mmdet default heads); there is no official Vim-T Mask R-CNN run to reproduce.
# Vim-T + simple feature pyramid + Mask R-CNN on COCO with mmdet's default heads (1-conv RPN,
# Shared2FC box head and a mask head without norm; ../_base_/sfp_mask-rcnn.py): LSJ 1024, AdamW
# lr 1e-4 wd 0.1, layer decay 0.7, no weight decay on 1-D parameters, pos_embed, A_* and D, total
# batch 64 (8 GPUs x 8), fp32, 184375 iterations, test images padded to a multiple of 32. The
# official det code's Mask R-CNN (mask_rcnn_vimdet_b_100ep.py) is the Vim-B base of its cascade
# configs (2-conv RPN, 4conv1fc box head and mask head with LayerNorm, AMP, layer decay 0.7).
# Published: none (the Vim paper reports Cascade Mask R-CNN only, for Vim-Ti: see
# vim-t_sfp_cascade-mask-rcnn_4xb16-lsj-184k_coco-1024x1024_official-code.py); no published
# number is an expected result of this config.
# Initialised from the released Vim-T ImageNet weights (vim_t_midclstok_76p1acc.pth).
_base_ = ['../_base_/sfp_mask-rcnn.py']
model = dict(backbone=dict(type='Vim'))
