# Recipe: as ../vim/vim-t_segmenter-mask_8xb1-160k_ade20k-512x512.py with AMVim-T (default
# paths); the head on the kept tokens (issue 54).
_base_ = ['../_base_/segmenter_ade20k-512x512.py']
model = dict(backbone=dict(type='AMVim'))
