# AMVim-T + simple feature pyramid + Mask R-CNN on COCO, ViTDet-style recipe
# (../_base_/sfp_mask-rcnn.py): LSJ 1024, AdamW lr 1e-4 wd 0.1, layer decay 0.7, total batch
# 64 (8 GPUs x 8), 184375 iterations. Published (Vim paper, Cascade Mask R-CNN): Vim-Ti box AP
# 45.7, mask AP 39.2. Initialised from the official Vim-T ImageNet weights.
_base_ = ['../_base_/sfp_mask-rcnn.py']
model = dict(backbone=dict(type='AMVim'))
