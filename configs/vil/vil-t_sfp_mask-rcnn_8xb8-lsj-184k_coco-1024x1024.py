# ViL-T + simple feature pyramid + Mask R-CNN on COCO, the ViTDet-style recipe of the Vim
# configs (../_base_/sfp_mask-rcnn.py): LSJ 1024, AdamW, layer decay, total batch 64 (8 GPUs x
# 8), 184375 iterations. No published ViL detection number. Initialised from vil2-tiny.th.
_base_ = ['../_base_/sfp_mask-rcnn.py']
model = dict(
    backbone=dict(_delete_=True, type='ViL', arch='tiny', img_size=1024, out_type='featmap',
                  out_indices=(11, ), drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/vil2-tiny.th')))
