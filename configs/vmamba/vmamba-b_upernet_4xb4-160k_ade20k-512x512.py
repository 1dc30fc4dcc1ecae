# VMamba-B (s2l15, C = 128) + UperNet, ADE20K 512x512, total batch 16 (4 GPUs x 4), 160k
# iterations. Recipe: ./vmamba-t_upernet_4xb4-160k_ade20k-512x512.py; drop path 0.6 (official
# seg config). Published (VMamba): mIoU 51.0 single scale / 51.6 multi scale; 122M params,
# 1170G FLOPs (512 x 2048).
_base_ = ['./vmamba-t_upernet_4xb4-160k_ade20k-512x512.py']
stage_dims = [128, 256, 512, 1024]
model = dict(
    backbone=dict(
        arch='base',                              # s2l15: depths (2, 2, 15, 2), C = 128
        drop_path_rate=0.6,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/vssm_base_0229_ckpt_epoch_237.pth')),
    decode_head=dict(in_channels=stage_dims),
    auxiliary_head=dict(in_channels=stage_dims[2]))
