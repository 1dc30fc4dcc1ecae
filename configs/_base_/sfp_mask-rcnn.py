# Mask R-CNN with mmdet's own default heads (1-conv RPN, Shared2FC box head, mask head without
# norm) on a plain Vim-family backbone through the ViTDet simple feature pyramid (scales 4, 2, 1,
# 0.5 + a max-pooled level, 256 channels, LayerNorm), with the ViTDet-style COCO recipe of
# ./coco-lsj-1024_vitdet-184k.py. (The official Vim detection code has no Vim-T Mask R-CNN run.)
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './coco-lsj-1024_vitdet-184k.py',
]
image_size = (1024, 1024)
embed_dims = 192
model = dict(
    data_preprocessor=dict(
        pad_size_divisor=32,
        batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(
        _delete_=True,
        type='Vim', arch='tiny', img_size=1024, out_type='featmap', out_indices=(23, ),
        with_cls_token=False, final_norm=False, drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/vim_t_midclstok_76p1acc.pth')),
    neck=dict(
        _delete_=True,
        type='SimpleFeaturePyramid', in_channels=embed_dims, out_channels=256,
        scales=(4, 2, 1, 0.5), norm_cfg=dict(type='LN2d'), num_outs=5))
