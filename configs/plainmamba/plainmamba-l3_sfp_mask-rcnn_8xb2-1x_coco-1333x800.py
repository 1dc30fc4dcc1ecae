# PlainMamba-L3 + simple feature pyramid + Mask R-CNN on COCO, 1x schedule, total batch 16
# (8 GPUs x 2). Recipe and caveats: ./plainmamba-l1_sfp_mask-rcnn_8xb2-1x_coco-1333x800.py (our
# SFP setting, not the official ViT-Adapter model); C = 448, drop path 0.3.
# No published number for this config (the official L3 ViT-Adapter Mask R-CNN 1x:
# 46.8 / 41.2 box / mask AP, another model).
_base_ = ['./plainmamba-l1_sfp_mask-rcnn_8xb2-1x_coco-1333x800.py']
embed_dims = 448
model = dict(
    backbone=dict(arch='l3', drop_path_rate=0.3,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/l3.pth')),
    neck=dict(in_channels=embed_dims))
