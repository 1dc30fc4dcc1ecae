# Recipe: mmseg's Segmenter (segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py) with Vim-T in
# place of ViT-T, the head on the kept tokens (issue 54): ../_base_/segmenter_ade20k-512x512.py.
# Vim-T's last block (final norm) -> TokenMaskTransformerHead (2 layers, 3 heads, 192 dims);
# SGD lr 0.001, batch 8, 160k iterations; slide 512 / stride 480.
# Expected: no published number (no Vim + Segmenter result exists; Segmenter ViT-T/16 reaches
# 39.0-39.5 mIoU single-scale in mmseg's table). Token reduction: add
# token_reduction=dict(type='ToMe', ratio=0.46) to the backbone, or tools/test.py --reduce.
_base_ = ['../_base_/segmenter_ade20k-512x512.py']
