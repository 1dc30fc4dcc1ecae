# PlainMamba-L1 + PlainPyramidNeck + UperNet, ADE20K 512x512, total batch 16 (8 GPUs x 2),
# 160k iterations. OUR OPTION, NOT THE OFFICIAL RECIPE: the official PlainMamba UperNet has no
# neck (./plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py). This config is that one with the
# feature pyramid of the Vim UperNet configs added: the four stride-16 maps of layers
# (5, 11, 17, 23) are resized by x4 / x2 / x1 / x0.5 (strides 4, 8, 16, 32, C channels each)
# before UPerHead; everything else (optimizer, schedule, heads with 512 / 256 channels, drop
# path, whole-image inference) is the official recipe. The auxiliary head reads the x1 map (2),
# as the official Vim pyramid does (the official PlainMamba head reads map 3, which is at stride
# 16 there; here map 3 is the x0.5 one). No published number exists for this setting.
_base_ = ['./plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py']
embed_dims = 192
model = dict(
    neck=dict(_delete_=True, type='PlainPyramidNeck', in_channels=embed_dims,
              scales=(4, 2, 1, 0.5), norm_cfg=dict(type='SyncBN', requires_grad=True)),
    decode_head=dict(in_channels=[embed_dims] * 4),
    auxiliary_head=dict(in_channels=embed_dims, in_index=2))
