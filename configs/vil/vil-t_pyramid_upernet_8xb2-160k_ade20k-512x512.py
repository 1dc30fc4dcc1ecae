# ViL-T (Vision-LSTM v2) + PlainPyramidNeck + UperNet, ADE20K 512x512, total batch 16
# (8 GPUs x 2), 160k iterations; recipe: ../_base_/upernet_ade20k-512x512.py (the Vim / AMVim
# segmentation recipe, for a like-for-like comparison with them). Published (ViL paper, UperNet,
# the v1 models): ViL-T 41.2 mIoU single scale / 43.1 multi-scale, ViL-S 46.3 / 47.9, ViL-B
# 48.6 / 49.6. Initialised from the released ImageNet weights (vil2-tiny.th, strict loading,
# the classifier head dropped). Outputs: the raw outputs of block pairs 2, 5, 8, 11.
_base_ = ['../_base_/upernet_ade20k-512x512.py']
embed_dims = 192
model = dict(
    backbone=dict(_delete_=True, type='ViL', arch='tiny', img_size=512, out_type='featmap',
                  out_indices=(2, 5, 8, 11), drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/vil2-tiny.th')),
    neck=dict(in_channels=embed_dims),
    decode_head=dict(in_channels=[embed_dims] * 4, channels=embed_dims),
    auxiliary_head=dict(in_channels=embed_dims))
