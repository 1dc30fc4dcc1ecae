# Vim-T with a DynamicViT-style learned reducer (DyVM's Vim-T setting: rho 0.9 before blocks 6,
# 12 and 18 -> 176 / 158 / 142 of 196 tokens), fine-tuned 30 epochs with DynamicViT's recipe
# (as the Vim-S config it inherits):
#   python tools/train.py THIS_CONFIG --cfg-options load_from=vim_t_midclstok_76p1acc.pth
# Results of this config are "fine-tuned 30 epochs", not training-free.
_base_ = ['./vim-s_linear_8xb128-30e_in1k-224_dynamicvit.py']
model = dict(model=dict(
    backbone=dict(arch='tiny', drop_path_rate=0.0, token_reduction=dict(keep_rate=0.9)),
    head=dict(in_channels=192)))
