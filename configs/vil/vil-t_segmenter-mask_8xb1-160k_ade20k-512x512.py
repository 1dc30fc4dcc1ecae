# Recipe: mmseg's Segmenter (segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py) with ViL-T (v2)
# in place of ViT-T, the head on the kept tokens (issue 54): ../_base_/segmenter_ade20k-512x512.py
# with the backbone swapped: ViL-T's last block pair (its raw output, as ViL's featmap; ViL has
# no final norm before a dense head) -> TokenMaskTransformerHead (2 layers, 3 heads, 192 dims).
# Expected: no published number (no ViL + Segmenter result exists).
_base_ = ['../_base_/segmenter_ade20k-512x512.py']
model = dict(backbone=dict(
    _delete_=True, type='ViL', arch='tiny', img_size=512, out_type='tokens', out_indices=(-1, ),
    drop_path_rate=0.1, init_cfg=dict(type='Pretrained', checkpoint='pretrain/vil2-tiny.th')))
