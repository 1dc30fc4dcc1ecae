# Recipe: mmseg's Segmenter linear head (segmenter_vit-s_fcn_8xb1-160k_ade20k-512x512.py: FCNHead
# with num_convs=0, concat_input=False, no dropout) with Vim-T, on the kept tokens (issue 54):
# TokenFCNHead. Otherwise as vim-t_segmenter-mask_8xb1-160k_ade20k-512x512.py.
_base_ = ['../_base_/segmenter_ade20k-512x512.py']
model = dict(decode_head=dict(_delete_=True, type='TokenFCNHead', in_channels=192,
                              channels=192, num_classes=150, dropout_ratio=0.0,
                              loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                                               loss_weight=1.0)))
