# PlainMamba-L2 + simple feature pyramid + Mask R-CNN on COCO, 1x schedule, total batch 16
# (8 GPUs x 2). Recipe and caveats: ./plainmamba-l1_sfp_mask-rcnn_8xb2-1x_coco-1333x800.py (our
# SFP setting, not the official ViT-Adapter model); C = 384, drop path 0.2.
# No published number for this config (the official L2 ViT-Adapter Mask R-CNN 1x:
# 46.0 / 40.6 box / mask AP, another model).
_base_ = ['./plainmamba-l1_sfp_mask-rcnn_8xb2-1x_coco-1333x800.py']
embed_dims = 384
model = dict(
    backbone=dict(arch='l2', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/l2.pth')),
    neck=dict(in_channels=embed_dims))
