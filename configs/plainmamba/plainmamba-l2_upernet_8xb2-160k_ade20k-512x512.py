# PlainMamba-L2 + UperNet, ADE20K 512x512, total batch 16 (8 GPUs x 2), 160k iterations.
# Recipe: ./plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py (official l2_upernet.py):
# out_indices (5, 11, 17, 23), drop path 0.2, C = 384.
# Published (PlainMamba README): mIoU 46.8, 55M params.
_base_ = ['./plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py']
embed_dims = 384
model = dict(
    backbone=dict(arch='l2', out_indices=(5, 11, 17, 23), drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/l2.pth')),
    decode_head=dict(in_channels=[embed_dims] * 4),
    auxiliary_head=dict(in_channels=embed_dims))
