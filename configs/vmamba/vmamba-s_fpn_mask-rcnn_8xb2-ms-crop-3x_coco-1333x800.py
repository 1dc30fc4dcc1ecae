# VMamba-S (s2l15) + FPN + Mask R-CNN on COCO, 3x schedule with multi-scale training, total
# batch 16 (8 GPUs x 2). Recipe: ./vmamba-t_fpn_mask-rcnn_8xb2-ms-crop-3x_coco-1333x800.py;
# drop path 0.3 (official det config). Published (VMamba): box AP 49.9 / mask AP 44.2; 70M
# params; FLOPs 384G in the official README but 348.9G in its FLOPs record (unconfirmed which
# is right).
_base_ = ['./vmamba-t_fpn_mask-rcnn_8xb2-ms-crop-3x_coco-1333x800.py']
model = dict(
    backbone=dict(
        arch='small',                             # s2l15: depths (2, 2, 15, 2), ssm_ratio 2.0
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/vssm_small_0229_ckpt_epoch_222.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
