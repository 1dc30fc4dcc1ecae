# Recipe: ours: ViL v2 weights on the Vim/AMVim recipe for a like-for-like comparison; not a
# reproduction; no published number applies. (The ViL paper's ADE20K numbers, 41.2 / 43.1 for
# ViL-T, are of v1 models on ViL's own recipe: that is
# ./vil-t-v1_pyramid_upernet_1xb16-160k_ade20k-512x512_official-code.py.)
# ViL-T (Vision-LSTM v2) + PlainPyramidNeck + UperNet, ADE20K 512x512, total batch 16
# (8 GPUs x 2), 160k iterations, the recipe of ../_base_/upernet_ade20k-512x512.py (Vim's paper
# text, as the Vim / AMVim configs). Initialised from the released ImageNet weights
# (vil2-tiny.th, strict loading, the classifier head dropped). Outputs: the raw outputs (residual
# stream) of block pairs 2, 5, 8, 11.
_base_ = ['../_base_/upernet_ade20k-512x512.py']
embed_dims = 192
model = dict(
    backbone=dict(_delete_=True, type='ViL', arch='tiny', img_size=512, out_type='featmap',
                  out_indices=(2, 5, 8, 11), drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='pretrain/vil2-tiny.th')),
    neck=dict(in_channels=embed_dims),
    decode_head=dict(in_channels=[embed_dims] * 4, channels=embed_dims),
    auxiliary_head=dict(in_channels=embed_dims))
