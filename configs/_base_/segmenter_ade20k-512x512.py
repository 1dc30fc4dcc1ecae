# Segmenter on ADE20K 512x512 for a plain Vim-family backbone that hands its kept tokens to the
# head (out_type='tokens'; amvim_mm.models.heads), composed from mmseg's own Segmenter bases:
# mmseg's recipe of segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py (Strudel et al., ICCV 2021,
# as mmseg reproduces it): mean / std 127.5, total batch 8 (8 GPUs x 1), 160k iterations, SGD
# lr 0.001, momentum 0.9, weight decay 0, poly decay (schedule_160k), slide 512 / stride 480. The
# decode head is TokenMaskTransformerHead (mmseg's SegmenterMaskTransformerHead, 2 layers, on the
# carriers with proportional attention); the linear head's configs swap in TokenFCNHead.
# The backbone: the last block's output (no class token, final norm), as Segmenter takes a
# ViT's last layer.
_base_ = ['mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py']
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

embed_dims = 192
model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True, type='Vim', arch='tiny', img_size=512, out_type='tokens',
        out_indices=(-1, ), with_cls_token=False, final_norm=True, drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/vim_t_midclstok_76p1acc.pth')),
    decode_head=dict(type='TokenMaskTransformerHead', in_channels=embed_dims,
                     channels=embed_dims, num_heads=3, embed_dims=embed_dims))
