# Cascade Mask R-CNN with mmdet's own default heads (1-conv RPN, Shared2FC box heads, mask head
# without norm) on a plain Vim-family backbone through the ViTDet simple feature pyramid (scales
# 4, 2, 1, 0.5 + a max-pooled level, 256 channels, LayerNorm), with the ViTDet-style COCO recipe
# of ./coco-lsj-1024_vitdet-184k.py. Not the heads of the official Vim detection code (2-conv RPN,
# 4conv1fc box heads and mask head with LayerNorm): those are set on top of this base in
# configs/vim/vim-t_sfp_cascade-mask-rcnn_4xb16-lsj-184k_coco-1024x1024_official-code.py.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
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
