# PlainMamba-L3 + UperNet, ADE20K 512x512, total batch 16 (8 GPUs x 2), 160k iterations.
# Recipe: ./plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py (official l3_upernet.py):
# out_indices (8, 17, 26, 35) of the 36 layers, drop path 0.3, C = 448.
# Published (PlainMamba README): mIoU 49.1, 81M params.
_base_ = ['./plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py']
embed_dims = 448
model = dict(
    backbone=dict(arch='l3', out_indices=(8, 17, 26, 35), drop_path_rate=0.3,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/l3.pth')),
    decode_head=dict(in_channels=[embed_dims] * 4),
    auxiliary_head=dict(in_channels=embed_dims))
