# VMamba-B (s2l15, C = 128) + FPN + Mask R-CNN on COCO, 3x schedule with multi-scale training,
# total batch 16 (8 GPUs x 2). Recipe: ./vmamba-t_fpn_mask-rcnn_8xb2-ms-crop-3x_coco-1333x800.py;
# drop path 0.6 (official det config). No published number: the official release has no
# VMamba-B 3x config or result (1x: box AP 49.2 / mask AP 44.1).
_base_ = ['./vmamba-t_fpn_mask-rcnn_8xb2-ms-crop-3x_coco-1333x800.py']
model = dict(
    backbone=dict(
        arch='base',                              # s2l15: depths (2, 2, 15, 2), C = 128
        drop_path_rate=0.6,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/vssm_base_0229_ckpt_epoch_237.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))
