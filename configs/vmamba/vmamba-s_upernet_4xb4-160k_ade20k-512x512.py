# VMamba-S (s2l15) + UperNet, ADE20K 512x512, total batch 16 (4 GPUs x 4), 160k iterations.
# Recipe: ./vmamba-t_upernet_4xb4-160k_ade20k-512x512.py; drop path 0.3 (official seg config).
# Published (VMamba): mIoU 50.6 single scale / 51.2 multi scale; 82M params, 1028G FLOPs
# (512 x 2048).
_base_ = ['./vmamba-t_upernet_4xb4-160k_ade20k-512x512.py']
stage_dims = [96, 192, 384, 768]
model = dict(
    backbone=dict(
        arch='small',                             # s2l15: depths (2, 2, 15, 2), ssm_ratio 2.0
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/vssm_small_0229_ckpt_epoch_222.pth')),
    decode_head=dict(in_channels=stage_dims),
    auxiliary_head=dict(in_channels=stage_dims[2]))
